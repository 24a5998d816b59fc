"""The paper's claims as contrasts of an experiment's evaluations, each with its paired difference, 95% interval
over tasks, 95% interval over training seeds and task templates (the one the verdict reads) and verdict: the first
table of the experiment's report (envace.evaluation.report).

:func:`paper_claims` lists them (the test-time ones at a budget N, :func:`claim_n`), :func:`measure_claim` measures
one on the per-task outcomes of ``results.json`` (envace.evaluation.results), :func:`claim_verdict` reads its
interval and :func:`claims_table` gives the table's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..math.stats import (
    fmt_p,
    paired_bootstrap,
    paired_comparison,
    seed_cluster_bootstrap,
    sign_flip_p,
    unpaired_comparison,
)
from .results import budget_keys, budget_label, eval_entry, per_task_outcomes, task_clusters

Term = tuple[int, str, int, str]
"""(coefficient, arm, N, mode) of a claim's per-task contrast: the task's mean success in that evaluation."""

VERDICTS = ("holds", "does not hold", "cannot tell at this scale", "not measured")

SEEDS_CLUSTERS_CI = "95% CI, seeds × templates"
"""The claims table's column of :func:`seeds_clusters_interval`, the interval its verdicts read."""


@dataclass(frozen=True)
class Claim:
    """A claim of the paper as a contrast of evaluations: ``sum(coef * success(arm, N, mode))`` per task, claimed
    to be > 0 (``>``) or >= 0 (``>=``)."""

    text: str
    paper: str
    """What the paper (or METHOD.md) reports for it."""
    direction: str
    terms: tuple[Term, ...]


def paper_claims(n: int) -> list[Claim]:
    """The claims of the report's table; the test-time ones at budget ``n``."""
    e0 = (1, "envace", 0, "none")
    vs = lambda arm: (-1, arm, 0, "none")  # noqa: E731
    gain = lambda arm, mode, sign=1: ((sign, arm, n, mode), (-sign, arm, 0, "none"))  # noqa: E731
    return [
        Claim("EnvACE > SFT", "RL on rehearsal improves on its SFT start", ">", (e0, vs("sft"))),
        Claim("EnvACE ≥ real-env GRPO", "tau2: 36.7 vs 31.2", ">=", (e0, vs("real_env"))),
        Claim("shared weights ≥ per-role", "tau2: 36.7 vs 35.5", ">=", (e0, vs("per_role"))),
        Claim("EnvACE > external simulator", "overall: 32.91 vs 20.03 (Simulator-8B)", ">", (e0, vs("simulator"))),
        Claim(
            "EnvACE > SFT continued (compute-matched)",
            "not reported (METHOD.md section 6 asks for it)",
            ">",
            (e0, vs("sft_more")),
        ),
        Claim(
            "training Rehearse helps: EnvACE > caller-only",
            "ablation: Rehearse not trained",
            ">",
            (e0, vs("caller_only")),
        ),
        Claim(
            f"test-time rehearsal helps EnvACE (N={n} parallel > N=0)",
            "+4.2 (N=2 parallel)",
            ">",
            gain("envace", "parallel"),
        ),
        Claim(
            f"TTS gain EnvACE > base (N={n} parallel)",
            "+4.2 vs ~0",
            ">",
            gain("envace", "parallel") + gain("base", "parallel", -1),
        ),
        Claim(
            f"TTS gain EnvACE > base (N={n} sequential)",
            "+2.4 vs −1.8",
            ">",
            gain("envace", "sequential") + gain("base", "sequential", -1),
        ),
        Claim(
            f"rehearsal > compute-matched plans (EnvACE, N={n} parallel vs plan)",
            "not reported (METHOD.md section 6 asks for it)",
            ">",
            ((1, "envace", n, "parallel"), (-1, "envace", n, "plan")),
        ),
    ]


def claim_verdict(lo: float, hi: float, direction: str = ">") -> str:
    """The verdict of a claimed difference from its paired 95% interval [lo, hi]: ``holds`` when the interval
    excludes 0 in the claimed direction (lo > 0), ``does not hold`` when it excludes 0 in the other direction
    (hi < 0), else ``cannot tell at this scale``; ``not measured`` without an interval (nan). A ``>=`` claim
    has no non-inferiority margin here, so the same rule applies: an interval that reaches below 0 cannot rule
    out "worse", one wholly below 0 refutes it."""
    if direction not in (">", ">="):
        raise ValueError(f"a claim's direction is '>' or '>=', got {direction!r}")
    if lo != lo or hi != hi:
        return "not measured"
    if lo > 0:
        return "holds"
    if hi < 0:
        return "does not hold"
    return "cannot tell at this scale"


def measure_claim(
    results: dict[str, Any], claim: Claim, resamples: int = 10_000, seed: int = 0
) -> dict[str, Any] | None:
    """The claim's contrast over the tasks every term was evaluated on (per-task outcomes pooled over the seeds
    in which every term was evaluated: a test-time sweep of fewer seeds pairs its N=0 term with those seeds only):
    ``diff`` (mean over tasks), ``ci95`` (paired bootstrap over tasks), ``p`` and ``p_method``, ``n_tasks``, ``seeds``;
    None when some evaluation is missing. Two terms (B - A) are exactly
    :func:`envace.math.stats.paired_comparison` (exact McNemar with one binary outcome per task); more (a difference
    of gains) resample the per-task contrast, with a sign-flip p-value."""
    arms = {a for _, a, _, _ in claim.terms}
    if not arms <= set(results["arms"]):
        return None
    common = sorted(set.intersection(*(set(results["runs"].get(a, {})) for a in arms)), key=int)
    seeds = [
        s for s in common if all(eval_entry(results["runs"][a][s], n, m) is not None for _, a, n, m in claim.terms)
    ]  # paired seed by seed
    rows = [per_task_outcomes(results, a, n, m, seeds) for _, a, n, m in claim.terms]
    if not seeds or not all(rows):
        return None
    by_id = [{r["task_id"]: r["successes"] for r in rs} for rs in rows]
    ids = [t for t in by_id[0] if all(t in d for d in by_id[1:])]
    if not ids:
        return None
    coefs = [c for c, _, _, _ in claim.terms]
    if coefs == [1, -1]:
        c = paired_comparison([by_id[1][t] for t in ids], [by_id[0][t] for t in ids], resamples, seed)
        diff, ci, p, method = c["diff"], c["diff_ci"], c["p"], c["p_method"]
    else:
        v = np.array([sum(k * float(np.mean(d[t])) for k, d in zip(coefs, by_id)) for t in ids])  # (tasks,)
        zero = np.zeros_like(v)
        diff, ci, p, method = (
            float(v.mean()),
            paired_bootstrap(zero, v, resamples, seed),
            sign_flip_p(zero, v, resamples, seed),
            "sign_flip",
        )
    return {
        "diff": diff,
        "ci95": [float(ci[0]), float(ci[1])],
        "p": p,
        "p_method": method,
        "n_tasks": len(ids),
        "seeds": seeds,
    } | seeds_clusters_interval(results, claim, seeds, ids, resamples, seed)


def seeds_clusters_interval(
    results: dict[str, Any], claim: Claim, seeds: list[str], ids: list[str], resamples: int = 10_000, seed: int = 0
) -> dict[str, Any]:
    """The claim's interval for a claim about a *method*: its contrast per (seed, task), resampled by seed and by
    task cluster at once (:func:`envace.math.stats.seed_cluster_bootstrap`; clusters: the tasks' templates where
    they have two or more, else the tasks, :func:`envace.evaluation.results.task_clusters`). The bootstrap over
    tasks holds the trained models fixed and takes tasks as independent; where a policy acts by template and a
    seed's models differ from another's, it is far narrower than what another seed and another draw of tasks
    would show (docs/results/decide-val: "holds" on val, the opposite sign on test). ``ci95_seeds_clusters``,
    ``cluster`` ("templates" / "tasks"), ``n_clusters``, and what the interval is made of: ``per_seed`` (seed ->
    the mean contrast of that seed's models) and ``cluster_signs`` (clusters whose mean contrast over the seeds is
    above, below and at 0)."""
    coefs = [c for c, _, _, _ in claim.terms]
    rows = {
        s: [{r["task_id"]: r for r in per_task_outcomes(results, a, n, m, [s])} for _, a, n, m in claim.terms]
        for s in seeds
    }
    any_row = {t: r for s in seeds for d in rows[s] for t, r in d.items()}
    kind, names = task_clusters([any_row[t] for t in ids])
    cluster_of = dict(zip(ids, names))
    labels, clusters, values = [], [], []
    for s in seeds:
        for t in ids:
            if all(t in d for d in rows[s]):  # evaluated on this task by every term at this seed
                labels.append(s)
                clusters.append(cluster_of[t])
                values.append(sum(k * float(np.mean(d[t]["successes"])) for k, d in zip(coefs, rows[s])))
    b = seed_cluster_bootstrap(labels, clusters, values, resamples, seed)
    by_cluster: dict[str, list[float]] = {}
    for c, v in zip(clusters, values):
        by_cluster.setdefault(c, []).append(v)
    means = [float(np.mean(v)) for v in by_cluster.values()]
    return {
        "ci95_seeds_clusters": [float(b["ci"][0]), float(b["ci"][1])],
        "cluster": kind,
        "n_clusters": b["n_clusters"],
        "per_seed": {s: float(np.mean([v for x, v in zip(labels, values) if x == s])) for s in dict.fromkeys(labels)},
        "cluster_signs": [sum(m > 0 for m in means), sum(m < 0 for m in means), sum(m == 0 for m in means)],
    }


@dataclass(frozen=True)
class FidelityClaim:
    """A claim about Rehearse fidelity on the experiment's fixed shadow set: ``metric`` of the observations
    rehearsed at ``b`` minus at ``a``, each ``(arm, point)`` with point ``start`` (the SFT model, the curve's first
    point) or ``final``; claimed > 0. The two samples are different observations (each model rolls out its own
    calls), so the interval is unpaired (envace.math.stats.unpaired_comparison)."""

    text: str
    paper: str
    a: tuple[str, str]
    b: tuple[str, str]
    metric: str = "leaf_acc"
    direction: str = ">"


FIDELITY_CLAIMS: tuple[FidelityClaim, ...] = (
    FidelityClaim(
        "Rehearse fidelity rises with EnvACE training (final > start)",
        "the premise: Rehearse learns the world as it is trained",
        ("envace", "start"),
        ("envace", "final"),
    ),
    FidelityClaim(
        "training Rehearse raises fidelity: EnvACE > caller-only (final)",
        "ablation: Rehearse not trained",
        ("caller_only", "final"),
        ("envace", "final"),
    ),
)


def fidelity_summary(rec: dict[str, Any], point: str) -> dict[str, Any] | None:
    """The fidelity summary of a run record at ``start`` (its curve's first point) or ``final``."""
    if point == "final":
        return rec.get("fidelity")
    if point == "start":
        return (rec.get("fidelity_curve") or [{}])[0].get("summary")
    raise ValueError(f"a fidelity point is 'start' or 'final', got {point!r}")


def measure_fidelity_claim(
    results: dict[str, Any], claim: FidelityClaim, resamples: int = 10_000, seed: int = 0
) -> dict[str, Any] | None:
    """The claim's difference over the observations of the seeds in which both points were measured with their
    per-pair scores (pooled over those seeds), with its unpaired 95% interval and permutation p-value
    (``diff``, ``ci95``, ``p``, ``p_method``, ``n_obs`` = (a, b), ``seeds``); None when unmeasured."""
    runs = results["runs"]
    arms = {claim.a[0], claim.b[0]}
    if not arms <= set(results["arms"]):
        return None

    def scores(arm: str, point: str, s: str) -> list[float] | None:
        summ = fidelity_summary(runs[arm][s], point)
        return (summ or {}).get("pair_scores", {}).get(claim.metric)

    common = sorted(set.intersection(*(set(runs.get(a, {})) for a in arms)), key=int)
    sides = {s: (scores(*claim.a, s), scores(*claim.b, s)) for s in common}
    seeds = [s for s, (a, b) in sides.items() if a is not None and b is not None]  # both points measured
    if not seeds:
        return None
    c = unpaired_comparison(
        [x for s in seeds for x in sides[s][0] or ()], [x for s in seeds for x in sides[s][1] or ()], resamples, seed
    )
    if c["diff"] != c["diff"]:
        return None
    return {
        "diff": c["diff"],
        "ci95": [float(c["diff_ci"][0]), float(c["diff_ci"][1])],
        "p": c["p"],
        "p_method": c["p_method"],
        "n_obs": (c["n_a"], c["n_b"]),
        "seeds": seeds,
    }


def claim_n(results: dict[str, Any]) -> int:
    """The budget N of the test-time claims: the config's ``claim_n`` when evaluated, else the largest N > 0."""
    ns = sorted({n for n, _ in budget_keys(results) if n > 0})
    want = int(results["config"].get("claim_n", 2))
    return want if want in ns or not ns else ns[-1]


def claim_row(
    text: str, paper: str, contrast: str, direction: str, m: dict[str, Any] | None, count: str, ci_note: str = ""
) -> list[str]:
    """One row of the claims table: the claim, the paper's number, the contrast, then (``m`` from
    :func:`measure_claim` or :func:`measure_fidelity_claim`; None: not measured) the difference, its 95% interval
    over tasks (with ``ci_note``), p-value, its interval over seeds and clusters (``–`` where there is none),
    ``count``, seeds and the verdict (:func:`claim_verdict`) of the interval over seeds and clusters where there is
    one, else of the interval over tasks."""
    if m is None:
        return [text, paper, contrast, "–", "–", "–", "–", "0", "0", "not measured"]
    lo, hi = m["ci95"]
    slo, shi = m.get("ci95_seeds_clusters") or (float("nan"), float("nan"))
    wide = slo == slo and shi == shi
    return [
        text,
        paper,
        contrast,
        f"{m['diff']:+.3f}",
        f"[{lo:+.3f}, {hi:+.3f}]{ci_note}",
        fmt_p(m["p"]),
        f"[{slo:+.3f}, {shi:+.3f}] ({len(m['seeds'])} × {m['n_clusters']} {m['cluster']})" if wide else "–",
        count,
        str(len(m["seeds"])),
        claim_verdict(slo, shi, direction) if wide else claim_verdict(lo, hi, direction),
    ]


def measure_claims(results: dict[str, Any]) -> list[tuple[Claim, dict[str, Any] | None]]:
    """Each claim of :func:`paper_claims` with its :func:`measure_claim` (None: not measured): what the claims
    table and the table by seed both read, measured once."""
    return [(claim, measure_claim(results, claim)) for claim in paper_claims(claim_n(results))]


def claims_table(
    results: dict[str, Any],
    fidelity: bool = True,
    measured: list[tuple[Claim, dict[str, Any] | None]] | None = None,
) -> tuple[list[str], list[list[str]]]:
    """One row per claim of :func:`paper_claims`, then (``fidelity``) one per :data:`FIDELITY_CLAIMS` (its interval
    unpaired, its "tasks" the observations of each side): the contrast, the paper's number, the measured difference
    with its paired 95% interval over tasks and p-value, its interval over seeds and task clusters
    (:func:`seeds_clusters_interval`), tasks, seeds and the verdict (:func:`claim_row`). ``measured``: the claims'
    :func:`measure_claims` where the caller has them."""
    head = [
        "claim",
        "paper",
        "contrast",
        "measured",
        "paired 95% CI",
        "p",
        SEEDS_CLUSTERS_CI,
        "tasks",
        "seeds",
        "verdict",
    ]
    rows = []
    for claim, m in measure_claims(results) if measured is None else measured:
        contrast = " ".join(
            ("+ " if c > 0 else "− ") + f"{a}@{budget_label(n, mode)}" for c, a, n, mode in claim.terms
        ).lstrip("+ ")
        rows.append(claim_row(claim.text, claim.paper, contrast, claim.direction, m, str(m["n_tasks"]) if m else ""))
    for fc in FIDELITY_CLAIMS if fidelity else ():
        contrast = f"{fc.b[0]}@{fc.b[1]} − {fc.a[0]}@{fc.a[1]} (fidelity {fc.metric.replace('_', ' ')})"
        m = measure_fidelity_claim(results, fc)
        count = "{} / {} obs".format(*m["n_obs"]) if m else ""
        rows.append(claim_row(fc.text, fc.paper, contrast, fc.direction, m, count, " (unpaired)"))
    return head, rows


def claims_by_seed_table(
    results: dict[str, Any], measured: list[tuple[Claim, dict[str, Any] | None]] | None = None
) -> tuple[list[str], list[list[str]]]:
    """What each measured claim's interval over seeds and templates is made of: the contrast of each seed's models
    (a column per seed, ``–`` where that seed did not run every term) and the number of clusters (templates, or
    tasks) whose contrast, over the seeds, is above / below / at 0. A claim whose seeds disagree in sign, or whose
    difference comes from a few templates, cannot hold over seeds and templates however narrow its interval over
    tasks. ``measured``: the claims' :func:`measure_claims` where the caller has them."""
    ms = [(c, m) for c, m in (measure_claims(results) if measured is None else measured) if m is not None]
    seeds = sorted({s for _, m in ms for s in m["per_seed"]}, key=int)
    head = ["claim", *(f"seed {s}" for s in seeds), "clusters + / − / 0"]
    rows = [
        [c.text]
        + [f"{m['per_seed'][s]:+.3f}" if s in m["per_seed"] else "–" for s in seeds]
        + ["{} / {} / {} ".format(*m["cluster_signs"]) + m["cluster"]]
        for c, m in ms
    ]
    return head, rows


__all__ = [
    "claims_by_seed_table",
    "FidelityClaim",
    "FIDELITY_CLAIMS",
    "fidelity_summary",
    "measure_fidelity_claim",
    "Term",
    "VERDICTS",
    "Claim",
    "paper_claims",
    "claim_verdict",
    "measure_claim",
    "measure_claims",
    "seeds_clusters_interval",
    "SEEDS_CLUSTERS_CI",
    "claim_n",
    "claim_row",
    "claims_table",
]
