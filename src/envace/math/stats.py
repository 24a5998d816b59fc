"""Intervals and paired comparisons for success rates over tasks (pure functions, numpy only).

The unit of every interval is the **task**: the samples of one task are not independent (same prompt, same
environment), so they are averaged into one per-task value first.

- :func:`wilson_interval`: the 95% Wilson score interval of a rate. :func:`rate_interval` applies it over
  tasks: ``p = mean over tasks of the per-task mean success``, ``n = number of tasks``. With one sample per task
  that is the exact Wilson interval of a binomial; with K > 1 samples it is *conservative*: per-task means
  ``m_i`` in [0, 1] with mean ``p`` have variance ``E[m^2] - p^2 <= p - p^2 = p(1-p)``, the Bernoulli variance the
  Wilson interval assumes, so the interval is at least as wide as the normal-theory one (no seed, no resampling).
- :func:`seed_spread`: mean, sample std (ddof=1), min and max of one number per seed.
- :func:`paired_bootstrap`: the paired bootstrap 95% percentile interval of ``mean(b - a)`` over tasks:
  tasks are resampled with replacement (the same draw for both models), ``resamples`` times, seeded.
- p-values: :func:`mcnemar_exact` (two-sided exact McNemar: the binomial test of the discordant pairs at 1/2)
  when both models have one binary outcome per task; otherwise :func:`sign_flip_p`, the paired permutation
  test of the per-task mean differences (signs flipped at random; exact enumeration when at most
  :data:`EXACT_FLIPS` differences are non-zero). :func:`paired_comparison` picks between them by that rule and
  says which in ``p_method``.
- :func:`stratified_paired_bootstrap`: the same contrast with every stratum (e.g. a template's branch) weighted
  equally, tasks resampled within their stratum: a difference that a changed mix of strata cannot make.
- :func:`seed_cluster_bootstrap`: where the task is *not* the right unit. Outcomes of tasks of one template move
  together (a policy acts by template), and a trained model is one draw of its training seed: the pigeonhole
  bootstrap resamples seeds and task clusters (templates) at once, for a claim about a method rather than about
  the trained models at hand.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

import numpy as np

Z95 = 1.959963984540054
"""The 97.5% standard normal quantile (two-sided 95%)."""
RESAMPLES = 10_000
"""Default bootstrap / permutation resamples."""
EXACT_FLIPS = 12
"""sign_flip_p enumerates all 2^m sign patterns when m <= this many differences are non-zero."""
_CHUNK = 1_000  # resamples drawn at once (bounds memory at _CHUNK x n_tasks)


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of ``successes / n``. ``successes`` may be fractional (a sum of per-task means).
    ``n == 0`` -> (0, 1): no data, no information."""
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    # it contains p; rounding alone can put a bound a hair past it at p = 0 or 1 (3e-18 at 0 of 100)
    return min(p, max(0.0, center - half)), max(p, min(1.0, center + half))


def task_means(per_task: Sequence[Sequence[bool]]) -> np.ndarray:
    """Per-task mean success, one value per task; a task without samples is an error (it would be invisible)."""
    if any(len(s) == 0 for s in per_task):
        raise ValueError("every task needs at least one sample")
    return np.array([float(np.mean(np.asarray(s, dtype=float))) for s in per_task])


def rate_interval(per_task: Sequence[Sequence[bool]], z: float = Z95) -> tuple[float, float, float]:
    """(rate, low, high): the mean over tasks of per-task mean success, and its Wilson interval over tasks
    (module docstring). No task -> (0, 0, 1)."""
    m = task_means(per_task)
    if not len(m):
        return 0.0, 0.0, 1.0
    lo, hi = wilson_interval(float(m.sum()), len(m), z)
    return float(m.mean()), lo, hi


def seed_spread(values: Sequence[float]) -> dict[str, float]:
    """``{"n", "mean", "std", "min", "max"}`` of one value per seed (std with ddof=1; 0 for one seed; all nan
    but n for none)."""
    a = np.asarray(values, dtype=float)
    if not len(a):
        return {"n": 0.0, "mean": float("nan"), "std": float("nan"), "min": float("nan"), "max": float("nan")}
    return {
        "n": float(len(a)),
        "mean": float(a.mean()),
        "std": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
        "min": float(a.min()),
        "max": float(a.max()),
    }


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], resamples: int = RESAMPLES, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile interval of ``mean(b - a)`` under resampling tasks with replacement (paired: one index draw
    serves both). ``a`` and ``b`` are per-task values in the same task order."""
    if len(a) != len(b):
        raise ValueError(f"paired values need the same length, got {len(a)} and {len(b)}")
    d = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)  # (n,)
    n = len(d)
    if n == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = []
    for start in range(0, resamples, _CHUNK):
        idx = rng.integers(0, n, size=(min(_CHUNK, resamples - start), n))  # (r, n) task indices
        means.append(d[idx].mean(axis=1))  # (r,)
    ms = np.concatenate(means)
    alpha = (1 - level) / 2
    return float(np.quantile(ms, alpha)), float(np.quantile(ms, 1 - alpha))


def stratified_paired_bootstrap(
    strata: Sequence[Any],
    a: Sequence[float],
    b: Sequence[float],
    resamples: int = RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, Any]:
    """``b - a`` with every stratum weighted equally: ``diff`` = the mean over strata of each stratum's mean of the
    per-task differences, with the percentile interval of resampling tasks with replacement *within* their stratum
    (paired, as :func:`paired_bootstrap`), and ``a`` / ``b``: each side's stratum-balanced mean. ``strata[i]`` names
    task i's stratum. The plain mean weights a stratum by its number of tasks, so a split with more tasks of one
    stratum favours whatever does well there; this one does not. Like every interval here it treats the tasks of a
    stratum as independent: where a model's outcomes within a stratum move together (a policy that acts by
    template), the interval is narrow (zero where every difference within each stratum is the same) and says
    nothing of another draw of tasks or of another training seed. Returns ``{"diff", "diff_ci", "a", "b",
    "n_strata", "n_tasks"}`` (nan where there are no tasks)."""
    if not len(a) == len(b) == len(strata):
        raise ValueError(f"paired values need one stratum each, got {len(strata)}, {len(a)} and {len(b)}")
    nan = float("nan")
    if not len(a):
        return {"diff": nan, "diff_ci": (nan, nan), "a": nan, "b": nan, "n_strata": 0, "n_tasks": 0}
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    groups: dict[Any, list[int]] = {}
    for i, s in enumerate(strata):
        groups.setdefault(s, []).append(i)
    idx = [np.asarray(g) for g in groups.values()]
    d = y - x
    rng = np.random.default_rng(seed)
    boot = np.zeros(resamples)
    for g in idx:  # each stratum's resampled mean difference, averaged over strata with equal weight
        draws = rng.integers(0, len(g), size=(resamples, len(g)))  # (r, n_stratum)
        boot += d[g][draws].mean(axis=1) / len(idx)
    alpha = (1 - level) / 2
    return {
        "diff": float(np.mean([d[g].mean() for g in idx])),
        "diff_ci": (float(np.quantile(boot, alpha)), float(np.quantile(boot, 1 - alpha))),
        "a": float(np.mean([x[g].mean() for g in idx])),
        "b": float(np.mean([y[g].mean() for g in idx])),
        "n_strata": len(idx),
        "n_tasks": len(d),
    }


def seed_cluster_bootstrap(
    seeds: Sequence[Any],
    clusters: Sequence[Any],
    values: Sequence[float],
    resamples: int = RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, Any]:
    """The mean of per-(seed, task) ``values`` (e.g. a paired contrast B - A of one training seed's models on one
    task) with the percentile interval of the *pigeonhole bootstrap* (Owen 2007, "The pigeonhole bootstrap", Ann.
    Appl. Stat.): training seeds and task clusters are two crossed random factors, and each replicate draws seeds
    with replacement and clusters with replacement, independently; a (seed, cluster) block drawn ``k`` times by
    the one and ``l`` times by the other counts ``k * l`` times, and the replicate is the mean of the values so
    weighted (a ratio estimate: clusters of unequal size keep their size). ``values[i]`` is of seed ``seeds[i]``
    and cluster ``clusters[i]`` (a task's template; a task on its own where there are none).

    Unlike the bootstrap over tasks it sees what a claim about a *method* must survive: another training seed, and
    another draw of templates, whose tasks succeed or fail together. The interval is conservative for crossed
    random effects (Owen), and rough with few units: with ``m`` clusters a replicate is one of at most
    ``C(2m - 1, m)`` multisets, and the bootstrap's variance carries a factor ``(m - 1) / m`` per factor.
    One seed resamples clusters only. Fewer than 2 clusters: the interval is nan (no spread between clusters to
    resample). Returns ``{"mean", "ci", "n_seeds", "n_clusters", "n"}``."""
    if not len(seeds) == len(clusters) == len(values):
        raise ValueError(f"every value needs a seed and a cluster, got {len(seeds)}, {len(clusters)}, {len(values)}")
    nan = float("nan")
    s_of = {s: i for i, s in enumerate(dict.fromkeys(seeds))}
    c_of = {c: j for j, c in enumerate(dict.fromkeys(clusters))}
    out = {"mean": nan, "ci": (nan, nan), "n_seeds": len(s_of), "n_clusters": len(c_of), "n": len(values)}
    if not len(values):
        return out
    total = np.zeros((len(s_of), len(c_of)))  # (seeds, clusters): sum of the block's values
    count = np.zeros_like(total)  # its number of values
    for s, c, v in zip(seeds, clusters, values):
        total[s_of[s], c_of[c]] += float(v)
        count[s_of[s], c_of[c]] += 1
    out["mean"] = float(total.sum() / count.sum())
    if len(c_of) < 2:
        return out
    rng = np.random.default_rng(seed)
    ns, nc = total.shape
    w = rng.multinomial(ns, np.full(ns, 1 / ns), size=resamples).astype(float)  # (r, seeds): times each is drawn
    u = rng.multinomial(nc, np.full(nc, 1 / nc), size=resamples).astype(float)  # (r, clusters)
    num = ((w @ total) * u).sum(axis=1)  # (r,)
    den = ((w @ count) * u).sum(axis=1)
    reps = num[den > 0] / den[den > 0]  # a replicate of empty blocks only has no mean
    alpha = (1 - level) / 2
    out["ci"] = (float(np.quantile(reps, alpha)), float(np.quantile(reps, 1 - alpha)))
    return out


PERMUTATION_CELLS = 4_000_000
"""Values shuffled at once by :func:`unpaired_comparison` (resamples x observations per chunk, ~32 MB)."""


def unpaired_comparison(
    a: Sequence[float], b: Sequence[float], resamples: int = RESAMPLES, seed: int = 0, level: float = 0.95
) -> dict[str, Any]:
    """``mean(b) - mean(a)`` of two independent samples (e.g. scores of different observations):
    ``{"diff", "diff_ci", "p", "p_method", "n_a", "n_b"}`` with the percentile interval of resampling each sample
    on its own and a two-sided permutation p-value (labels shuffled, Monte Carlo ``(1 + hits) / (1 + resamples)``).
    An empty sample gives nan."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not len(x) or not len(y):
        nan = float("nan")
        return {"diff": nan, "diff_ci": (nan, nan), "p": nan, "p_method": "permutation", "n_a": len(x), "n_b": len(y)}
    rng = np.random.default_rng(seed)
    diff = float(y.mean() - x.mean())
    boot = y[rng.integers(0, len(y), size=(resamples, len(y)))].mean(axis=1) - x[
        rng.integers(0, len(x), size=(resamples, len(x)))
    ].mean(axis=1)  # (resamples,)
    alpha = (1 - level) / 2
    both = np.concatenate([x, y])
    hits = 0
    for start in range(0, resamples, chunk := max(1, PERMUTATION_CELLS // len(both))):  # bounded memory per chunk
        perm = rng.permuted(np.tile(both, (min(chunk, resamples - start), 1)), axis=1)
        gaps = np.abs(perm[:, len(x) :].mean(axis=1) - perm[:, : len(x)].mean(axis=1))
        hits += int((gaps >= abs(diff) - 1e-12 * max(1.0, abs(diff))).sum())
    return {
        "diff": diff,
        "diff_ci": (float(np.quantile(boot, alpha)), float(np.quantile(boot, 1 - alpha))),
        "p": (1 + hits) / (1 + resamples),
        "p_method": "permutation",
        "n_a": len(x),
        "n_b": len(y),
    }


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Two-sided exact McNemar p-value for paired binary outcomes: with ``n01`` tasks only b solves and ``n10``
    only a solves, ``p = min(1, 2 * P[X <= min(n01, n10)])`` for ``X ~ Binomial(n01 + n10, 1/2)``; 1 without
    discordant pairs."""
    if len(a) != len(b):
        raise ValueError(f"paired outcomes need the same length, got {len(a)} and {len(b)}")
    n01 = sum(1 for x, y in zip(a, b) if not x and y)
    n10 = sum(1 for x, y in zip(a, b) if x and not y)
    n = n01 + n10
    if n == 0:
        return 1.0
    k = min(n01, n10)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def sign_flip_p(a: Sequence[float], b: Sequence[float], resamples: int = RESAMPLES, seed: int = 0) -> float:
    """Two-sided paired permutation p-value of ``mean(b - a)``: under the null the sign of each task's difference
    is a coin flip. Exact over all 2^m patterns of the m non-zero differences when m <= EXACT_FLIPS, else
    Monte Carlo with ``(1 + hits) / (1 + resamples)``. No non-zero difference -> 1."""
    if len(a) != len(b):
        raise ValueError(f"paired values need the same length, got {len(a)} and {len(b)}")
    d = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)  # (n,)
    nz = d[d != 0]  # zero differences do not change under a flip
    if not len(nz):
        return 1.0
    obs = abs(nz.sum())
    tol = 1e-12 * max(1.0, obs)
    if len(nz) <= EXACT_FLIPS:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(nz))))  # (2^m, m)
        return float(np.mean(np.abs(signs @ nz) >= obs - tol))
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, resamples, _CHUNK):
        signs = rng.choice((1.0, -1.0), size=(min(_CHUNK, resamples - start), len(nz)))  # (r, m)
        hits += int(np.sum(np.abs(signs @ nz) >= obs - tol))
    return (1 + hits) / (1 + resamples)


def paired_comparison(
    a: Sequence[Sequence[bool]], b: Sequence[Sequence[bool]], resamples: int = RESAMPLES, seed: int = 0
) -> dict[str, Any]:
    """Compare model B with model A on the same tasks (``a[i]`` and ``b[i]``: the samples' successes on task i).

    Returns ``n_tasks``, ``a`` / ``b`` (rate, low, high as :func:`rate_interval`), ``diff`` (rate B - rate A, as
    a mean of per-task differences), ``diff_ci`` (:func:`paired_bootstrap`), ``p`` and ``p_method``
    ("mcnemar_exact" when every task has one sample in both, else "sign_flip")."""
    if len(a) != len(b):
        raise ValueError(f"paired comparison needs the same tasks, got {len(a)} and {len(b)}")
    ma, mb = task_means(a), task_means(b)
    binary = all(len(x) == 1 for x in a) and all(len(x) == 1 for x in b)
    if binary:
        p, method = mcnemar_exact([bool(x[0]) for x in a], [bool(x[0]) for x in b]), "mcnemar_exact"
    else:
        p, method = sign_flip_p(ma, mb, resamples, seed), "sign_flip"
    lo, hi = paired_bootstrap(ma, mb, resamples, seed)
    return {
        "n_tasks": len(a),
        "a": rate_interval(a),
        "b": rate_interval(b),
        "diff": float((mb - ma).mean()) if len(a) else float("nan"),
        "diff_ci": (lo, hi),
        "p": p,
        "p_method": method,
    }


def fmt_rate(rate: float, lo: float, hi: float, digits: int = 3) -> str:
    """``0.500 [0.237, 0.763]``."""
    return f"{rate:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def fmt_p(p: float) -> str:
    return "–" if p != p else (f"{p:.3g}" if p >= 1e-3 else f"{p:.1e}")


__all__ = [
    "Z95",
    "RESAMPLES",
    "EXACT_FLIPS",
    "wilson_interval",
    "task_means",
    "rate_interval",
    "seed_spread",
    "paired_bootstrap",
    "stratified_paired_bootstrap",
    "seed_cluster_bootstrap",
    "mcnemar_exact",
    "sign_flip_p",
    "paired_comparison",
    "unpaired_comparison",
    "fmt_rate",
    "fmt_p",
]
