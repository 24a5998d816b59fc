"""From rows to log-probs with gradient: packing, micro-batching and the forward pass.

Rows of one context (the Act chat of a trajectory, or its Rehearse context) are prefixes of each other: the
prompt of step t+1 is the prompt of step t, its completion, and what came back. Such a chain is *packed* into
one sequence and run through the model once; each row's completion log-probs are read off at its own positions.
A row that does not extend the chain starts a new one (Act with ``RolloutConfig.thinking_history`` ``strip``: a
user turn's first prompt, the earlier thinking dropped), so every row is trained on its own prompt.
This is exact for a causal model and removes both the re-encoding of shared prefixes and most padding.
Logits are computed only at completion positions (the LM head is applied to the selected hidden states).

Packs of different contexts that start alike (the K trajectories of a task share the system prompt, the tool
schemas and the first user turn) are put in the same micro-batch, and their common prefix is run once: its
keys/values (with grad) are expanded over the micro-batch and the packs only run their own suffixes. This is
exact too (the gradient of the shared prefix is the sum over packs, as without sharing).

Over several processes (:mod:`envace.training.distributed`) :func:`optimizer_step` divides by the normalizer of the
whole batch (all-reduced), runs as many micro-batches on every process (padding with idle ones) and synchronises
gradients once; with ``dist`` left out it is the single-process step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from ..math.algos import rows_normalizer
from .distributed import Dist, each_micro_batch
from ..math.prefixes import common_prefix, prefix_runs
from ..core.types import Row

ONE_PROCESS = Dist()


@dataclass
class Pack:
    ids: list[int]
    segments: list[tuple[int, int, int]] = field(default_factory=list)  # (row index, start, end) of completion tokens


def pack_rows(rows: list[Row]) -> list[Pack]:
    """Chain rows whose token sequence extends the previous row's (same trajectory and role) into packs. A row
    without completion tokens has no log-prob to compute and joins no pack (it adds nothing to any loss)."""
    by_ctx: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(rows):
        if r.completion_ids:
            by_ctx.setdefault((r.traj_id, r.role), []).append(i)
    packs: list[Pack] = []
    for idxs in by_ctx.values():
        idxs.sort(key=lambda i: (rows[i].step, len(rows[i].prompt_ids)))
        cur: Pack | None = None
        for i in idxs:
            r = rows[i]
            full = r.prompt_ids + r.completion_ids
            if cur is not None and len(r.prompt_ids) >= len(cur.ids) and r.prompt_ids[: len(cur.ids)] == cur.ids:
                cur.ids = full
            else:
                cur = Pack(ids=list(full))
                packs.append(cur)
            cur.segments.append((i, len(r.prompt_ids), len(full)))
    return packs


MIN_SHARED_PREFIX = 32
"""Shortest common prefix (tokens) worth running once for a micro-batch of packs."""


def shared_prefix_len(packs: list[Pack]) -> int:
    """Tokens all packs start with, up to the first position whose logits are needed (no completion inside)."""
    if len(packs) < 2:
        return 0
    first = packs[0].ids
    n = min(min(s for (_, s, _) in p.segments) - 1 for p in packs)  # logits at s-1 are read: keep them out
    for p in packs[1:]:
        n = common_prefix(p.ids, first, n)
    return max(n, 0)


def _prefix_clusters(packs: list[Pack], min_prefix: int) -> list[list[Pack]]:
    """Packs grouped by common prefix (:func:`envace.math.prefixes.prefix_runs`); packs in no group come alone."""
    order = sorted(packs, key=lambda p: p.ids)
    adjacent = [shared_prefix_len([a, b]) for a, b in zip(order, order[1:])]
    clusters: list[list[Pack]] = []
    done = 0
    for first, end, _ in prefix_runs(adjacent, min_prefix):
        clusters += [[p] for p in order[done:first]] + [order[first:end]]
        done = end
    return clusters + [[p] for p in order[done:]]


def _fill(packs: list[Pack], max_tokens: int, shared: bool) -> list[list[Pack]]:
    """Longest first; a micro-batch's cost is the tokens it runs: its shared prefix once plus n padded suffixes."""
    out: list[list[Pack]] = []
    cur: list[Pack] = []
    for p in sorted(packs, key=lambda p: -len(p.ids)):
        cand = cur + [p]
        lp = shared_prefix_len(cand) if (shared and len(cand) > 1) else 0
        if cur and lp + len(cand) * (len(cand[0].ids) - lp) > max_tokens:
            out.append(cur)
            cand = [p]
        cur = cand
    if cur:
        out.append(cur)
    return out


def micro_batches(
    packs: list[Pack], max_tokens: int, share_prefixes: bool = True, min_prefix: int = MIN_SHARED_PREFIX
) -> list[list[Pack]]:
    """Group packs so each micro-batch runs at most ``max_tokens`` tokens (padded ``n * max_len``, less the
    shared prefix counted once when ``share_prefixes``). With ``share_prefixes`` packs with a common prefix of at
    least ``min_prefix`` tokens go together (longest first within a group); the others are grouped longest first."""
    if not share_prefixes:
        return _fill(packs, max_tokens, shared=False)
    out: list[list[Pack]] = []
    alone: list[Pack] = []
    for cl in _prefix_clusters(packs, min_prefix):
        if len(cl) < 2:
            alone += cl
        else:
            out += _fill(cl, max_tokens, shared=True)
    return out + _fill(alone, max_tokens, shared=False)


def _trunk_and_head(model: Any) -> tuple[Any, Any] | None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    trunk = getattr(base, "model", None)
    if head is None or trunk is None:
        return None
    return trunk, head


def completion_logprobs(
    model: Any,
    packs: list[Pack],
    rows: list[Row],
    temperatures: dict[str, float],
    bf16: bool = False,
    direct_head: bool = True,
    share_prefix: bool = True,
) -> dict[int, torch.Tensor]:
    """Log-probs (with grad) of each row's completion tokens under ``model``: row index -> (n_completion,).

    ``temperatures[role]`` divides the logits, matching how the rows were sampled. ``direct_head=False`` (a
    DDP/FSDP-wrapped model, whose forward is what synchronises it) calls the model whole and passes the needed
    positions as ``logits_to_keep`` instead of running its trunk and LM head separately. ``share_prefix``: run
    the packs' common prefix once (at least MIN_SHARED_PREFIX tokens; direct_head only). No packs: {} (no
    forward); a row whose segment is empty gets an empty tensor.
    """
    if not packs:
        return {}
    dev = next(model.parameters()).device
    S = max(len(p.ids) for p in packs)
    pad = 0
    ids = torch.full((len(packs), S), pad, dtype=torch.long, device=dev)
    for b, p in enumerate(packs):
        ids[b, : len(p.ids)] = torch.tensor(p.ids, dtype=torch.long)
    # positions whose logits predict a completion token: for tokens [start, end) read logits at [start-1, end-1)
    sel_b, sel_t, tgt, owner = [], [], [], []
    for b, p in enumerate(packs):
        for i, s, e in p.segments:
            sel_b += [b] * (e - s)
            sel_t += list(range(s - 1, e - 1))
            tgt += p.ids[s:e]
            owner.append((i, e - s, temperatures.get(rows[i].role, 1.0)))
    sb = torch.tensor(sel_b, dtype=torch.long, device=dev)  # (N,) long even when N == 0
    st = torch.tensor(sel_t, dtype=torch.long, device=dev)
    tg = torch.tensor(tgt, dtype=torch.long, device=dev)
    ctx = (
        torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
        if bf16
        else torch.autocast(device_type=dev.type, enabled=False)
    )
    with ctx:
        th = _trunk_and_head(model) if direct_head else None
        if th is not None:
            trunk, head = th
            lp = shared_prefix_len(packs) if share_prefix else 0
            if lp >= MIN_SHARED_PREFIX:
                hidden = _shared_prefix_hidden(trunk, ids, lp)  # (P, S - lp, H)
                logits = head(hidden[sb, st - lp])
            else:
                # right padding only: under the causal mask no real token attends to a pad, so no padding mask is
                # passed and attention can take the fused causal kernel (no (S, S) score matrix kept per layer)
                hidden = trunk(input_ids=ids, use_cache=False).last_hidden_state  # (P, S, H)
                logits = head(hidden[sb, st])  # (N, V) only where needed
        elif direct_head:
            logits = model(input_ids=ids, use_cache=False).logits[sb, st]
        else:
            # a 1-D tensor of sequence positions is the form of logits_to_keep every transformers 5.x reads (a (P, S)
            # mask is not: 5.19 indexes hidden_states[:, mask, :] and fails)
            cols = torch.unique(st)  # (C,) sorted positions whose logits some row needs
            logits = model(input_ids=ids, use_cache=False, logits_to_keep=cols).logits  # (P, C, V)
            logits = logits[sb, torch.searchsorted(cols, st)]  # (N, V)
    logits = logits.float()
    temps = torch.cat([torch.full((n,), t, device=dev) for (_, n, t) in owner]) if owner else torch.ones(0, device=dev)
    logits = logits / temps[:, None]
    lp = logits.gather(-1, tg[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # (N,)
    out: dict[int, torch.Tensor] = {}
    off = 0
    for i, n, _ in owner:
        out[i] = lp[off : off + n]
        off += n
    return out


def _shared_prefix_hidden(trunk: Any, ids: torch.Tensor, lp: int) -> torch.Tensor:
    """Hidden states of positions [lp, S) of every pack, the common prefix ids[:, :lp] run once.

    The prefix's keys/values (with grad) are expanded over the packs (a view) and the suffixes attend to them as
    a KV cache; positions continue at lp. ids: (P, S) -> (P, S - lp, H).
    """
    from transformers import DynamicCache

    P, S = ids.shape
    pre = trunk(input_ids=ids[:1, :lp], use_cache=True).past_key_values
    kv = [(layer.keys.expand(P, -1, -1, -1), layer.values.expand(P, -1, -1, -1)) for layer in pre.layers]
    pos = torch.arange(lp, S, device=ids.device)[None].expand(P, -1)
    return trunk(
        input_ids=ids[:, lp:], position_ids=pos, past_key_values=DynamicCache(kv), use_cache=True
    ).last_hidden_state


def pad_rows(values: Iterable[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D tensors (keeping their graph) into (rows, T), with a bool mask of the real entries."""
    vals = list(values)
    out = torch.nn.utils.rnn.pad_sequence(vals, batch_first=True)  # (rows, T)
    lens = torch.tensor([v.shape[0] for v in vals], device=out.device)
    mask = torch.arange(out.shape[1], device=out.device)[None, :] < lens[:, None]  # (rows, T)
    return out, mask


LossFn = Any  # (logp (rows,T), mask (rows,T), row_indices list[int], normalizer float) -> (loss, metrics)


def optimizer_step(
    model: Any,
    optimizer: Any,
    rows: list[Row],
    loss_fn: LossFn,
    *,
    agg: str,
    micro_batch_tokens: int,
    temperatures: dict[str, float],
    max_grad_norm: float,
    bf16: bool = False,
    dist: Dist = ONE_PROCESS,
    share_prefixes: bool = True,
) -> dict[str, float]:
    """One optimizer step over ``rows``: packed micro-batches, gradient accumulation, clipping, step.

    The loss of every micro-batch is divided by the whole batch's normalizer (:func:`envace.math.algos.rows_normalizer`:
    the count that the aggregation ``agg`` of :data:`envace.math.algos.AGGREGATIONS` declares, e.g. completion tokens
    for token_mean, non-empty rows for seq_mean; summed over processes), so the accumulated gradient is the
    full-batch one. Every process must call it (with its own rows, maybe none, maybe without completion
    tokens: those join no micro-batch); when no process has a completion token it updates nothing and returns
    ``{"micro_batches": 0.0}``. ``share_prefixes``: run the common prefix of a micro-batch's packs once (exact; needs
    the trunk, so only where ``dist.direct_head``, and a KV cache, so not under gradient checkpointing).
    """
    share_prefixes = share_prefixes and dist.direct_head and not getattr(model, "is_gradient_checkpointing", False)
    local = rows_normalizer([len(r.completion_ids) for r in rows], agg)
    normalizer = dist.sum(local)
    if normalizer == 0:  # nothing to learn from anywhere: no step (the optimizer's state stays as it was)
        return {"micro_batches": 0.0}
    model.train()
    optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {}
    for mb, sync in each_micro_batch(
        micro_batches(pack_rows(rows), micro_batch_tokens, share_prefixes=share_prefixes), dist
    ):
        with contextlib.nullcontext() if sync else dist.no_sync(model):  # gradients are synchronised once, at the end
            if mb is None:  # this process has no rows left: an idle forward keeps the collectives in step
                loss, m = _idle_loss(model), {}
            else:
                lp = completion_logprobs(
                    model, mb, rows, temperatures, bf16=bf16, direct_head=dist.direct_head, share_prefix=share_prefixes
                )
                idxs = sorted(lp)
                logp, mask = pad_rows([lp[i] for i in idxs])
                loss, m = loss_fn(logp, mask, idxs, normalizer)
                sums["micro_batches"] = sums.get("micro_batches", 0.0) + 1.0
            dist.backward(loss * dist.grad_scale)
        for k, v in m.items():
            if k.endswith("_max"):
                sums[k] = max(sums.get(k, float("-inf")), float(v))
            else:
                sums[k] = sums.get(k, 0.0) + float(v) * (float(m.get("n_tokens", 1.0)) if k != "n_tokens" else 1.0)
    sums = dist.merge_metrics(sums)
    n_tok = sums.get("n_tokens", 0.0) or 1.0
    metrics = {
        k: (v / n_tok if (k not in ("n_tokens", "micro_batches") and not k.endswith("_max")) else v)
        for k, v in sums.items()
    }
    gn = dist.clip_grad_norm_(model, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    metrics["grad_norm"] = float(gn)
    metrics["micro_batches"] = float(sums.get("micro_batches", 0.0))
    return metrics


@torch.no_grad()
def recompute_old_logprobs(
    model: Any,
    rows: list[Row],
    *,
    micro_batch_tokens: int,
    temperatures: dict[str, float],
    bf16: bool = False,
    dist: Dist = ONE_PROCESS,
) -> None:
    """Replace each row's ``old_logprobs`` (the sampler's) by the trainer model's own, before the update.

    For rollout engines whose log-probs are not the trainer's quantity (vLLM returns raw, untempered log-probs by
    default, from other kernels): the PPO ratio then starts at 1 up to kernel noise. Every process must call it.
    """
    for mb, _ in each_micro_batch(
        micro_batches(pack_rows(rows), micro_batch_tokens, share_prefixes=dist.direct_head), dist
    ):
        if mb is None:
            _idle_loss(model)
            continue
        for i, lp in completion_logprobs(
            model, mb, rows, temperatures, bf16=bf16, direct_head=dist.direct_head
        ).items():
            rows[i].old_logprobs = lp.float().tolist()


def _idle_loss(model: Any) -> torch.Tensor:
    """A one-token forward whose loss is 0 but reaches every parameter (DDP expects a gradient for each)."""
    dev = next(model.parameters()).device
    out = model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=dev), use_cache=False, logits_to_keep=1)
    return out.logits.float().sum() * 0.0
