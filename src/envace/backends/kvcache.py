"""The KV caches of the HF backend: preallocated slabs that forwards write in place.

- :class:`SlabCache`: a prefill's keys/values, all layers in one tensor (layers, 2, batch, heads, capacity,
  head_dim) allocated at the first write (a ``DynamicCache`` would copy the whole cache at every append); kept
  session contexts are laid into it left-padded.
- :class:`_Stream`: the running batch of a continuous stream, every sequence right-aligned in one slab so that
  all write their next token at the same column; :class:`StreamCache` is the model's view of it, and the
  stream's shared prompt prefixes feed cascade attention (:class:`~envace.backends.fastdecode.SharedPrefixes`).

Keys are stored after RoPE, so each sequence keeps its own positions wherever its columns lie. A layer refers to its
cache (and a stream's layers to the stream) weakly: the cache owns its layers, so a strong reference back would make
every prefill cache and stream a reference cycle, whose slab (a stream's up to ``max_kv_gib``) is freed only when the
cyclic garbage collector gets to it -- a cache that lived through a few collections waits for a full one, rare in
a long process, so dead slabs pile up (with the tiny model, every cache of an experiment arm's evaluation was still
held when the arm ended). Without the cycle a cache is freed as soon as its generation call returns. This module imports
transformers (its caches subclass ``transformers.cache_utils.Cache``); :mod:`envace.backends.hf` imports it when a
backend first needs a cache, so importing the backend module does not.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from .base import Request
from .fastdecode import SharedPrefixes


def _alive(ref: "weakref.ref[Any]") -> Any:
    """The object a layer's weak reference names; a layer used after its cache is gone is a bug, said here."""
    obj = ref()
    if obj is None:
        raise ReferenceError("a KV cache layer was used after its cache was freed (keep the cache, not only a layer)")
    return obj


class SlabLayer(DynamicLayer):
    """One layer's view of a :class:`SlabCache`: keys/values are views of the slab up to the used length."""

    def __init__(self, slab: "SlabCache", idx: int, n: int):
        super().__init__()
        self._slab = weakref.ref(slab)  # the cache owns its layers: no cycle (see the module docstring)
        self.idx, self.n = idx, n

    @property
    def slab(self) -> "SlabCache":
        return _alive(self._slab)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
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
    """All layers' keys/values of a batch (a prefill) in one preallocated tensor (layers, 2, B, H, capacity, D),
    written in place (no per-step concatenation). Allocated at the first update, with the model's key dtype and
    shape; ``fills`` (batch row, start column, kv (layers, 2, H, L, D)) are laid in then, columns [0, n0) zeroed
    first."""

    def __init__(
        self,
        n_layers: int,
        batch: int,
        capacity: int,
        n0: int = 0,
        fills: list[tuple[int, int, torch.Tensor]] | None = None,
    ):
        super().__init__(layers=[SlabLayer(self, i, n0) for i in range(n_layers)])
        self.batch, self.capacity, self.n0 = batch, capacity, n0
        self.fills = fills or []
        self.data: torch.Tensor | None = None

    def storage(self, like: torch.Tensor) -> torch.Tensor:
        if self.data is None:
            _, H, _, D = like.shape
            self.data = torch.empty(
                len(self.layers), 2, self.batch, H, self.capacity, D, dtype=like.dtype, device=like.device
            )
            self.data[..., : self.n0, :].zero_()  # holes of left-padded rows must be finite (they are masked out)
            for b, start, kv in self.fills:
                self.data[:, :, b, :, start : start + kv.shape[-2]] = kv
            self.fills = []
        return self.data

    def advance(self, t: int = 1) -> None:
        """Count ``t`` columns written outside the model (by a :class:`~envace.backends.fastdecode.LlamaDecoder`
        forward) and point every layer's keys/values at the used columns of ``data``."""
        for layer in self.layers:
            layer.n += t
            layer.keys, layer.values = (
                self.data[layer.idx, 0, :, :, : layer.n],
                self.data[layer.idx, 1, :, :, : layer.n],
            )


class StreamLayer(DynamicLayer):
    """One layer's view of a :class:`_Stream` slab: writes the fed token's keys/values at column ``col`` of the
    running rows, shows the model the window [lo, col]."""

    def __init__(self, st: "_Stream", idx: int):
        super().__init__()
        self._st = weakref.ref(st)  # the stream owns its cache and layers: no cycle (see the module docstring)
        self.idx = idx

    @property
    def st(self) -> "_Stream":
        return _alive(self._st)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
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
        self.cache = StreamCache(self)  # reads data, col and lo live: made once
        # shared prompt prefixes for cascade attention: (layers, 2, slots, heads, columns, head_dim)
        self.pre: torch.Tensor | None = None
        self.slot_ref: list[Any] = []  # the _Kept prefix in each slot (kept alive while a row may use it)
        self.slot_len: list[int] = []
        self.slot_users: list[int] = []
        self.max_rows: int | None = None  # rows a rebuild may allocate at most (the backend's memory budget)

    # -- admission ------------------------------------------------------------------------------------------
    def admit(
        self,
        reqs: list[Request],
        cache: Any,
        attn: torch.Tensor,
        width: int,
        L: list[int],
        prefixes: list[Any] | None = None,
    ) -> None:
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
            self.rows.append(
                _StreamRow(req=req, key=req.params.sampling_key(), start=self.col - n, pos=len(req.prompt), cached=L[b])
            )
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
        valid = (self.attn[:R, lo : self.col + 1] != 0) & (
            cols[None, :] >= torch.tensor(own_start, device=self.device)[:, None]
        )
        own = torch.zeros(R, 1, 1, len(cols), device=self.device).masked_fill_(~valid[:, None, None, :], inf)
        idx = lambda v: torch.tensor(v, dtype=torch.long, device=self.device)  # noqa: E731
        return SharedPrefixes(
            kv=self.pre[:, :, :S, :, :P], mask=mask, n=n, gather=idx(gather), scatter=idx(scatter), lo=lo, own=own
        )

    def _remaining(self) -> int:
        return max((r.req.params.max_new_tokens - len(r.toks) for r in self.rows), default=0)

    def _fits(self, n_new: int, longest: int, rem: int) -> bool:
        return (
            len(self.rows) + n_new <= self.data.shape[2]
            and longest <= self.col
            and self.col + max(rem, self._remaining()) <= self.data.shape[4]
        )

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
