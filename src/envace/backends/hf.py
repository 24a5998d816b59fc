"""HuggingFace transformers backend: continuous batching over a preallocated KV slab, with per-session prefix reuse.

One decode loop (:meth:`HFBackend._run_stream`) serves both entry points. :meth:`~HFBackend.generate_stream` admits
requests into the running batch as they come (the follow-ups that finished ones hand back join at the next step);
:meth:`~HFBackend.generate` is a stream of its prompts, every one admitted at once as far as ``max_batch`` and
``max_kv_gib`` allow (the others join as rows finish), results in input order. An admission prefills the new tokens
of its requests into a :class:`~envace.backends.kvcache.SlabCache`, whose columns are copied into the stream's slab
(:class:`~envace.backends.kvcache._Stream`); every decode step then feeds one token per running sequence, written in
place (a ``DynamicCache`` would copy the whole cache once per generated token to append one column), and a finished
sequence leaves the batch at once.

Reuse, exact up to kernel rounding: a prompt tagged with a ``session`` that extends the tokens kept for that
session (the previous prompt + completion of the same context) only encodes its new tokens: the kept keys/values
are laid into the prefill cache left-padded, with the new tokens after them and the attention mask covering the
holes. A prompt that agrees with its session's kept tokens only up to some point (a context rewritten since: Act's
earlier thinking dropped at a new user message, ``RolloutConfig.thinking_history``) reuses the kept keys/values of
that common prefix (at least ``min_shared_prefix`` tokens) and encodes the rest, never the kept ones past it.
Prompts without kept context that share a long prefix (the K trajectories of a task, the tasks of one environment:
system prompt and tool schemas) get it prefilled once per cluster. Keys are stored after RoPE, so
each sequence keeps its own positions.

Forwards: ``model(...)`` with the slab as its cache, or, for a Llama model with bf16 on CPU (``packed``), the
packed-weight forward of :mod:`envace.backends.fastdecode`, which reads and writes the same slab.

Sampling is :mod:`envace.backends.sampling`; the caches are :mod:`envace.backends.kvcache`, imported when a backend
first needs one (it imports transformers; importing this module does not).

Determinism: a call draws from one ``torch.Generator`` seeded per call (``params.seed`` of :meth:`~HFBackend.generate`,
``seed`` of :meth:`~HFBackend.generate_stream`), so the same prompts, seed and weights give the same tokens on CPU.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch

from ..core.precision import use_bf16
from ..math.prefixes import common_prefix, prefix_runs
from ..chat.prompts import ChatFormat
from ..core.types import Generation
from .base import Backend, OnDone, Poll, Request, SamplingParams
from .fastdecode import decoder_for
from .sampling import draw, sample_grouped, sample_next

if TYPE_CHECKING:
    from .kvcache import _Stream, _StreamRow

__all__ = ["HFBackend", "draw", "sample_next"]  # the sampling functions are imported from here too

_KVCACHE_NAMES = {"SlabCache", "StreamCache", "_Stream", "_StreamRow"}


def __getattr__(name: str) -> Any:
    """The cache classes of :mod:`envace.backends.kvcache`, importable from here without importing transformers
    until one is asked for (PEP 562)."""
    if name in _KVCACHE_NAMES:
        from . import kvcache

        return getattr(kvcache, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _extends(prompt: list[int], prefix: list[int]) -> bool:
    """True if ``prompt`` strictly extends ``prefix`` (at least one new token to encode)."""
    return len(prefix) < len(prompt) and prompt[: len(prefix)] == prefix


@dataclass
class _Kept:
    ids: list[int]  # tokens whose keys/values are kept (prompt + completion minus its last token)
    kv: torch.Tensor  # (layers, 2, H, len(ids), D)


def _nbytes(k: _Kept) -> int:
    return k.kv.numel() * k.kv.element_size()


class HFBackend(Backend):
    """Generation with a transformers causal LM (CPU or GPU), optionally under bf16 autocast.

    ``keep_sessions``: keep each session's KV between calls; ``share_prefixes``: prefill long common prompt
    prefixes once. Both are exact up to kernel rounding and on by default; off, every prompt is encoded whole.
    ``bf16``: true, false or ``"auto"`` (bf16 only where it is faster than float32, :mod:`envace.core.precision`; true
    where it is slow is honoured with a one-line warning). ``packed`` (default: with bf16 on CPU): run every
    forward of a Llama model through :class:`~envace.backends.fastdecode.LlamaDecoder` (packed bf16 weights,
    float32 keys/values and attention) instead of ``model(...)``; other architectures always use ``model(...)``.
    ``cascade`` (packed streams): rows that start with the same shared prompt prefix attend to one copy of it (exact up
    to rounding). ``max_prefill_gib``: memory budget of one prefill's attention scores (long new prompts are prefilled a
    few at a time; None: no bound).
    ``max_kv_gib``: memory budget of the running batch's keys/values (the stream's slab, counted at the columns a
    rebuild allocates): fewer sequences run at once when their contexts are long (at least one always runs); None:
    only ``max_batch`` limits them. Every sequence of the slab takes as many columns as the longest one, so 64 rows
    of 1.3k-token contexts of SmolLM2-135M take 4.7 GB in float32. The follow-up generations of running
    trajectories go before requests not started yet, so the contexts kept between turns follow the running
    trajectories too.
    ``max_kept_gib``: memory budget of the contexts kept between calls (``keep_sessions``): past it the least
    recently used are dropped (a dropped context is encoded again when its session comes back: the same tokens,
    more work). Without a bound, 64 trajectories of the demo's rollouts (an Act and a Rehearse context each, ~1.5k
    tokens) kept ~9 GB of float32 keys/values of SmolLM2-135M; None: no bound.
    ``stats`` counts prompt tokens, those served from kept sessions or shared prefixes, generated tokens, forwards
    and decode steps (forwards that feed one token per running sequence), and kept contexts dropped for memory.
    """

    streams = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        bf16: bool | str | None = False,
        keep_sessions: bool = True,
        max_batch: int = 64,
        share_prefixes: bool = True,
        packed: bool | None = None,
        cascade: bool = True,
        max_kv_gib: float | None = 2.0,
        max_prefill_gib: float | None = 1.0,
        max_kept_gib: float | None = 4.0,
    ):
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
        if max_kept_gib is not None and max_kept_gib <= 0:
            raise ValueError(f"max_kept_gib must be > 0 or None, got {max_kept_gib}")
        self.max_kept_bytes = None if max_kept_gib is None else max_kept_gib * 2**30
        self._kept: dict[str, _Kept] = {}  # least recently used first
        self._kept_bytes = 0
        self._prefixes: list[_Kept] = []  # shared prompt prefixes (LRU), dropped with release_all / sync_weights
        self.share_prefixes = share_prefixes
        self.min_shared_prefix = 32
        self.cascade = cascade  # packed decode steps of a stream attend to shared prompt prefixes once per group
        self.min_cascade_prefix = 64
        self.max_prefixes = 16
        eos = {tokenizer.eos_token_id, *ChatFormat.for_tokenizer(tokenizer).stop_ids}  # eos and the end of turn
        self.eos_ids = {e for e in eos if e is not None}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids))
        self.stats = {
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "shared_prefix_tokens": 0,
            "generated_tokens": 0,
            "forward_calls": 0,
            "decode_steps": 0,
            "kept_dropped": 0,
        }

    # -- public API ---------------------------------------------------------------------------------------
    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, sessions: Sequence[str | None] | None = None
    ) -> list[Generation]:
        """One stream of all ``prompts`` (see the module docstring), seeded by ``params.seed``; results in input
        order."""
        sessions = list(sessions) if sessions is not None else [None] * len(prompts)
        out: dict[int, Generation] = {}

        def done(req: Request, g: Generation) -> list[Request]:
            out[req.tag] = g
            return []

        self._stream(
            [Request(p, params, session=s, tag=i) for i, (p, s) in enumerate(zip(prompts, sessions))], done, params.seed
        )
        return [out[i] for i in range(len(prompts))]

    def generate_stream(
        self, requests: Sequence[Request], on_done: OnDone, seed: int | None = None, poll: Poll | None = None
    ) -> None:
        """Continuous batching: requests join the running batch as soon as they arrive (their new tokens are
        prefilled, with session reuse and shared prefixes), every running sequence advances one token per forward,
        and a finished one leaves at once (``on_done`` may hand back follow-ups, and ``poll``, asked before every
        step, new requests: both join at the next step; a request whose ``cancelled`` says so leaves at the next
        step, "abort"). Sequences live right-aligned in one preallocated slab (see
        :class:`~envace.backends.kvcache._Stream`)."""
        self._stream(list(requests), on_done, seed, poll)

    def kv_bytes_per_token(self) -> int:
        """Bytes of one token's keys and values over all layers, at the widest dtype a cache here uses (float32)."""
        cfg = self._text_config()
        heads = int(cfg.num_attention_heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        return self._n_layers() * 2 * kv_heads * head_dim * 4

    def _prefill_fit(self, prompts: list[list[int]], sessions: Sequence[str | None]) -> int:
        """How many of ``prompts`` (in order, at least 1) one prefill may encode together within ``max_prefill_gib``:
        its attention materialises (rows, heads, new tokens, context) float32 scores a few times over (softmax, mask),
        so 16 prompts of 2.5k new tokens would take ~11 GB at once; a session's kept tokens are not new."""
        if self.max_prefill_bytes is None or len(prompts) <= 1:
            return len(prompts)
        heads = int(self._text_config().num_attention_heads)
        longest = new = 0
        for n, (p, s) in enumerate(zip(prompts, sessions)):
            k = self._kept_for(p, s)
            longest, new = max(longest, len(p)), max(new, len(p) - (len(k.ids) if k else 0))
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
            self._drop_kept(s)

    def release_all(self) -> None:
        self._kept.clear()
        self._kept_bytes = 0
        self._prefixes.clear()

    def _keep(self, session: str, kept: _Kept) -> None:
        """Keep ``session``'s context, then drop the least recently used others past ``max_kept_gib``."""
        self._drop_kept(session)
        self._kept[session] = kept
        self._kept_bytes += _nbytes(kept)
        while self.max_kept_bytes is not None and self._kept_bytes > self.max_kept_bytes and len(self._kept) > 1:
            self._drop_kept(next(iter(self._kept)))
            self.stats["kept_dropped"] += 1

    def _drop_kept(self, session: str) -> None:
        k = self._kept.pop(session, None)
        if k is not None:
            self._kept_bytes -= _nbytes(k)

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

    def _text_config(self) -> Any:
        """The model's (decoder) text config."""
        cfg = self.model.config
        return cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg

    def _n_layers(self) -> int:
        return int(self._text_config().num_hidden_layers)

    def _kept_for(self, prompt: list[int], session: str | None) -> "_Kept | None":
        """What ``prompt`` can reuse of ``session``'s kept context: all of it if ``prompt`` extends it, else its
        common prefix with ``prompt`` (a view) when that is at least ``min_shared_prefix`` tokens (the context was
        rewritten past it), else None."""
        k = self._kept.get(session) if (session is not None and self.keep_sessions) else None
        if k is None:
            return None
        if not _extends(prompt, k.ids):
            n = common_prefix(prompt, k.ids, len(prompt) - 1)  # leave >= 1 token to encode
            if n < self.min_shared_prefix:
                return None
            k = _Kept(ids=k.ids[:n], kv=k.kv[..., :n, :])  # keys/values are (layers, 2, H, L, D)
        self._kept[session] = self._kept.pop(session)  # most recently used last
        return k

    def _forward(self, input_ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        """Last-position logits (B, V) of ``input_ids`` (B, T) fed into a slab ``cache`` after its used columns."""
        self.stats["forward_calls"] += 1
        if self._decoder is not None:  # the packed decoder writes the slab itself
            n = cache.layers[0].n
            with torch.autocast(device_type=self.device.type, enabled=False):
                logits = self._decoder.forward(
                    input_ids, pos, cache.storage(self._decoder.kv_like(input_ids.shape[0])), 0, n, attn
                )
            cache.advance(input_ids.shape[1])
            return logits
        out = self.model(
            input_ids=input_ids,
            attention_mask=attn,
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :]

    def _stream_step(self, st: "_Stream", tok: torch.Tensor) -> torch.Tensor:
        """One decode step of a stream: ``tok`` (one per running row) fed at the stream's column; next logits."""
        self.stats["decode_steps"] += 1
        ids, attn, pos = st.step_inputs(tok)
        if self._decoder is None:
            return self._forward(ids, attn, pos, st.cache)
        self.stats["forward_calls"] += 1
        with torch.autocast(device_type=self.device.type, enabled=False):
            return self._decoder.forward(
                ids, pos, st.data, st.lo, st.col, attn, shared=st.shared_inputs() if self.cascade else None
            )

    def _prefill(
        self, prompts: list[list[int]], sessions: list[str | None]
    ) -> tuple[Any, torch.Tensor, int, list[int], torch.Tensor]:
        """Encode the prompts' new tokens into a fresh batch cache (a :class:`~envace.backends.kvcache.SlabCache`).

        Returns (cache, attention mask (B, width), width, kept lengths, last-position logits (B, V))."""
        from .kvcache import SlabCache

        B = len(prompts)
        dev = self.device
        # what each sequence can reuse: its session's kept context, else a shared prefix (e.g. the system prompt)
        kept: list[_Kept | None] = [self._kept_for(p, s) for p, s in zip(prompts, sessions)]
        if self.share_prefixes:
            self._share_prefixes(prompts, kept)
        L = [len(k.ids) if k else 0 for k in kept]
        new = [p[n:] for p, n in zip(prompts, L)]
        maxL, maxN = max(L), max(len(n) for n in new)
        width = maxL + maxN
        # batch cache: kept contexts left-padded into columns [0, maxL), new tokens left-padded into [maxL, width)
        fills = [(b, maxL - L[b], k.kv) for b, k in enumerate(kept) if k is not None]
        cache = SlabCache(self._n_layers(), B, width, n0=maxL, fills=fills)
        attn = torch.zeros(B, width, dtype=torch.long, device=dev)
        ids = torch.full((B, maxN), self.pad_id, dtype=torch.long, device=dev)
        pos = torch.zeros(B, maxN, dtype=torch.long, device=dev)
        for b, n in enumerate(new):
            attn[b, maxL - L[b] : maxL] = 1
            ids[b, maxN - len(n) :] = torch.tensor(n, dtype=torch.long)
            pos[b, maxN - len(n) :] = torch.arange(L[b], L[b] + len(n))
            attn[b, width - len(n) : width] = 1
        logits = self._forward(ids, attn, pos, cache)
        self.stats["prompt_tokens"] += sum(len(p) for p in prompts)
        self.stats["cached_tokens"] += sum(L)
        return cache, attn, width, L, logits

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

    # -- the decode loop ------------------------------------------------------------------------------------
    def _stream(self, requests: list[Request], on_done: OnDone, seed: int | None, poll: Poll | None = None) -> None:
        """Run a stream under one generator seeded with ``seed`` (None: a fresh random seed)."""
        gen = torch.Generator(device=self.device)  # on the logits' device: draws are made there
        gen.manual_seed(seed if seed is not None else torch.seed() % (2**63))
        if self._decoder is not None:
            self._decoder.refresh()  # the weights may have changed since the last call
        with torch.no_grad(), self._autocast():
            self._run_stream(requests, on_done, gen, poll)

    def _run_stream(
        self, pending: list[Request], on_done: OnDone, gen: torch.Generator, poll: Poll | None = None
    ) -> None:
        """Take what ``poll`` hands in, admit pending requests while there is room, sample one token per running row,
        hand finished (or cancelled) rows to ``on_done`` (their follow-ups go first in the queue), feed the others'
        tokens: until nothing is left."""
        from .kvcache import _Stream

        st = _Stream(self._n_layers(), self.device, torch.float32 if self._decoder is not None else None)
        logits: torch.Tensor | None = None  # next-token logits of st.rows, in row order
        while (pending := pending + list(poll() if poll else [])) or st.rows:
            room = self._stream_room(st, pending)
            if pending and room > 0:
                room = self._prefill_fit([r.prompt for r in pending[:room]], [r.session for r in pending[:room]])
                take, pending = pending[:room], pending[room:]
                cache, attn, width, L, new_logits = self._prefill([r.prompt for r in take], [r.session for r in take])
                cascade = self._decoder is not None and self.cascade
                st.admit(
                    take,
                    cache,
                    attn,
                    width,
                    L,
                    [self._prefix_of(r.prompt, self.min_cascade_prefix) for r in take] if cascade else None,
                )
                logits = new_logits if logits is None else torch.cat([logits, new_logits])
            tok, lp = self._sample_rows(logits, st.rows, gen)
            tok_l, lp_l = tok.tolist(), lp.tolist()
            done = []
            for i, row in enumerate(st.rows):
                row.toks.append(tok_l[i])
                row.lps.append(lp_l[i])
                row.finish = self._finish_reason(row.toks, row.req.params) or _aborted(row.req)
                if row.finish:
                    done.append(i)
            follow: list[Request] = []
            for i in done:
                row = st.rows[i]
                if self.keep_sessions and row.req.session is not None:  # prompt + completion minus its last token
                    self._keep(row.req.session, _Kept(ids=row.req.prompt + row.toks[:-1], kv=st.row_kv(i)))
                self.stats["generated_tokens"] += len(row.toks)
                text = self.tokenizer.decode(row.toks, skip_special_tokens=True)
                g = Generation(
                    token_ids=row.toks,
                    logprobs=row.lps,
                    text=text,
                    finish_reason=row.finish,
                    prompt_tokens=len(row.req.prompt),
                    cached_tokens=row.cached,
                )
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
        allowed = self._rows_within_budget(longest + rem + 2 * st.MARGIN)
        st.max_rows = allowed
        return min(room, allowed - len(st.rows))

    def _sample_rows(
        self, logits: torch.Tensor, rows: list["_StreamRow"], gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Next token and log-prob of every running row (logits (R, V)), each under its own request's settings: the
        one seam through which every sampled token passes (tests and benchmarks override it to script tokens)."""
        return sample_grouped(logits, [r.req.params for r in rows], [r.key for r in rows], gen)

    def _prefix_of(self, prompt: list[int], min_len: int = 0) -> "_Kept | None":
        """The longest known shared prefix of at least ``min_len`` tokens that ``prompt`` strictly extends."""
        return max(
            (pf for pf in self._prefixes if len(pf.ids) >= min_len and _extends(prompt, pf.ids)),
            key=lambda pf: len(pf.ids),
            default=None,
        )

    def _share_prefixes(self, prompts: list[list[int]], kept: list["_Kept | None"]) -> None:
        """Give sequences without a kept context the longest known shared prefix; group the rest by common prefix
        (:func:`envace.math.prefixes.prefix_runs`), prefill each group's common prefix once (a batch-1 forward instead
        of one per sequence) and remember it (small LRU)."""
        from .kvcache import SlabCache

        todo = [b for b, k in enumerate(kept) if k is None]
        for b in todo:
            kept[b] = self._prefix_of(prompts[b])
        rest = sorted((b for b in todo if kept[b] is None), key=lambda b: prompts[b])
        adjacent = [
            common_prefix(prompts[a], prompts[b], min(len(prompts[a]), len(prompts[b])) - 1)
            for a, b in zip(rest, rest[1:])
        ]  # leave >= 1 token to encode
        for first, end, n in prefix_runs(adjacent, self.min_shared_prefix):
            members = rest[first:end]
            ids = prompts[members[0]][:n]
            cache = SlabCache(self._n_layers(), 1, n)
            self._forward(
                torch.tensor([ids], device=self.device),
                torch.ones(1, n, dtype=torch.long, device=self.device),
                torch.arange(n, device=self.device)[None],
                cache,
            )
            pf = _Kept(ids=ids, kv=cache.data[:, :, 0].clone())
            self._prefixes = (self._prefixes + [pf])[-self.max_prefixes :]
            self.stats["shared_prefix_tokens"] += n
            for b in members:
                kept[b] = pf


def _aborted(req: Request) -> str:
    """ "abort" if ``req`` has been cancelled (its client has gone), else ""."""
    return "abort" if req.cancelled is not None and req.cancelled() else ""
