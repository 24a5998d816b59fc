"""A lean forward for Llama-architecture models that reads and writes the backend's KV slab (prefill and decode).

A decode step feeds one token per running sequence. Through ``model(...)`` that is ~40 small modules per layer,
mask construction and cache bookkeeping; on a CPU the step is bound by reading the weights (and, at long
contexts, the keys/values), not by arithmetic. :class:`LlamaDecoder` does the same computation as
``LlamaForCausalLM.forward`` with the projections fused (q|k|v one matmul, gate|up one matmul) and the weights
packed once in the compute dtype; it encodes prompts too (several tokens per row, causal):

- ``float32``: the model's own numbers, up to kernel rounding (a test holds the logits to HF's within 1e-4);
- ``bfloat16``: the weights in bf16 (half the bytes per step, and CPU bf16 matmuls run on faster kernels); the
  residual stream, norms, keys/values, attention (float32 SDPA: the bf16 attention kernels are slower on CPU)
  and logits in float32. Log-probs move by ~0.013 nats per token against the float32 model (docs/benchmarks.md),
  so a float32 trainer recomputes them (``recompute_old_logprobs``, on by default then).

Decode steps of a stream can attend through shared prompt prefixes (:class:`SharedPrefixes`, cascade attention).

Packed weights are rebuilt whenever the model's parameters change (an optimizer step or ``load_state_dict``
bumps their version counters; replacing them changes their storage), so a decoder never serves stale weights.

Only plain Llama blocks are taken (RMSNorm, RoPE from the model's own rotary module, so scaled RoPE variants are
covered, SiLU-gated MLP, grouped-query attention, optional projection biases); :func:`decoder_for` returns None
for anything else and the backend keeps using ``model(...)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .models import head_size

_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # SDPA that also returns the log-sum-exp


@dataclass
class SharedPrefixes:
    """Cascade attention for a decode step: rows that start with the same prompt prefix (the K trajectories of a
    task: system prompt, tool schemas, task) attend to one copy of its keys/values together, and each row to its
    own slab columns after its prefix; the two softmaxes are merged by their log-sum-exps. Exact up to rounding:
    the prefix's keys/values are the ones the rows' own columns hold.

    kv: (layers, 2, slots, kv heads, P, head_dim) float32, slot s valid in its first columns (``mask``);
    mask: (slots, 1, 1, P) float, 0 or -inf; n: query rows per slot; gather: (slots * n,) the running row behind each
    query row (R: none, a zero query); scatter: (R,) each row's query row (slots * n: none, log-sum-exp -inf);
    lo: the first slab column of any row's own part; own: (R, 1, 1, col + 1 - lo) float mask of the own parts."""

    kv: torch.Tensor
    mask: torch.Tensor
    n: int
    gather: torch.Tensor
    scatter: torch.Tensor
    lo: int
    own: torch.Tensor


@dataclass
class _Layer:
    ln1: torch.Tensor  # (hidden,) float32
    qkv: torch.Tensor  # (q + 2 kv, hidden) decode dtype
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # (hidden, q)
    o_bias: torch.Tensor | None
    ln2: torch.Tensor
    gate_up: torch.Tensor  # (2 inter, hidden)
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor  # (hidden, inter)
    down_bias: torch.Tensor | None


def _supported(model: Any) -> bool:
    cfg = getattr(model, "config", None)
    if (
        type(model).__name__ != "LlamaForCausalLM"
        or cfg is None
        or getattr(cfg, "model_type", None) != "llama"
        or getattr(cfg, "hidden_act", "silu") != "silu"
    ):
        return False
    inner = getattr(model, "model", None)
    return all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")) and hasattr(
        model, "lm_head"
    )


def decoder_for(model: Any, dtype: torch.dtype) -> "LlamaDecoder | None":
    """A :class:`LlamaDecoder` for ``model`` in ``dtype``, or None if the model is not a plain Llama."""
    return LlamaDecoder(model, dtype) if _supported(model) else None


def _cat_bias(*mods: Any) -> torch.Tensor | None:
    if all(m.bias is None for m in mods):
        return None
    return torch.cat(
        [
            m.bias if m.bias is not None else torch.zeros(m.out_features, dtype=m.weight.dtype, device=m.weight.device)
            for m in mods
        ]
    ).float()


def _bias(m: Any) -> torch.Tensor | None:
    return None if m.bias is None else m.bias.detach().float()


class LlamaDecoder:
    """One decode step of a Llama model over a batch KV slab (see the module docstring)."""

    def __init__(self, model: Any, dtype: torch.dtype):
        cfg = model.config
        self.model, self.dtype = model, dtype
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = head_size(cfg)
        self.eps = float(cfg.rms_norm_eps)
        self.scale = self.head_dim**-0.5
        self._version: tuple[int, int] | None = None
        self.layers: list[_Layer] = []

    # -- weights ------------------------------------------------------------------------------------------
    def _weights_version(self) -> tuple[int, int]:
        """Changes when a parameter is modified in place (its version counter) or replaced (its storage)."""
        ps = list(self.model.parameters())
        return sum(p._version for p in ps), sum(p.data_ptr() for p in ps)

    @torch.no_grad()
    def refresh(self) -> None:
        """(Re)pack the weights if the model's parameters changed since the last packing."""
        v = self._weights_version()
        if v == self._version:
            return
        inner, dt = self.model.model, self.dtype
        layers = []
        for blk in inner.layers:
            a, m = blk.self_attn, blk.mlp
            layers.append(
                _Layer(
                    ln1=blk.input_layernorm.weight.detach().float(),
                    qkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).to(dt).contiguous(),
                    qkv_bias=_cat_bias(a.q_proj, a.k_proj, a.v_proj),
                    o=a.o_proj.weight.detach().to(dt).contiguous(),
                    o_bias=_bias(a.o_proj),
                    ln2=blk.post_attention_layernorm.weight.detach().float(),
                    gate_up=torch.cat([m.gate_proj.weight, m.up_proj.weight]).to(dt).contiguous(),
                    gate_up_bias=_cat_bias(m.gate_proj, m.up_proj),
                    down=m.down_proj.weight.detach().to(dt).contiguous(),
                    down_bias=_bias(m.down_proj),
                )
            )
        self.layers = layers
        self.embed = inner.embed_tokens.weight.detach()
        self.norm = inner.norm.weight.detach().float()
        self.head = self.model.lm_head.weight.detach().to(dt).contiguous()
        self.head_bias = _bias(self.model.lm_head)
        self._version = v

    # -- the step -----------------------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """RMSNorm in float32, result in the decode dtype (x: (R, hidden) float32)."""
        return (w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))).to(self.dtype)

    @staticmethod
    def _linear(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        y = F.linear(h, w).float()
        return y if b is None else y + b

    def kv_like(self, rows: int) -> torch.Tensor:
        """An empty (rows, kv heads, 0, head_dim) float32 tensor: what a slab cache sizes its storage from."""
        return torch.empty(rows, self.n_kv, 0, self.head_dim, dtype=torch.float32, device=self.embed.device)

    @torch.no_grad()
    def forward(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        kv: torch.Tensor,
        lo: int,
        col: int,
        attn: torch.Tensor,
        shared: SharedPrefixes | None = None,
    ) -> torch.Tensor:
        """Feed ``ids`` (R, T) at positions ``pos`` (R, T): write their keys/values at columns [col, col + T) of rows
        [0, R) of ``kv`` (layers, 2, rows >= R, kv heads, columns, head_dim; float32), attend causally over columns
        [lo, col + T) where ``attn`` (R, col + T - lo; nonzero = attend) says so, and return the logits of each
        row's last token (R, vocab) in float32. A token always sees itself (a padding query stays finite).
        ``shared`` (decode steps, T = 1): attend through shared prefixes instead (see :class:`SharedPrefixes`)."""
        R, T = ids.shape
        if shared is not None and T != 1:
            raise ValueError("shared prefixes are for decode steps (one token per row)")
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        x = self.embed[ids].float()  # (R, T, hidden): the residual stream stays float32
        cos, sin = self.model.model.rotary_emb(x, pos)  # (R, T, D) float32
        cos, sin = cos[:, :, None], sin[:, :, None]
        mask = (attn != 0)[:, None, None, :]  # (R, 1, 1, W = col + T - lo) True = attend
        if T > 1:
            kcol = torch.arange(lo, col + T, device=ids.device)
            qcol = torch.arange(col, col + T, device=ids.device)
            causal = (kcol[None, :] <= qcol[:, None]) & ((kcol[None, :] == qcol[:, None]) | mask[:, 0])  # (R, T, W)
            mask = causal[:, None]
        half = D // 2
        for i, L in enumerate(self.layers):
            qkv = self._linear(self._norm(x, L.ln1), L.qkv, L.qkv_bias)  # (R, T, (H + 2 KV) D)
            qk = qkv[..., : (H + KV) * D].view(R, T, H + KV, D)  # rotate q and k at once
            v = qkv[..., (H + KV) * D :].view(R, T, KV, D)
            qk = qk * cos + torch.cat([-qk[..., half:], qk[..., :half]], dim=-1) * sin
            slab = kv[i]  # (2, rows, KV, C, D)
            slab[0, :R, :, col : col + T] = qk[:, :, H:].transpose(1, 2)
            slab[1, :R, :, col : col + T] = v.transpose(1, 2)
            if shared is None:
                keys, vals = slab[0, :R, :, lo : col + T], slab[1, :R, :, lo : col + T]  # (R, KV, W, D)
                q = qk[:, :, :H].transpose(1, 2)  # (R, H, T, D)
                ctx = F.scaled_dot_product_attention(
                    q, keys, vals, attn_mask=mask, scale=self.scale, enable_gqa=H != KV
                )
                ctx = ctx.transpose(1, 2).reshape(R, T, H * D)
            else:
                own = slab[0, :R, :, shared.lo : col + 1], slab[1, :R, :, shared.lo : col + 1]
                ctx = self._cascade(qk[:, 0, :H], own, shared, i).view(R, 1, H * D)
            x = x + self._linear(ctx.to(self.dtype), L.o, L.o_bias)
            g, u = self._linear(self._norm(x, L.ln2), L.gate_up, L.gate_up_bias).chunk(2, dim=-1)
            x = x + self._linear((F.silu(g) * u).to(self.dtype), L.down, L.down_bias)
        return self._linear(self._norm(x[:, -1], self.norm), self.head, self.head_bias)

    def _cascade(
        self, q: torch.Tensor, own: tuple[torch.Tensor, torch.Tensor], sp: SharedPrefixes, layer: int
    ) -> torch.Tensor:
        """Attention of one query per row (q: (R, H, D)) over its shared prefix and its own columns -> (R, H D)."""
        R, H, D = q.shape
        KV, G = self.n_kv, H // self.n_kv
        S, n = sp.kv.shape[2], sp.n
        qf = q.reshape(R, KV, G, D)  # a kv head's G query heads as G query positions (grouped-query attention)
        o_own, lse_own = _FLASH(
            qf, own[0], own[1], 0.0, False, attn_mask=sp.own, scale=self.scale
        )  # (R, KV, G, D), (R, KV, G)
        qp = torch.cat([qf, qf.new_zeros(1, KV, G, D)]).index_select(0, sp.gather)  # (S n, KV, G, D)
        qp = qp.view(S, n, KV, G, D).transpose(1, 2).reshape(S, KV, n * G, D)
        o_p, lse_p = _FLASH(qp, sp.kv[layer, 0], sp.kv[layer, 1], 0.0, False, attn_mask=sp.mask, scale=self.scale)
        o_p = o_p.reshape(S, KV, n, G, D).transpose(1, 2).reshape(S * n, KV, G, D)
        lse_p = lse_p.reshape(S, KV, n, G).transpose(1, 2).reshape(S * n, KV, G)
        o_p = torch.cat([o_p, o_p.new_zeros(1, KV, G, D)]).index_select(0, sp.scatter)  # (R, KV, G, D)
        lse_p = torch.cat([lse_p, lse_p.new_full((1, KV, G), float("-inf"))]).index_select(0, sp.scatter)
        m = torch.maximum(lse_own, lse_p)
        w_own, w_p = torch.exp(lse_own - m)[..., None], torch.exp(lse_p - m)[..., None]
        return ((o_own * w_own + o_p * w_p) / (w_own + w_p)).reshape(R, H * D)

    def step(
        self, tok: torch.Tensor, pos: torch.Tensor, kv: torch.Tensor, lo: int, col: int, attn: torch.Tensor
    ) -> torch.Tensor:
        """One decode step: :meth:`forward` of one token per row (tok, pos: (R,))."""
        return self.forward(tok[:, None], pos[:, None], kv, lo, col, attn)
