"""The math of role-wise GRPO as small pure tensor functions (METHOD.md section 2).

Everything here takes tensors and plain numbers, never a config object, and returns ``(value, metrics)``
where ``metrics`` is a flat ``dict[str, float]`` with un-prefixed keys (the caller adds ``act/``,
``rehearse/``, ...). Shapes use ``rows`` for the rows of a batch (one row = one generation, see
:class:`envace.core.types.Row`), ``T`` for completion-token positions (right-padded) and ``V`` for the vocabulary.

Pieces:

- Group baselines / advantages over rows, registered in :data:`ADVANTAGES`:
  ``"rolewise"`` (the paper's setting: one row-weighted mean per (task group, role), ``A = R - mu``, no std
  division), ``"rolewise_std"``, ``"pooled"`` (one mean per task group over the rows of every role) and
  ``"pooled_std"``. Every estimator has the signature of :func:`rolewise_advantages`.
- :func:`informative_groups`: which groups carry a signal at all (DAPO's dynamic sampling drops the others).
- The PPO-clipped surrogate :func:`policy_loss` over all completion tokens of a batch, aggregated by an
  entry of :data:`AGGREGATIONS` (``"token_mean"``, the reference setting, or ``"seq_mean"``).
- :func:`rollout_correction`: truncated importance weights ``min(pi_old / pi_sampler, C)`` per token against the
  train-inference mismatch (a bf16 or vLLM sampler, a float32 trainer), passed to :func:`policy_loss` as
  ``is_weights``, and how far the two policies are apart.
- :func:`kl_k3`, the per-token low-variance estimator of KL(pi_theta || pi_ref), off by default in training.
- :func:`sft_loss` (negative log-likelihood) for the SFT warm-up and :func:`token_logprobs`.

Gradient accumulation. A mean over a batch is a *total* divided by a *count*. When a batch is split into
micro-batches, pass every micro-batch the count of the whole batch as ``normalizer`` (sum
:func:`loss_normalizer` over the micro-batches, or take :func:`rows_normalizer` of the whole batch's rows; across
data-parallel ranks, all-reduce it): the micro-batch losses then add up exactly to the full-batch loss, so their
gradients do too. The count is the aggregation's own (:attr:`Aggregation.count`), so a new aggregation brings
its divisor with it.

Departures from the paper / reference code, all documented where they happen:

- The std of the ``*_std`` estimators is the row-weighted *population* std (``ddof=0``) of a cell; a cell
  whose rows all share one reward (or that holds one row) gets advantage 0, never ``0 / 0``.
- The log-ratio ``logp - old_logp`` is clamped to [-20, 20] before ``exp`` (as verl does) so a stale or
  corrupt old log-prob cannot overflow; at such ratios the clip bound is active anyway for A > 0.
- Beyond the paper: where the sampler is not the trainer, pi_old is the trainer's recomputation and each token's
  loss is multiplied by the truncated weight of :func:`rollout_correction` (token-level TIS, as verl's rollout
  correction, TRL's ``vllm_importance_sampling_correction`` and SkyRL do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch
from torch import Tensor

from ..core.registry import Registry

LOG_RATIO_CLAMP = 20.0  # |logp - old_logp| (and |ref - logp|) is clamped to this before exp


# --------------------------------------------------------------------------------------------------------
# Group baselines and advantages
# --------------------------------------------------------------------------------------------------------


class AdvantageFn(Protocol):
    def __call__(
        self, rewards: Tensor, groups: Tensor, roles: Tensor, valid: Tensor | None = None, *, eps: float = 1e-6
    ) -> tuple[Tensor, dict[str, float]]: ...


ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def _check_rows(rewards: Tensor, groups: Tensor, roles: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor]:
    """Validate the (rows,) inputs; return rewards as float and ``valid`` as a bool tensor."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must have shape (rows,), got {tuple(rewards.shape)}")
    n = rewards.shape[0]
    for name, t in (("groups", groups), ("roles", roles), ("valid", valid)):
        if t is not None and tuple(t.shape) != (n,):
            raise ValueError(f"{name} must have shape ({n},) like rewards, got {tuple(t.shape)}")
    r = rewards if rewards.is_floating_point() else rewards.float()
    v = torch.ones(n, dtype=torch.bool, device=r.device) if valid is None else valid.to(torch.bool)
    return r, v


def cell_advantages(
    rewards: Tensor, cells: Tensor, valid: Tensor | None = None, *, scale_by_std: bool = False, eps: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """Advantages against the row-weighted mean reward of each baseline cell.

    Args:
        rewards: (rows,) float, the reward of the trajectory each row belongs to (any value on invalid rows,
            NaN included).
        cells: (rows,) or (rows, k) long, the baseline cell of each row (e.g. its task group, or the pair
            (group, role)); rows with equal ``cells`` share one baseline.
        valid: (rows,) bool; invalid rows (unscored trajectories) are left out of every statistic and get 0.
        scale_by_std: divide by the cell's row-weighted population std + ``eps``.

    Returns:
        adv (rows,) float, and metrics: ``adv_mean``, ``adv_abs_mean`` and ``adv_zero_frac`` (over valid
        rows; the zero fraction is the share of rows without learning signal), ``n_valid_rows``,
        ``n_invalid_rows``, ``n_cells`` (cells with at least one valid row).
    """
    if cells.dim() not in (1, 2) or cells.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"cells must have shape (rows,) or (rows, k) with rows={rewards.shape[0]}, got {tuple(cells.shape)}"
        )
    r, v = _check_rows(rewards, cells[:, 0] if cells.dim() == 2 else cells, None, valid)
    if r.numel() == 0:
        return r.clone(), {
            "adv_mean": 0.0,
            "adv_abs_mean": 0.0,
            "adv_zero_frac": 0.0,
            "n_valid_rows": 0.0,
            "n_invalid_rows": 0.0,
            "n_cells": 0.0,
        }
    _, cell = torch.unique(cells, dim=0, return_inverse=True)  # cell (rows,): compact cell index of each row
    n_cells = int(cell.max()) + 1
    w = v.to(r.dtype)  # (rows,) 1 for valid rows, 0 otherwise
    r0 = torch.where(v, r, torch.zeros_like(r))  # (rows,) invalid rewards (maybe NaN) never enter a sum
    count = torch.zeros(n_cells, dtype=r.dtype, device=r.device).index_add_(0, cell, w)  # (cells,)
    total = torch.zeros(n_cells, dtype=r.dtype, device=r.device).index_add_(0, cell, r0)  # (cells,)
    mu = total / count.clamp_min(1.0)  # (cells,) row-weighted mean reward of the cell
    adv = r0 - mu[cell]  # (rows,)
    if scale_by_std:
        sq = torch.zeros(n_cells, dtype=r.dtype, device=r.device).index_add_(0, cell, w * adv.square())  # (cells,)
        std = (sq / count.clamp_min(1.0)).sqrt()  # (cells,) population std (ddof=0)
        adv = adv / (std[cell] + eps)  # (rows,) a constant cell has adv 0 / eps = 0
    adv = torch.where(v, adv, torch.zeros_like(adv))  # (rows,) unscored rows carry no signal
    with torch.no_grad():
        n_valid = int(v.sum())
        av = adv[v]
        metrics = {
            "adv_mean": float(av.mean()) if n_valid else 0.0,
            "adv_abs_mean": float(av.abs().mean()) if n_valid else 0.0,
            "adv_zero_frac": float((av.abs() < 1e-8).float().mean()) if n_valid else 0.0,
            "n_valid_rows": float(n_valid),
            "n_invalid_rows": float(r.numel() - n_valid),
            "n_cells": float((count > 0).sum()),
        }
    return adv, metrics


@ADVANTAGES.register("rolewise")
def rolewise_advantages(
    rewards: Tensor, groups: Tensor, roles: Tensor, valid: Tensor | None = None, *, eps: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """Role-wise GRPO advantages (the paper's default): ``A = R - mu[group, role]``, no std division.

    ``mu[x, r]`` is the mean of ``R`` over the *rows* of role r in task group x, so a trajectory with more rows
    of that role weighs more.

    Args:
        rewards: (rows,) float, the trajectory reward of each row.
        groups: (rows,) long, the task-group index of each row.
        roles: (rows,) long, the role index of each row.
        valid: (rows,) bool or None (all valid); invalid rows are excluded from the means and get 0.
        eps: unused here (same signature as the std variants).

    Returns:
        adv (rows,), metrics (see :func:`cell_advantages`).
    """
    _check_rows(rewards, groups, roles, valid)
    return cell_advantages(
        rewards, torch.stack([groups.long(), roles.long()], dim=1), valid, scale_by_std=False, eps=eps
    )


@ADVANTAGES.register("rolewise_std")
def rolewise_std_advantages(
    rewards: Tensor, groups: Tensor, roles: Tensor, valid: Tensor | None = None, *, eps: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """``A = (R - mu[group, role]) / (std[group, role] + eps)``; std is the row-weighted population std."""
    _check_rows(rewards, groups, roles, valid)
    return cell_advantages(
        rewards, torch.stack([groups.long(), roles.long()], dim=1), valid, scale_by_std=True, eps=eps
    )


@ADVANTAGES.register("pooled")
def pooled_advantages(
    rewards: Tensor, groups: Tensor, roles: Tensor, valid: Tensor | None = None, *, eps: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """``A = R - mu[group]``: one row-weighted mean per task group over the rows of all roles (ablation)."""
    _check_rows(rewards, groups, roles, valid)
    return cell_advantages(rewards, groups, valid, scale_by_std=False, eps=eps)


@ADVANTAGES.register("pooled_std")
def pooled_std_advantages(
    rewards: Tensor, groups: Tensor, roles: Tensor, valid: Tensor | None = None, *, eps: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """``A = (R - mu[group]) / (std[group] + eps)`` over the rows of all roles of the group."""
    _check_rows(rewards, groups, roles, valid)
    return cell_advantages(rewards, groups, valid, scale_by_std=True, eps=eps)


def informative_groups(
    rewards: Tensor, groups: Tensor, valid: Tensor | None = None, *, tol: float = 0.0
) -> tuple[Tensor, dict[str, float]]:
    """Which GRPO groups carry a learning signal (DAPO's dynamic sampling, Yu et al. 2025): those whose scored
    trajectories do not all share one reward. Every row of a trajectory gets its reward and both roles' baselines
    are means of those rewards, so a group whose K rewards are equal has advantage 0 on every row of every role
    (rolewise and pooled alike); so has a group with fewer than two scored trajectories.

    Args:
        rewards: (trajs,) float, one reward per trajectory (any value where not ``valid``, NaN included).
        groups: (trajs,) long in [0, n_groups), the group of each trajectory.
        valid: (trajs,) bool or None (all scored); unscored trajectories are left out.
        tol: rewards closer than this count as equal.

    Returns:
        keep (n_groups,) bool, and metrics ``groups`` (n_groups), ``informative`` and ``degenerate`` counts.
    """
    r, v = _check_rows(rewards, groups, groups, valid)
    n_groups = int(groups.max()) + 1 if groups.numel() else 0
    g = groups.long()
    inf = torch.full((n_groups,), float("inf"), dtype=r.dtype, device=r.device)
    lo = inf.scatter_reduce(0, g[v], r[v], "amin")  # (groups,) lowest scored reward, +inf where none
    hi = (-inf).scatter_reduce(0, g[v], r[v], "amax")  # (groups,) highest scored reward, -inf where none
    keep = (hi - lo) > tol  # (groups,) False where all equal or fewer than two scored
    n_keep = int(keep.sum())
    return keep, {"groups": float(n_groups), "informative": float(n_keep), "degenerate": float(n_groups - n_keep)}


# --------------------------------------------------------------------------------------------------------
# Loss aggregation
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Aggregation:
    """A mean over a batch, written as ``total(values, mask) / count(mask)`` so that it can be split across
    micro-batches (pass the whole batch's count as the normalizer)."""

    total: Callable[[Tensor, Tensor], Tensor]
    """(rows, T) values, (rows, T) float mask -> () the sum to divide."""
    count: Callable[[Tensor], Tensor]
    """(rows, T) float mask -> () what this batch contributes to the divisor."""
    doc: str = ""


AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation")

AGGREGATIONS.add(
    "token_mean",
    Aggregation(
        total=lambda x, m: (x * m).sum(),
        count=lambda m: m.sum(),
        doc="mean over every unmasked token of the batch (reference setting): long rows weigh more",
    ),
)
AGGREGATIONS.add(
    "seq_mean",
    Aggregation(
        total=lambda x, m: ((x * m).sum(-1) / m.sum(-1).clamp_min(1.0)).sum(),  # sum over rows of row means
        count=lambda m: (m.sum(-1) > 0).to(m.dtype).sum(),  # rows with at least one token
        doc="mean over tokens within each row, then mean over the rows that have tokens",
    ),
)


def _float_mask(mask: Tensor, like: Tensor) -> Tensor:
    if tuple(mask.shape) != tuple(like.shape):
        raise ValueError(f"mask shape {tuple(mask.shape)} != values shape {tuple(like.shape)}")
    return mask.to(like.dtype)


def loss_normalizer(mask: Tensor, agg: str = "token_mean") -> float:
    """What this (micro-)batch contributes to the divisor of ``agg``: the number of unmasked tokens for
    ``token_mean``, the number of non-empty rows for ``seq_mean``. Sum it over the micro-batches of a batch
    and pass the sum as ``normalizer`` to every micro-batch's loss."""
    return float(AGGREGATIONS.get(agg).count(mask.float()))


def lengths_mask(lengths: Sequence[int]) -> Tensor:
    """(rows, max(lengths)) float mask of right-padded rows with ``lengths[i]`` loss tokens each."""
    n = torch.tensor(list(lengths), dtype=torch.long).reshape(-1)  # (rows,)
    width = int(n.max()) if n.numel() else 0
    return (torch.arange(width)[None, :] < n[:, None]).float()  # (rows, T)


def rows_normalizer(lengths: Sequence[int], agg: str = "token_mean") -> float:
    """:func:`loss_normalizer` of rows with these numbers of loss tokens (their right-padded mask): the divisor
    of a batch known before any of its micro-batches runs."""
    return loss_normalizer(lengths_mask(lengths), agg)


def aggregate(values: Tensor, mask: Tensor, agg: str = "token_mean", normalizer: float | None = None) -> Tensor:
    """Aggregate per-token values (rows, T) under mask (rows, T) into a scalar.

    ``normalizer=None`` divides by this batch's own count (at least 1); otherwise by ``normalizer``.
    """
    a = AGGREGATIONS.get(agg)
    m = _float_mask(mask, values)  # (rows, T)
    denom = a.count(m).clamp_min(1.0) if normalizer is None else normalizer
    if normalizer is not None and normalizer <= 0:
        raise ValueError(f"normalizer must be positive, got {normalizer}")
    return a.total(values, m) / denom


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over unmasked entries (0 when none)."""
    m = _float_mask(mask, values)
    return (values * m).sum() / m.sum().clamp_min(1.0)


# --------------------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------------------


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    agg: str = "token_mean",
    normalizer: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The PPO-clipped surrogate, to *minimise*: ``-w * min(rho * A, clip(rho, 1 - eps, 1 + eps_high) * A)``.

    Args:
        logp: (rows, T) log pi_theta of the completion tokens (with grad).
        old_logp: (rows, T) log pi_old of the same tokens (the sampling log-probs; no grad).
        adv: (rows,) the advantage of each row, broadcast over its tokens (no grad).
        mask: (rows, T) bool/float, 1 on completion tokens that enter the loss.
        clip_eps: lower clip range ``eps``; ``clip_eps_high`` the upper one (None: same as ``clip_eps``;
            a larger value is DAPO's "clip-higher").
        agg: a name in :data:`AGGREGATIONS`.
        normalizer: the divisor of the aggregation (see the module docstring); None: this batch's own.
        is_weights: (rows, T) ``w``, the rollout correction's truncated importance weights
            (:func:`rollout_correction`; used without grad); None: 1 on every token.

    Returns:
        loss (), and metrics over the unmasked tokens of this batch: ``clip_frac`` (share of tokens where
        the clip bound is the active term, i.e. without gradient), ``ratio_mean``, ``ratio_max``,
        ``approx_kl`` (k3 estimate of KL(pi_old || pi_theta) = E_old[(rho - 1) - log rho]), ``n_tokens``.
    """
    if logp.shape != old_logp.shape or logp.dim() != 2:
        raise ValueError(
            f"logp and old_logp must both be (rows, T), got {tuple(logp.shape)} and {tuple(old_logp.shape)}"
        )
    if tuple(adv.shape) != (logp.shape[0],):
        raise ValueError(f"adv must be ({logp.shape[0]},), got {tuple(adv.shape)}")
    if tuple(mask.shape) != tuple(logp.shape):
        raise ValueError(f"mask shape {tuple(mask.shape)} != logp shape {tuple(logp.shape)}")
    if is_weights is not None and tuple(is_weights.shape) != tuple(logp.shape):
        raise ValueError(f"is_weights shape {tuple(is_weights.shape)} != logp shape {tuple(logp.shape)}")
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    m = mask.to(torch.bool)  # (rows, T)
    log_ratio = torch.where(m, logp - old_logp.detach(), torch.zeros_like(logp))  # (rows, T) 0 on padding
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()  # (rows, T) rho
    a = adv.detach().to(logp.dtype).unsqueeze(-1)  # (rows, 1)
    unclipped = -a * ratio  # (rows, T)
    clipped = -a * ratio.clamp(1.0 - clip_eps, 1.0 + hi)  # (rows, T)
    per_token = torch.maximum(unclipped, clipped)  # (rows, T) pessimistic bound of the surrogate
    if is_weights is not None:
        per_token = per_token * is_weights.detach().to(logp.dtype)  # (rows, T) sampler -> trainer correction
    loss = aggregate(per_token, m, agg, normalizer)
    with torch.no_grad():
        mf = m.to(logp.dtype)
        n_tok = float(mf.sum())
        metrics = {
            "clip_frac": float(masked_mean((clipped > unclipped).to(logp.dtype), mf)),
            "ratio_mean": float(masked_mean(ratio, mf)),
            "ratio_max": float(ratio[m].max()) if n_tok else 0.0,
            "approx_kl": float(masked_mean((ratio - 1.0) - log_ratio, mf)),
            "n_tokens": n_tok,
        }
    return loss, metrics


def rollout_correction(
    old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float
) -> tuple[Tensor, dict[str, float]]:
    """Token-level truncated importance sampling (TIS) against the train-inference mismatch.

    The tokens were sampled from the rollout engine's policy (bf16, vLLM's kernels), not from pi_old as the
    trainer computes it (float32); ``w = min(pi_old / pi_sampler, cap)`` per token re-weights each token's
    policy-gradient loss towards pi_old (pass it to :func:`policy_loss` as ``is_weights``). Truncating bounds
    the variance at a small bias (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy
    RL training"; verl's ``rollout_is_threshold`` defaults to 2).

    Args:
        old_logp: (rows, T) log pi_old, the trainer's recomputation (no grad).
        sampler_logp: (rows, T) the sampler's own log-probs of the same tokens.
        mask: (rows, T) bool/float, 1 on completion tokens.
        cap: C >= 1, the largest weight (``math.inf``: no truncation).

    Returns:
        w (rows, T) without grad (1 on padding), and metrics over the unmasked tokens: ``kl`` (k3 estimate of
        KL(pi_sampler || pi_old) = E_sampler[(r - 1) - log r], r = pi_old / pi_sampler), ``clipped_share``
        (share of tokens with r > cap), ``ratio_mean`` and ``ratio_max`` of r before truncation, ``n_tokens``.
    """
    if old_logp.shape != sampler_logp.shape or tuple(mask.shape) != tuple(old_logp.shape) or old_logp.dim() != 2:
        raise ValueError(
            "old_logp, sampler_logp and mask must all be (rows, T), got "
            f"{tuple(old_logp.shape)}, {tuple(sampler_logp.shape)} and {tuple(mask.shape)}"
        )
    if not cap >= 1.0:
        raise ValueError(f"cap must be >= 1, got {cap}")
    with torch.no_grad():
        m = mask.to(torch.bool)  # (rows, T)
        log_r = torch.where(m, old_logp - sampler_logp, torch.zeros_like(old_logp))  # (rows, T) 0 on padding
        log_r = log_r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        r = log_r.exp()  # (rows, T) pi_old / pi_sampler
        w = r.clamp(max=cap)  # (rows, T)
        mf = m.to(r.dtype)
        n_tok = float(mf.sum())
        metrics = {
            "kl": float(masked_mean((r - 1.0) - log_r, mf)),
            "clipped_share": float(masked_mean((r > cap).to(r.dtype), mf)),
            "ratio_mean": float(masked_mean(r, mf)),
            "ratio_max": float(r[m].max()) if n_tok else 0.0,
            "n_tokens": n_tok,
        }
    return w, metrics


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_ref) on tokens sampled from pi_theta (Schulman, 2020):
    ``exp(ref - logp) - (ref - logp) - 1`` >= 0, unbiased and low-variance.

    Args:
        logp: (rows, T) log pi_theta (with grad); ref_logp: (rows, T) log pi_ref (frozen, no grad).

    Returns:
        (rows, T); aggregate it with :func:`aggregate` under the loss mask and add ``coef *`` it to the loss.
    """
    d = (ref_logp.detach() - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (rows, T)
    return d.exp() - d - 1.0


def sft_loss(
    logp: Tensor, mask: Tensor, agg: str = "token_mean", normalizer: float | None = None
) -> tuple[Tensor, dict[str, float]]:
    """Negative log-likelihood of the target tokens (SFT warm-up).

    Args:
        logp: (rows, T) log-probs of the target tokens (with grad); mask: (rows, T) 1 on tokens to learn.
        agg, normalizer: as in :func:`policy_loss`.

    Returns:
        loss (), metrics ``nll`` (token mean over this batch) and ``n_tokens``.
    """
    nll = -logp  # (rows, T)
    loss = aggregate(nll, mask, agg, normalizer)
    with torch.no_grad():
        metrics = {"nll": float(masked_mean(nll, mask)), "n_tokens": float(mask.to(logp.dtype).sum())}
    return loss, metrics


def token_logprobs(logits: Tensor, targets: Tensor, chunk_rows: int = 1) -> Tensor:
    """``log_softmax(logits)[targets]`` without materialising the (rows, T, V) log-softmax at once.

    Works ``chunk_rows`` rows at a time in float32 (``gather - logsumexp``), so the extra memory is one
    chunk's (chunk_rows, T, V) float32 copy instead of the whole batch's.

    Args:
        logits: (rows, T, V) the logits that predict ``targets`` (already shifted by the caller).
        targets: (rows, T) long token ids; negative ids (e.g. an ignore index of -100) are read as 0 and
            give a meaningless value that the caller must mask out.

    Returns:
        (rows, T) float32 log-probs.
    """
    if logits.dim() != 3 or tuple(targets.shape) != tuple(logits.shape[:2]):
        raise ValueError(
            f"need logits (rows, T, V) and targets (rows, T); got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    out = []
    for lg, tg in zip(logits.split(chunk_rows), targets.split(chunk_rows)):
        lg = lg.float()  # (c, T, V) upcast (no copy when already float32)
        picked = lg.gather(-1, tg.clamp_min(0).unsqueeze(-1)).squeeze(-1)  # (c, T)
        out.append(picked - torch.logsumexp(lg, dim=-1))  # (c, T)
    if not out:
        return logits.new_zeros(targets.shape, dtype=torch.float32)
    return torch.cat(out, dim=0)
