"""HuggingFace transformers backend: batched lockstep sampling with a preallocated KV cache and per-session prefix reuse.

Every prompt of a call steps together: one prefill over the batch, then one forward per generated token for all
sequences still running (finished ones are dropped from the batch). The batch's keys/values live in one
preallocated tensor (layers, 2, batch, heads, capacity, head_dim) that each step writes into in place (a
``DynamicCache`` would copy the whole cache once per generated token to append one column).

Reuse, exact up to kernel rounding: a prompt tagged with a ``session`` that extends the tokens kept for that
session (the previous prompt + completion of the same context) only encodes its new tokens: the kept keys/values
are laid into the batch cache left-padded, with the new tokens after them and the attention mask covering the
holes. Prompts without kept context that share a long prefix (the K trajectories of a task, the tasks of one
environment: system prompt and tool schemas) get it prefilled once per cluster. Keys are stored after RoPE, so
each sequence keeps its own positions.

Forwards: ``model(...)`` with the slab as its cache, or, for a Llama model with bf16 on CPU (``packed``), the
packed-weight forward of :mod:`envace.backends.fastdecode`, which reads and writes the same slab.

Determinism: sampling draws from one ``torch.Generator`` seeded per call, so the same prompts, seed and weights
give the same tokens on CPU.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..precision import use_bf16
from ..prefixes import common_prefix, prefix_runs
from ..prompts import ChatFormat
from .base import BACKENDS, Backend, Generation, OnDone, Request, SamplingParams
from .fastdecode import SharedPrefixes, decoder_for


def _extends(prompt: list[int], prefix: list[int]) -> bool:
    """True if ``prompt`` strictly extends ``prefix`` (at least one new token to encode)."""
    return len(prefix) < len(prompt) and prompt[: len(prefix)] == prefix


@dataclass
class _Kept:
    ids: list[int]  # tokens whose keys/values are kept (prompt + completion minus its last token)
    kv: torch.Tensor  # (layers, 2, H, len(ids), D)


def _cache_classes() -> tuple[Any, Any]:
    """(SlabCache, StreamCache): defined on first use, so that importing this module does not import transformers."""
    from transformers.cache_utils import Cache, DynamicLayer

    class SlabLayer(DynamicLayer):
        """One layer's view of a :class:`SlabCache`: keys/values are views of the slab up to the used length."""

        def __init__(self, slab: "SlabCache", idx: int, n: int):
            super().__init__()
            self.slab, self.idx, self.n = slab, idx, n

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            data = self.slab.storage(key_states)[self.idx]  # (2, B, H, cap, D)
            n, t = self.n, key_states.shape[-2]
            data[0, :, :, n : n + t] = key_states
            data[1, :, :, n : n + t] = value_states
            self.n = n + t
            self.keys, self.values = data[0, :, :, : self.n], data[1, :, :, : self.n]
            self.is_initialized = True
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.n

    class SlabCache(Cache):
        """All layers' keys/values of a batch in one preallocated tensor (layers, 2, B, H, capacity, D), written in
        place (no per-step concatenation). Allocated at the first update, with the model's key dtype and shape;
        ``fills`` (batch row, start column, kv (layers, 2, H, L, D)) are laid in then, columns [0, n0) zeroed first."""

        def __init__(self, n_layers: int, batch: int, capacity: int, n0: int = 0, fills: list[tuple[int, int, torch.Tensor]] | None = None):
            super().__init__(layers=[SlabLayer(self, i, n0) for i in range(n_layers)])
            self.batch, self.capacity, self.n0 = batch, capacity, n0
            self.fills = fills or []
            self.data: torch.Tensor | None = None

        def storage(self, like: torch.Tensor) -> torch.Tensor:
            if self.data is None:
                _, H, _, D = like.shape
                self.data = torch.empty(len(self.layers), 2, self.batch, H, self.capacity, D, dtype=like.dtype, device=like.device)
                self.data[..., : self.n0, :].zero_()  # holes of left-padded rows must be finite (they are masked out)
                for b, start, kv in self.fills:
                    self.data[:, :, b, :, start : start + kv.shape[-2]] = kv
                self.fills = []
            return self.data

        def select_rows(self, sel: torch.Tensor) -> None:
            """Keep only batch rows ``sel`` (copies the used columns only)."""
            n = self.layers[0].n
            new = torch.empty(self.data.shape[:2] + (len(sel),) + self.data.shape[3:], dtype=self.data.dtype, device=self.data.device)
            new[..., :n, :] = self.data[..., :n, :].index_select(2, sel)
            self.data, self.batch = new, len(sel)
            self.advance(0)

        def advance(self, t: int = 1) -> None:
            """Count ``t`` columns written outside the model (by a :class:`~envace.backends.fastdecode.LlamaDecoder`
            forward) and point every layer's keys/values at the used columns of ``data``."""
            for layer in self.layers:
                layer.n += t
                layer.keys, layer.values = self.data[layer.idx, 0, :, :, : layer.n], self.data[layer.idx, 1, :, :, : layer.n]

        def row(self, r: int, cols: torch.Tensor) -> torch.Tensor:
            """Keys/values of batch row ``r`` at columns ``cols``: (layers, 2, H, len(cols), D)."""
            return self.data[:, :, r].index_select(3, cols)

    class StreamLayer(DynamicLayer):
        """One layer's view of a :class:`_Stream` slab: writes the fed token's keys/values at column ``col`` of the
        running rows, shows the model the window [lo, col]."""

        def __init__(self, st: "_Stream", idx: int):
            super().__init__()
            self.st, self.idx = st, idx

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            st, R, t = self.st, key_states.shape[0], key_states.shape[-2]
            data = st.data[self.idx]
            data[0, :R, :, st.col : st.col + t] = key_states
            data[1, :R, :, st.col : st.col + t] = value_states
            self.keys, self.values = data[0, :R, :, st.lo : st.col + t], data[1, :R, :, st.lo : st.col + t]
            self.is_initialized = True
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.st.col - self.st.lo

    class StreamCache(Cache):
        """The model's view of a :class:`_Stream`: its layers read the stream's slab, rows and window live."""

        def __init__(self, st: "_Stream"):
            super().__init__(layers=[StreamLayer(st, i) for i in range(st.n_layers)])

    return SlabCache, StreamCache


_CACHE: tuple[Any, Any] | None = None


def _cache_class(i: int) -> Any:
    global _CACHE
    if _CACHE is None:
        _CACHE = _cache_classes()
    return _CACHE[i]


def slab_cache(*args: Any, **kw: Any) -> Any:
    """A preallocated batch KV cache (see ``SlabCache`` above)."""
    return _cache_class(0)(*args, **kw)


def stream_cache(st: "_Stream") -> Any:
    """The KV cache a forward over the running rows of ``st`` uses (see ``StreamCache`` above)."""
    return _cache_class(1)(st)


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
        filt = _nucleus(filt, params.top_p)
    tok = draw(torch.softmax(filt, dim=-1), gen)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def draw(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One token per row of ``probs`` (B, V), by inverse CDF: the first token whose cumulative mass reaches
    u * total, u uniform in (0, 1]. Tokens of zero mass are never drawn. (``torch.multinomial`` does the same
    job 10-50x slower on CPU over a 49k vocabulary.)"""
    cdf = probs.cumsum(-1)
    u = (1.0 - torch.rand(probs.shape[0], 1, generator=gen, device=probs.device, dtype=cdf.dtype)) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def _nucleus(filt: torch.Tensor, top_p: float, candidates: int = 256) -> torch.Tensor:
    """Logits outside the top-p nucleus set to -inf: the smallest set of most likely tokens whose mass reaches
    top_p. (B, V) -> (B, V). The nucleus is looked for among the ``candidates`` most likely tokens first (a
    partial sort) and found there whenever their mass exceeds top_p; otherwise the whole vocabulary is sorted."""
    k = min(candidates, filt.shape[-1])
    vals, idx = torch.topk(filt, k, dim=-1)  # (B, k), descending
    probs = torch.exp(vals - torch.logsumexp(filt, dim=-1, keepdim=True))
    cum = probs.cumsum(-1)
    if k < filt.shape[-1] and not bool((cum[:, -1] - probs[:, -1] > top_p).all()):
        vals, idx = torch.sort(filt, descending=True, dim=-1)
        probs = torch.softmax(vals, dim=-1)
        cum = probs.cumsum(-1)
    remove = cum - probs > top_p  # keep the smallest prefix whose mass reaches top_p
    return torch.full_like(filt, float("-inf")).scatter(-1, idx, vals.masked_fill(remove, float("-inf")))


@dataclass
class _StreamRow:
    req: Request
    key: str  # the request's sampling settings, for grouping rows that sample alike
    start: int  # first slab column of this sequence (columns [start, col) are its keys/values)
    pos: int  # position id of the next token fed
    cached: int
    prefix: int = 0  # columns [start, start + prefix) hold a shared prompt prefix that is also in a prefix slot
    slot: int = -1  # that prefix slot (-1: none)
    toks: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    finish: str = ""


class _Stream:
    """The running batch of a continuous stream: the keys/values of every running sequence in one zero-initialised
    slab (layers, 2, rows, heads, columns, head_dim), right-aligned so that all write their next token at the
    same column ``col``; a forward sees the window [lo, col] (lo: the earliest start). A finished row is replaced
    by the last row (one row copied, not the batch); the slab is rebuilt (one copy) only when a new row does not
    fit: more rows, a context longer than ``col``, or no free columns left for the longest remaining generation."""

    MARGIN = 256  # free columns left of the longest context / right of the longest generation at a rebuild

    def __init__(self, n_layers: int, device: torch.device, dtype: torch.dtype | None = None):
        self.n_layers, self.device, self.dtype = n_layers, device, dtype  # dtype None: the prefill's
        self.rows: list[_StreamRow] = []
        self.data: torch.Tensor | None = None
        self.attn: torch.Tensor | None = None
        self.col = self.lo = 0
        self.cache = stream_cache(self)  # reads data, col and lo live: made once
        # shared prompt prefixes for cascade attention: (layers, 2, slots, heads, columns, head_dim)
        self.pre: torch.Tensor | None = None
        self.slot_ref: list[Any] = []  # the _Kept prefix in each slot (kept alive while a row may use it)
        self.slot_len: list[int] = []
        self.slot_users: list[int] = []
        self.max_rows: int | None = None  # rows a rebuild may allocate at most (the backend's memory budget)

    # -- admission ------------------------------------------------------------------------------------------
    def admit(self, reqs: list[Request], cache: Any, attn: torch.Tensor, width: int, L: list[int], prefixes: list[Any] | None = None) -> None:
        """Copy freshly prefilled sequences (a prefill cache, its mask, width and kept lengths) into the slab;
        ``prefixes``: the shared prompt prefix (a ``_Kept``) each one starts with, or None, for cascade attention."""
        cols = [attn[b, :width].nonzero().squeeze(-1) for b in range(len(reqs))]
        lens = [len(c) for c in cols]
        rem = max(r.params.max_new_tokens for r in reqs)
        if self.data is None or not self._fits(len(reqs), max(lens), rem):
            self._rebuild(len(reqs), max(lens), rem, like=cache.data)
        for b, (req, c) in enumerate(zip(reqs, cols)):
            i, n = len(self.rows), len(c)
            self.data[:, :, i, :, self.col - n : self.col] = cache.data[:, :, b].index_select(3, c)
            self.attn[i].zero_()
            self.attn[i, self.col - n : self.col] = 1
            self.rows.append(_StreamRow(req=req, key=req.params.sampling_key(), start=self.col - n, pos=len(req.prompt), cached=L[b]))
            pf = prefixes[b] if prefixes else None
            if pf is not None:
                self.rows[-1].slot, self.rows[-1].prefix = self._slot(pf), len(pf.ids)
        self.lo = min(r.start for r in self.rows)

    def _slot(self, pf: Any) -> int:
        """The prefix slot holding ``pf`` (its keys/values copied in on first use; a slot no row uses is reused)."""
        for s, ref in enumerate(self.slot_ref):
            if ref is pf:
                self.slot_users[s] += 1
                return s
        s = next((s for s, u in enumerate(self.slot_users) if u == 0), len(self.slot_ref))
        if s == len(self.slot_ref):
            self.slot_ref.append(None)
            self.slot_len.append(0)
            self.slot_users.append(0)
        n_layers, _, H, P, D = pf.kv.shape
        if self.pre is None or s >= self.pre.shape[2] or P > self.pre.shape[4]:
            old = self.pre
            slots = max(s + 1, 8) if old is None else (old.shape[2] if s < old.shape[2] else 2 * old.shape[2])
            cols = old.shape[4] if old is not None and P <= old.shape[4] else P + self.MARGIN
            self.pre = torch.zeros(n_layers, 2, slots, H, cols, D, dtype=self.dtype or pf.kv.dtype, device=self.device)
            if old is not None:
                self.pre[:, :, : old.shape[2], :, : old.shape[4]] = old
        self.pre[:, :, s, :, :P] = pf.kv
        self.slot_ref[s], self.slot_len[s], self.slot_users[s] = pf, P, 1
        return s

    def shared_inputs(self) -> SharedPrefixes | None:
        """Cascade-attention inputs of the next decode step (after :meth:`step_inputs`), or None if no running row
        starts with a shared prefix."""
        rows, R = self.rows, len(self.rows)
        if not any(r.slot >= 0 for r in rows):
            return None
        S = len(self.slot_ref)
        members: list[list[int]] = [[] for _ in range(S)]
        for i, r in enumerate(rows):
            if r.slot >= 0:
                members[r.slot].append(i)
        n = max(len(m) for m in members)
        gather, scatter = [R] * (S * n), [S * n] * R
        for s, m in enumerate(members):
            for j, i in enumerate(m):
                gather[s * n + j], scatter[i] = i, s * n + j
        P = max(self.slot_len)
        inf = float("-inf")
        mask = torch.zeros(S, 1, 1, P, device=self.device)
        for s, length in enumerate(self.slot_len):
            mask[s, ..., length:] = inf
        own_start = [r.start + r.prefix for r in rows]
        lo = min(own_start)
        cols = torch.arange(lo, self.col + 1, device=self.device)
        valid = (self.attn[:R, lo : self.col + 1] != 0) & (cols[None, :] >= torch.tensor(own_start, device=self.device)[:, None])
        own = torch.zeros(R, 1, 1, len(cols), device=self.device).masked_fill_(~valid[:, None, None, :], inf)
        idx = lambda v: torch.tensor(v, dtype=torch.long, device=self.device)  # noqa: E731
        return SharedPrefixes(kv=self.pre[:, :, :S, :, :P], mask=mask, n=n, gather=idx(gather), scatter=idx(scatter), lo=lo, own=own)

    def _remaining(self) -> int:
        return max((r.req.params.max_new_tokens - len(r.toks) for r in self.rows), default=0)

    def _fits(self, n_new: int, longest: int, rem: int) -> bool:
        return len(self.rows) + n_new <= self.data.shape[2] and longest <= self.col and self.col + max(rem, self._remaining()) <= self.data.shape[4]

    def _rebuild(self, n_new: int, longest: int, rem: int, like: torch.Tensor) -> None:
        """A new slab: every running row moved by the same offset (one copy), room for ``n_new`` more rows."""
        used = self.col - self.lo if self.rows else 0
        col = max(used, longest) + self.MARGIN
        cap = col + max(rem, self._remaining()) + self.MARGIN
        R = len(self.rows) + n_new
        rows = R + max(4, R // 4)  # room for a few more without a rebuild
        if self.max_rows is not None:
            rows = min(rows, max(R, self.max_rows))
        _, _, _, H, _, D = like.shape
        data = torch.zeros(self.n_layers, 2, rows, H, cap, D, dtype=self.dtype or like.dtype, device=self.device)
        attn = torch.zeros(data.shape[2], cap, dtype=torch.long, device=self.device)
        if self.rows:
            r, d = len(self.rows), col - self.col
            data[:, :, :r, :, self.lo + d : col] = self.data[:, :, :r, :, self.lo : self.col]
            attn[:r, self.lo + d : col] = self.attn[:r, self.lo : self.col]
            for row in self.rows:
                row.start += d
            self.lo += d
        self.data, self.attn, self.col = data, attn, col

    # -- stepping -------------------------------------------------------------------------------------------
    def step_inputs(self, tok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input ids, attention mask, positions) of the forward that feeds ``tok`` (one per row) at ``col``."""
        if self.col + 1 > self.data.shape[4]:
            self._rebuild(0, 0, 0, like=self.data)
        R = len(self.rows)
        self.attn[:R, self.col] = 1
        pos = torch.tensor([[r.pos] for r in self.rows], dtype=torch.long, device=self.device)
        return tok[:, None], self.attn[:R, self.lo : self.col + 1], pos

    def advance(self) -> None:
        self.col += 1
        for r in self.rows:
            r.pos += 1

    def row_kv(self, i: int) -> torch.Tensor:
        """Keys/values of row ``i`` (layers, 2, H, len, D): its prompt and all its sampled tokens but the last."""
        return self.data[:, :, i, :, self.rows[i].start : self.col].clone()

    def remove(self, done: list[int]) -> list[int]:
        """Drop finished rows: each is replaced by the current last row. Returns the old index of every kept row."""
        order = list(range(len(self.rows)))
        for i in done:
            if self.rows[i].slot >= 0:
                self.slot_users[self.rows[i].slot] -= 1
        for i in sorted(done, reverse=True):
            last = len(order) - 1
            if i != last:
                self.data[:, :, i, :, self.lo : self.col] = self.data[:, :, last, :, self.lo : self.col]
                self.attn[i] = self.attn[last]
                self.rows[i] = self.rows[last]
                order[i] = order[last]
            self.rows.pop()
            order.pop()
        if done and self.rows:
            self.lo = min(r.start for r in self.rows)
        return order


class HFBackend(Backend):
    """Generation with a transformers causal LM (CPU or GPU), optionally under bf16 autocast.

    ``keep_sessions``: keep each session's KV between calls; ``share_prefixes``: prefill long common prompt
    prefixes once. Both are exact up to kernel rounding and on by default; off, every prompt is encoded whole.
    ``bf16``: true, false or ``"auto"`` (bf16 only where it is faster than float32, :mod:`envace.precision`; true
    where it is slow is honoured with a one-line warning). ``packed`` (default: with bf16 on CPU): run every
    forward of a Llama model through :class:`~envace.backends.fastdecode.LlamaDecoder` (packed bf16 weights,
    float32 keys/values and attention) instead of ``model(...)``; other architectures always use ``model(...)``. ``cascade`` (packed streams): rows
    that start with the same shared prompt prefix attend to one copy of it (exact up to rounding).
    ``max_prefill_gib``: memory budget of one prefill's attention scores (long new prompts are prefilled a few at
    a time; None: no bound). ``max_kv_gib``: memory budget of one batch's keys/values (the running stream's slab, a lockstep batch's cache):
    fewer sequences run at once when their contexts are long (at least one always runs); None: only ``max_batch``
    limits them. Every sequence of a batch takes as many columns as the longest one, so 64 rows of 1.3k-token
    contexts of SmolLM2-135M take 4.7 GB in float32. In a stream, the follow-up generations of running
    trajectories go before requests of trajectories not started yet, so the contexts kept between turns follow
    the running trajectories too.
    ``stats`` counts prompt tokens, those served from kept sessions or shared prefixes, generated tokens, forwards
    and decode steps (forwards that feed one token per running sequence).
    """

    streams = True

    def __init__(self, model: Any, tokenizer: Any, bf16: bool | str | None = False, keep_sessions: bool = True, max_batch: int = 64, share_prefixes: bool = True, packed: bool | None = None, cascade: bool = True, max_kv_gib: float | None = 2.0, max_prefill_gib: float | None = 1.0):
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.bf16 = use_bf16(bf16, self.device)
        if packed is None:  # by default only where it pays: bf16 on CPU (float32 matmuls are no faster packed)
            packed = self.bf16 and self.device.type == "cpu"
        self._decoder = decoder_for(model, torch.bfloat16 if self.bf16 else torch.float32) if packed else None
        self.keep_sessions = keep_sessions
        self.max_batch = max_batch
        if max_kv_gib is not None and max_kv_gib <= 0:
            raise ValueError(f"max_kv_gib must be > 0 or None, got {max_kv_gib}")
        self.max_kv_bytes = None if max_kv_gib is None else max_kv_gib * 2**30
        if max_prefill_gib is not None and max_prefill_gib <= 0:
            raise ValueError(f"max_prefill_gib must be > 0 or None, got {max_prefill_gib}")
        self.max_prefill_bytes = None if max_prefill_gib is None else max_prefill_gib * 2**30
        self._kept: dict[str, _Kept] = {}
        self._prefixes: list[_Kept] = []  # shared prompt prefixes (LRU), dropped with release_all / sync_weights
        self.share_prefixes = share_prefixes
        self.min_shared_prefix = 32
        self.cascade = cascade  # packed decode steps of a stream attend to shared prompt prefixes once per group
        self.min_cascade_prefix = 64
        self.max_prefixes = 16
        eos = {tokenizer.eos_token_id, *ChatFormat.for_tokenizer(tokenizer).stop_ids}  # eos and the end of turn
        self.eos_ids = {e for e in eos if e is not None}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids))
        self.stats = {"prompt_tokens": 0, "cached_tokens": 0, "shared_prefix_tokens": 0, "generated_tokens": 0, "forward_calls": 0, "decode_steps": 0}

    # -- public API ---------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[list[int]], params: SamplingParams, sessions: Sequence[str | None] | None = None) -> list[Generation]:
        sessions = list(sessions) if sessions is not None else [None] * len(prompts)
        out: list[Generation] = []
        if self._decoder is not None:
            self._decoder.refresh()  # the weights may have changed since the last call
        gen = torch.Generator(device=self.device)  # multinomial needs the generator on the logits' device
        gen.manual_seed(params.seed if params.seed is not None else torch.seed() % (2**63))
        s = 0
        while s < len(prompts):
            n = self._rows_within_budget(max(len(p) for p in prompts[s : s + self.max_batch]) + params.max_new_tokens)
            n = self._prefill_fit(list(prompts[s : s + n]), sessions[s : s + n])
            out += self._generate_batch(list(prompts[s : s + n]), params, sessions[s : s + n], gen)
            s += n
        return out

    def kv_bytes_per_token(self) -> int:
        """Bytes of one token's keys and values over all layers, at the widest dtype a cache here uses (float32)."""
        cfg = self.model.config
        cfg = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
        heads = int(cfg.num_attention_heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        return self._n_layers() * 2 * kv_heads * head_dim * 4

    def _prefill_fit(self, prompts: list[list[int]], sessions: Sequence[str | None]) -> int:
        """How many of ``prompts`` (in order, at least 1) one prefill may encode together within ``max_kv_gib``: its
        attention materialises (rows, heads, new tokens, context) float32 scores a few times over (softmax, mask),
        so 16 prompts of 2.5k new tokens would take ~11 GB at once; a session's kept tokens are not new."""
        if self.max_prefill_bytes is None or len(prompts) <= 1:
            return len(prompts)
        cfg = self.model.config
        cfg = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
        heads = int(cfg.num_attention_heads)
        longest = new = 0
        for n, (p, s) in enumerate(zip(prompts, sessions)):
            k = self._kept.get(s) if (s is not None and self.keep_sessions) else None
            kept = len(k.ids) if k is not None and _extends(p, k.ids) else 0
            longest, new = max(longest, len(p)), max(new, len(p) - kept)
            if n > 0 and 3 * 4 * (n + 1) * heads * new * longest > self.max_prefill_bytes:
                return n
        return len(prompts)

    def _rows_within_budget(self, columns: int) -> int:
        """How many sequences of ``columns`` cache columns each fit ``max_kv_gib`` (at least 1, at most max_batch)."""
        if self.max_kv_bytes is None:
            return self.max_batch
        return max(1, min(self.max_batch, int(self.max_kv_bytes // (columns * self.kv_bytes_per_token()))))

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
        # one context per call, not per forward: autocast keeps its bf16 copies of the weights for the context's life
        if self.bf16:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _n_layers(self) -> int:
        cfg = self.model.config
        cfg = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
        return int(cfg.num_hidden_layers)

    def _forward(self, input_ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        """Last-position logits (B, V) of ``input_ids`` (B, T) fed into a slab ``cache`` after its used columns."""
        self.stats["forward_calls"] += 1
        if self._decoder is not None:  # the packed decoder writes the slab itself
            n = cache.layers[0].n
            with torch.autocast(device_type=self.device.type, enabled=False):
                logits = self._decoder.forward(input_ids, pos, cache.storage(self._decoder.kv_like(input_ids.shape[0])), 0, n, attn)
            cache.advance(input_ids.shape[1])
            return logits
        out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :]

    def _stream_step(self, st: "_Stream", tok: torch.Tensor) -> torch.Tensor:
        """One decode step of a stream: ``tok`` (one per running row) fed at the stream's column; next logits."""
        self.stats["decode_steps"] += 1
        ids, attn, pos = st.step_inputs(tok)
        if self._decoder is None:
            return self._forward(ids, attn, pos, st.cache)
        self.stats["forward_calls"] += 1
        with torch.autocast(device_type=self.device.type, enabled=False):
            return self._decoder.forward(ids, pos, st.data, st.lo, st.col, attn, shared=st.shared_inputs() if self.cascade else None)

    def _sample(self, logits: torch.Tensor, params: SamplingParams, gen: torch.Generator, seqs: list[int], step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Next token and log-prob of the running sequences ``seqs`` (batch indices) at decode step ``step``."""
        return sample_next(logits, params, gen)

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams, sessions: list[str | None], gen: torch.Generator) -> list[Generation]:
        with self._autocast():
            return self._generate_batch_inner(prompts, params, sessions, gen)

    def _prefill(self, prompts: list[list[int]], sessions: list[str | None], extra: int) -> tuple[Any, torch.Tensor, int, list[int], torch.Tensor]:
        """Encode the prompts' new tokens into a fresh batch cache with ``extra`` free columns after them.

        Returns (cache, attention mask (B, width + extra), width, kept lengths, last-position logits (B, V))."""
        B = len(prompts)
        dev = self.device
        # what each sequence can reuse: its session's kept context, else a shared prefix (e.g. the system prompt)
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
        width = maxL + maxN
        cap = width + max(extra, 1)
        # batch cache: kept contexts left-padded into columns [0, maxL), new tokens left-padded into [maxL, width)
        fills = [(b, maxL - L[b], k.kv) for b, k in enumerate(kept) if k is not None]
        cache = slab_cache(self._n_layers(), B, cap, n0=maxL, fills=fills)
        attn = torch.zeros(B, cap, dtype=torch.long, device=dev)  # columns in use: [0, width + decoded)
        ids = torch.full((B, maxN), self.pad_id, dtype=torch.long, device=dev)
        pos = torch.zeros(B, maxN, dtype=torch.long, device=dev)
        for b, n in enumerate(new):
            attn[b, maxL - L[b] : maxL] = 1
            ids[b, maxN - len(n) :] = torch.tensor(n, dtype=torch.long)
            pos[b, maxN - len(n) :] = torch.arange(L[b], L[b] + len(n))
            attn[b, width - len(n) : width] = 1
        logits = self._forward(ids, attn[:, :width], pos, cache)
        self.stats["prompt_tokens"] += sum(len(p) for p in prompts)
        self.stats["cached_tokens"] += sum(L)
        return cache, attn, width, L, logits

    def _generate_batch_inner(self, prompts: list[list[int]], params: SamplingParams, sessions: list[str | None], gen: torch.Generator) -> list[Generation]:
        B = len(prompts)
        dev = self.device
        cache, attn, width, L, logits = self._prefill(prompts, sessions, params.max_new_tokens)
        next_pos = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev)

        toks: list[list[int]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        finish = [""] * B
        active = list(range(B))  # batch row -> sequence index
        col = width  # the column the next token's keys/values go to
        for step in range(params.max_new_tokens):
            tok, lp = self._sample(logits, params, gen, active, step)
            tok_l, lp_l = tok.tolist(), lp.tolist()
            still = []
            for r, b in enumerate(active):
                toks[b].append(tok_l[r])
                lps[b].append(lp_l[r])
                finish[b] = self._finish_reason(toks[b], params)
                if not finish[b]:
                    still.append(r)
            if len(still) < len(active):
                self._keep(cache, attn, col, [(r, b) for r, b in enumerate(active) if finish[b]], prompts, toks, sessions)
            if not still:
                break
            if len(still) < len(active):
                sel = torch.tensor(still, dtype=torch.long, device=dev)
                cache.select_rows(sel)
                attn = attn.index_select(0, sel)
                tok = tok.index_select(0, sel)
                next_pos = next_pos.index_select(0, sel)
                active = [active[r] for r in still]
            attn[:, col] = 1
            col += 1
            self.stats["decode_steps"] += 1
            logits = self._forward(tok[:, None], attn[:, :col], next_pos[:, None], cache)
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

    def _finish_reason(self, toks: list[int], params: SamplingParams) -> str:
        """Why a sequence whose last sampled token is ``toks[-1]`` ends now ("eos", "stop", "length"), or ""."""
        if toks[-1] in self.eos_ids:
            return "eos"
        stop = [s for s in params.stop if s]
        if stop:
            text = self.tokenizer.decode(toks[-16:], skip_special_tokens=False)
            if any(s in text for s in stop):
                return "stop"
        return "length" if len(toks) >= params.max_new_tokens else ""

    # -- continuous batching --------------------------------------------------------------------------------
    def generate_stream(self, requests: Sequence[Request], on_done: OnDone, seed: int | None = None) -> None:
        """Continuous batching: requests join the running batch as soon as they arrive (their new tokens are
        prefilled, session reuse and shared prefixes as in :meth:`generate`), every running sequence advances one
        token per forward, and a finished one leaves at once (``on_done`` may hand back follow-ups, which join
        at the next step). Sequences live right-aligned in one preallocated slab (see :class:`_Stream`)."""
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed if seed is not None else torch.seed() % (2**63))
        if self._decoder is not None:
            self._decoder.refresh()
        with torch.no_grad(), self._autocast():
            self._run_stream(list(requests), on_done, gen)

    def _run_stream(self, pending: list[Request], on_done: OnDone, gen: torch.Generator) -> None:
        st = _Stream(self._n_layers(), self.device, torch.float32 if self._decoder is not None else None)
        logits: torch.Tensor | None = None  # next-token logits of st.rows, in row order
        while pending or st.rows:
            room = self._stream_room(st, pending)
            if pending and room > 0:
                room = self._prefill_fit([r.prompt for r in pending[:room]], [r.session for r in pending[:room]])
                take, pending = pending[:room], pending[room:]
                cache, attn, width, L, new_logits = self._prefill([r.prompt for r in take], [r.session for r in take], 0)
                cascade = self._decoder is not None and self.cascade
                st.admit(take, cache, attn, width, L, [self._prefix_of(r.prompt, self.min_cascade_prefix) for r in take] if cascade else None)
                logits = new_logits if logits is None else torch.cat([logits, new_logits])
            tok, lp = self._sample_rows(logits, st.rows, gen)
            tok_l, lp_l = tok.tolist(), lp.tolist()
            done = []
            for i, row in enumerate(st.rows):
                row.toks.append(tok_l[i])
                row.lps.append(lp_l[i])
                row.finish = self._finish_reason(row.toks, row.req.params)
                if row.finish:
                    done.append(i)
            follow: list[Request] = []
            for i in done:
                row = st.rows[i]
                if self.keep_sessions and row.req.session is not None:  # prompt + completion minus its last token
                    self._kept[row.req.session] = _Kept(ids=row.req.prompt + row.toks[:-1], kv=st.row_kv(i))
                self.stats["generated_tokens"] += len(row.toks)
                text = self.tokenizer.decode(row.toks, skip_special_tokens=True)
                g = Generation(token_ids=row.toks, logprobs=row.lps, text=text, finish_reason=row.finish, prompt_tokens=len(row.req.prompt), cached_tokens=row.cached)
                follow += on_done(row.req, g)
            pending = follow + pending  # running trajectories first: their kept contexts are then short-lived
            keep = st.remove(done)
            logits = None
            if st.rows:
                tok = tok.index_select(0, torch.tensor(keep, dtype=torch.long, device=self.device))
                logits = self._stream_step(st, tok)
                st.advance()

    def _stream_room(self, st: "_Stream", pending: list[Request]) -> int:
        """How many pending requests may join the stream now: free rows under ``max_batch`` and under the memory
        budget, counted at the columns a rebuild would allocate for the longest context and generation in sight."""
        room = self.max_batch - len(st.rows)
        if self.max_kv_bytes is None or not pending or room <= 0:
            return room
        cand = pending[:room]
        longest = max([st.col - st.lo if st.rows else 0] + [len(r.prompt) for r in cand])
        rem = max([st._remaining()] + [r.params.max_new_tokens for r in cand])
        allowed = self._rows_within_budget(longest + rem + 2 * _Stream.MARGIN)
        st.max_rows = allowed
        return min(room, allowed - len(st.rows))

    def _sample_rows(self, logits: torch.Tensor, rows: list["_StreamRow"], gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Next token and log-prob of every running row of a stream, each under its own request's settings."""
        groups: dict[str, list[int]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(row.key, []).append(i)
        if len(groups) == 1:
            return sample_next(logits, rows[0].req.params, gen)
        tok = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        lp = torch.empty(len(rows), dtype=torch.float32, device=logits.device)
        for idx in groups.values():
            sel = torch.tensor(idx, dtype=torch.long, device=logits.device)
            t, l = sample_next(logits.index_select(0, sel), rows[idx[0]].req.params, gen)
            tok[sel], lp[sel] = t, l
        return tok, lp

    def _prefix_of(self, prompt: list[int], min_len: int = 0) -> "_Kept | None":
        """The longest known shared prefix of at least ``min_len`` tokens that ``prompt`` strictly extends."""
        return max((pf for pf in self._prefixes if len(pf.ids) >= min_len and _extends(prompt, pf.ids)), key=lambda pf: len(pf.ids), default=None)

    def _share_prefixes(self, prompts: list[list[int]], kept: list["_Kept | None"]) -> None:
        """Give sequences without a kept context the longest known shared prefix; group the rest by common prefix
        (:func:`envace.prefixes.prefix_runs`), prefill each group's common prefix once (a batch-1 forward instead
        of one per sequence) and remember it (small LRU)."""
        todo = [b for b, k in enumerate(kept) if k is None]
        for b in todo:
            kept[b] = self._prefix_of(prompts[b])
        rest = sorted((b for b in todo if kept[b] is None), key=lambda b: prompts[b])
        adjacent = [common_prefix(prompts[a], prompts[b], min(len(prompts[a]), len(prompts[b])) - 1) for a, b in zip(rest, rest[1:])]  # leave >= 1 token to encode
        for first, end, n in prefix_runs(adjacent, self.min_shared_prefix):
            members = rest[first:end]
            ids = prompts[members[0]][:n]
            cache = slab_cache(self._n_layers(), 1, n)
            self._forward(torch.tensor([ids], device=self.device), torch.ones(1, n, dtype=torch.long, device=self.device), torch.arange(n, device=self.device)[None], cache)
            pf = _Kept(ids=ids, kv=cache.data[:, :, 0].clone())
            self._prefixes = (self._prefixes + [pf])[-self.max_prefixes :]
            self.stats["shared_prefix_tokens"] += n
            for b in members:
                kept[b] = pf

    def _keep(self, cache: Any, attn: torch.Tensor, width: int, rows: list[tuple[int, int]], prompts: list[list[int]], toks: list[list[int]], sessions: list[str | None]) -> None:
        """Store the keys/values of finished sequences that belong to a session (prompt + completion[:-1])."""
        if not self.keep_sessions:
            return
        for r, b in rows:
            s = sessions[b]
            if s is None:
                continue
            cols = attn[r, :width].nonzero().squeeze(-1)  # this sequence's columns (the last sampled token has no KV yet)
            ids = prompts[b] + toks[b][:-1]
            assert len(cols) == len(ids), (len(cols), len(ids))
            self._kept[s] = _Kept(ids=ids, kv=cache.row(r, cols))


@BACKENDS.register("hf")
def _make_hf(model: Any = None, tokenizer: Any = None, name: str | None = None, bf16: bool | str | None = False, **kw: Any) -> HFBackend:
    if model is None:
        from ..models import load

        model, tokenizer = load(name)
    return HFBackend(model, tokenizer, bf16=bf16, **kw)
