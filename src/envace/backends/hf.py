"""HuggingFace transformers backend: batched lockstep sampling with a KV cache and per-session prefix reuse.

Every prompt of a call steps together: one prefill over the batch, then one forward per generated token for all
sequences still running (finished ones are dropped from the batch). A prompt tagged with a ``session`` that
extends the tokens kept for that session (the previous prompt + completion of the same context) only encodes
its new tokens: the kept keys/values are laid into the batch cache left-padded, with the new tokens after them
and the attention mask covering the holes. Keys are stored after RoPE, so each sequence keeps its own positions.

Determinism: sampling draws from one ``torch.Generator`` seeded per call, so the same prompts, seed and weights
give the same tokens on CPU.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .base import BACKENDS, Backend, Generation, SamplingParams


def _extends(prompt: list[int], prefix: list[int]) -> bool:
    """True if ``prompt`` strictly extends ``prefix`` (at least one new token to encode)."""
    return len(prefix) < len(prompt) and prompt[: len(prefix)] == prefix


@dataclass
class _Kept:
    ids: list[int]  # tokens whose keys/values are kept (prompt + completion minus its last token)
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (H, L, D)


def sample_next(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the next token of each row and its log-prob under the (temperature-scaled) policy.

    logits: (B, V) -> tokens (B,), logprobs (B,). Log-probs are of the temperature-scaled full distribution
    (before top-p / top-k truncation), the quantity the trainer recomputes.
    """
    logits = logits.float()
    if params.temperature <= 0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logits.argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    scaled = logits / params.temperature
    logp = torch.log_softmax(scaled, dim=-1)  # (B, V)
    filt = scaled.clone()
    if params.top_k and params.top_k > 0:
        kth = torch.topk(filt, min(params.top_k, filt.shape[-1]), dim=-1).values[:, -1:]
        filt = filt.masked_fill(filt < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, idx = torch.sort(filt, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        cum = probs.cumsum(-1)
        remove = cum - probs > params.top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        filt = torch.full_like(filt, float("-inf")).scatter(-1, idx, sorted_logits)
    probs = torch.softmax(filt, dim=-1)
    tok = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


class HFBackend(Backend):
    """Generation with a transformers causal LM (CPU or GPU), optionally under bf16 autocast."""

    def __init__(self, model: Any, tokenizer: Any, bf16: bool = False, keep_sessions: bool = True, max_batch: int = 64, share_prefixes: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.bf16 = bf16
        self.keep_sessions = keep_sessions
        self.max_batch = max_batch
        self.device = next(model.parameters()).device
        self._kept: dict[str, _Kept] = {}
        self._prefixes: list[_Kept] = []  # shared prompt prefixes (LRU), dropped with release_all / sync_weights
        self.share_prefixes = share_prefixes
        self.min_shared_prefix = 32
        eos = {tokenizer.eos_token_id}
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
        if im_end is not None:
            eos.add(im_end)
        self.eos_ids = {e for e in eos if e is not None}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids))
        self.stats = {"prompt_tokens": 0, "cached_tokens": 0, "shared_prefix_tokens": 0, "generated_tokens": 0, "forward_calls": 0}

    # -- public API ---------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[list[int]], params: SamplingParams, sessions: Sequence[str | None] | None = None) -> list[Generation]:
        sessions = list(sessions) if sessions is not None else [None] * len(prompts)
        out: list[Generation] = []
        gen = torch.Generator(device=self.device)  # multinomial needs the generator on the logits' device
        gen.manual_seed(params.seed if params.seed is not None else torch.seed() % (2**63))
        for s in range(0, len(prompts), self.max_batch):
            out += self._generate_batch(list(prompts[s : s + self.max_batch]), params, sessions[s : s + self.max_batch], gen)
        return out

    def release(self, sessions: Sequence[str]) -> None:
        for s in sessions:
            self._kept.pop(s, None)

    def release_all(self) -> None:
        self._kept.clear()
        self._prefixes.clear()

    def sync_weights(self, model: Any) -> None:
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())
        self.release_all()  # kept caches were computed with the old weights

    # -- internals ----------------------------------------------------------------------------------------
    def _autocast(self):
        if self.bf16:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _forward(self, input_ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        self.stats["forward_calls"] += 1
        out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :]

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams, sessions: list[str | None], gen: torch.Generator) -> list[Generation]:
        from transformers import DynamicCache

        B = len(prompts)
        dev = self.device
        # 1. what each sequence can reuse: its session's kept context, else a shared prefix (e.g. the system prompt)
        kept: list[_Kept | None] = []
        for p, s in zip(prompts, sessions):
            k = self._kept.get(s) if (s is not None and self.keep_sessions) else None
            if k is not None and not _extends(p, k.ids):
                k = None
            kept.append(k)
        if self.share_prefixes:
            self._share_prefixes(prompts, kept)
        L = [len(k.ids) if k else 0 for k in kept]
        new = [p[l:] for p, l in zip(prompts, L)]
        maxL, maxN = max(L), max(len(n) for n in new)
        # 2. batch cache (left-padded) and new tokens (left-padded after it)
        cache = None
        attn = torch.zeros(B, maxL + maxN, dtype=torch.long, device=dev)
        if maxL > 0:
            ref = next(k for k in kept if k is not None).kv
            layers = []
            for li, (k0, v0) in enumerate(ref):
                H, _, D = k0.shape
                K = torch.zeros(B, H, maxL, D, dtype=k0.dtype, device=dev)
                V = torch.zeros(B, H, maxL, D, dtype=v0.dtype, device=dev)
                for b, k in enumerate(kept):
                    if k is not None:
                        K[b, :, maxL - L[b] :] = k.kv[li][0]
                        V[b, :, maxL - L[b] :] = k.kv[li][1]
                layers.append((K, V))
            cache = DynamicCache(layers)
            for b in range(B):
                attn[b, maxL - L[b] : maxL] = 1
        else:
            cache = DynamicCache()
        ids = torch.full((B, maxN), self.pad_id, dtype=torch.long, device=dev)
        pos = torch.zeros(B, maxN, dtype=torch.long, device=dev)
        for b, n in enumerate(new):
            ids[b, maxN - len(n) :] = torch.tensor(n, dtype=torch.long)
            pos[b, maxN - len(n) :] = torch.arange(L[b], L[b] + len(n))
            attn[b, maxL + maxN - len(n) :] = 1
        next_pos = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev)

        with self._autocast():
            logits = self._forward(ids, attn, pos, cache)
        self.stats["prompt_tokens"] += sum(len(p) for p in prompts)
        self.stats["cached_tokens"] += sum(L)

        toks: list[list[int]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        finish = [""] * B
        active = list(range(B))  # batch row -> sequence index
        texts = [""] * B
        stop = [s for s in params.stop if s]
        for _step in range(params.max_new_tokens):
            tok, lp = sample_next(logits, params, gen)
            tok_l, lp_l = tok.tolist(), lp.tolist()
            still = []
            for r, b in enumerate(active):
                t = tok_l[r]
                toks[b].append(t)
                lps[b].append(lp_l[r])
                if t in self.eos_ids:
                    finish[b] = "eos"
                elif stop:
                    texts[b] = self.tokenizer.decode(toks[b][-16:], skip_special_tokens=False) if len(toks[b]) > 16 else self.tokenizer.decode(toks[b], skip_special_tokens=False)
                    if any(s in texts[b] for s in stop):
                        finish[b] = "stop"
                if not finish[b] and len(toks[b]) >= params.max_new_tokens:
                    finish[b] = "length"
                if not finish[b]:
                    still.append(r)
            done_rows = [r for r in range(len(active)) if r not in set(still)]
            if done_rows:
                self._keep(cache, attn, [(r, active[r]) for r in done_rows], prompts, toks, sessions)
            if not still:
                break
            if len(still) < len(active):
                sel = torch.tensor(still, dtype=torch.long, device=dev)
                for layer in cache.layers:
                    layer.keys = layer.keys.index_select(0, sel)
                    layer.values = layer.values.index_select(0, sel)
                attn = attn.index_select(0, sel)
                tok = tok.index_select(0, sel)
                next_pos = next_pos.index_select(0, sel)
                active = [active[r] for r in still]
            attn = torch.cat([attn, torch.ones(len(active), 1, dtype=attn.dtype, device=dev)], dim=1)
            with self._autocast():
                logits = self._forward(tok[:, None], attn, next_pos[:, None], cache)
            next_pos = next_pos + 1
        for b in range(B):
            if not finish[b]:
                finish[b] = "length"
        self.stats["generated_tokens"] += sum(len(t) for t in toks)
        outs = []
        for b in range(B):
            text = self.tokenizer.decode(toks[b], skip_special_tokens=True)
            outs.append(Generation(token_ids=toks[b], logprobs=lps[b], text=text, finish_reason=finish[b], prompt_tokens=len(prompts[b]), cached_tokens=L[b]))
        return outs

    def _share_prefixes(self, prompts: list[list[int]], kept: list["_Kept | None"]) -> None:
        """Give sequences without a kept context the longest known shared prefix; compute the common prefix of
        the rest once (one batch-1 prefill instead of one per sequence) and remember it (small LRU)."""
        todo = [b for b, k in enumerate(kept) if k is None]
        for b in todo:
            best = max((pf for pf in self._prefixes if _extends(prompts[b], pf.ids)), key=lambda pf: len(pf.ids), default=None)
            kept[b] = best
        rest = [b for b in todo if kept[b] is None]
        if len(rest) < 2:
            return
        lcp = min(len(prompts[b]) for b in rest) - 1  # leave at least one token to encode
        first = prompts[rest[0]]
        for b in rest[1:]:
            p = prompts[b]
            n = 0
            while n < lcp and p[n] == first[n]:
                n += 1
            lcp = n
        if lcp < self.min_shared_prefix:
            return
        ids = first[:lcp]
        cache = self._new_cache()
        with self._autocast():
            self._forward(torch.tensor([ids], device=self.device), torch.ones(1, lcp, dtype=torch.long, device=self.device), torch.arange(lcp, device=self.device)[None], cache)
        pf = _Kept(ids=ids, kv=[(layer.keys[0].clone(), layer.values[0].clone()) for layer in cache.layers])
        self._prefixes = (self._prefixes + [pf])[-4:]
        self.stats["shared_prefix_tokens"] += lcp
        for b in rest:
            kept[b] = pf

    @staticmethod
    def _new_cache() -> Any:
        from transformers import DynamicCache

        return DynamicCache()

    def _keep(self, cache: Any, attn: torch.Tensor, rows: list[tuple[int, int]], prompts: list[list[int]], toks: list[list[int]], sessions: list[str | None]) -> None:
        """Store the keys/values of finished sequences that belong to a session (prompt + completion[:-1])."""
        if not self.keep_sessions:
            return
        for r, b in rows:
            s = sessions[b]
            if s is None:
                continue
            valid = attn[r].bool()  # positions holding this sequence's tokens (the last sampled token has no KV yet)
            kv = [(layer.keys[r][:, valid].clone(), layer.values[r][:, valid].clone()) for layer in cache.layers]
            ids = prompts[b] + toks[b][:-1]
            assert kv[0][0].shape[1] == len(ids), (kv[0][0].shape, len(ids))
            self._kept[s] = _Kept(ids=ids, kv=kv)


@BACKENDS.register("hf")
def _make_hf(model: Any = None, tokenizer: Any = None, name: str | None = None, bf16: bool = False, **kw: Any) -> HFBackend:
    if model is None:
        from ..models import load

        model, tokenizer = load(name)
    return HFBackend(model, tokenizer, bf16=bf16, **kw)
