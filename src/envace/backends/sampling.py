"""Next-token sampling: pure functions of logits (rows, vocabulary), sampling settings and a ``torch.Generator``,
the only source of randomness (the same logits, settings and generator state give the same tokens)."""

from __future__ import annotations

from typing import Sequence

import torch

from .base import SamplingParams


def sample_next(
    logits: torch.Tensor, params: SamplingParams, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
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


def sample_grouped(
    logits: torch.Tensor, params: Sequence[SamplingParams], keys: Sequence[str], gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_next` for rows with settings of their own: row ``i`` under ``params[i]``; rows with equal
    ``keys`` (:meth:`SamplingParams.sampling_key`) are sampled together, groups in order of their first row.

    logits: (R, V) -> tokens (R,), logprobs (R,). One group (the usual case) is one :func:`sample_next` call."""
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    if len(groups) == 1:
        return sample_next(logits, params[0], gen)
    tok = torch.empty(len(keys), dtype=torch.long, device=logits.device)
    lp = torch.empty(len(keys), dtype=torch.float32, device=logits.device)
    for idx in groups.values():
        sel = torch.tensor(idx, dtype=torch.long, device=logits.device)
        t, logp = sample_next(logits.index_select(0, sel), params[idx[0]], gen)
        tok[sel], lp[sel] = t, logp
    return tok, lp


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
