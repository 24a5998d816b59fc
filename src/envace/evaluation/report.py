"""The experiment report: tables (95% intervals over tasks, spread over seeds), figures and a trajectory viewer, all static files.

:func:`write_report` turns an experiment's ``results.json`` content (envace.evaluation.experiment) into, in its folder:

- ``report.md`` and ``report.html``: the paper's claims (:func:`claims_table`: one row per claim of
  :func:`paper_claims` with its measured paired difference, 95% interval and verdict, :func:`claim_verdict`),
  the main table (every arm at N=0: success with its 95% Wilson interval over
  tasks and its spread over seeds), the paired comparison of every RL arm with SFT (difference, paired bootstrap
  interval, p-value; envace.math.stats), success by task kind (when tasks carry one), the test-time rehearsal table
  (success at every budget N and mode, the compute-matched ``plan`` baseline included) and its generated tokens
  per task, rehearsal fidelity over training (each RL arm on the fixed shadow set), the rehearsal-fidelity tables
  (overall; read vs write, state fields changed, real success vs error, position; per domain, per tool) and the
  figures. The HTML page embeds its figures (base64) and needs nothing from the network.
- ``curve_reward.png`` (training reward vs step, one line per RL arm, mean +- std band over seeds),
  ``curve_train_success.png`` (success on the training rollouts, named by where their observations came from:
  *imagined* for rehearsed / simulated rollouts, *real env* for real_env; the two are not the same quantity),
  ``curve_sft_nll.png`` (the warm-up), ``tts_budget.png`` (success vs N; plan dotted) and ``fidelity_curve.png``
  (fidelity on the shadow set vs RL step, one line per arm).
- ``trajectories.html``: shadow trajectories of each arm, each rehearsed observation beside the real one,
  mismatching leaves highlighted (envace.evaluation.fidelity.mismatched_leaves).

Pages set ``document.title`` from a script when they load (tests use it to detect script errors).
"""

from __future__ import annotations

import base64
import html
import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .fidelity import BREAKDOWNS as FID_BREAKDOWNS
from .fidelity import METRICS as FID_METRICS
from .fidelity import Path, mismatched_leaves, observation_fidelity
from ..math.stats import fmt_p, fmt_rate, paired_bootstrap, paired_comparison, rate_interval, seed_spread, sign_flip_p
from ..core.types import Trajectory

MAIN_METRICS: tuple[tuple[str, str], ...] = (
    ("success_rate", "success"),
    ("tool_f1", "tool F1"),
    ("tool_precision", "tool P"),
    ("tool_recall", "tool R"),
    ("call_f1", "call F1"),
    ("format_valid_rate", "format valid"),
    ("steps_per_traj", "steps"),
    ("act_tokens_per_traj", "Act tokens"),
    ("wall_s", "eval s"),
)
RATE_METRICS = ("success_rate", "tool_f1", "tool_precision", "tool_recall", "call_f1", "format_valid_rate")
TRAIN_SUCCESS_CURVES: dict[str, str] = {
    "reward/imagined_success_rate": "imagined",
    "reward/real_success_rate": "real env",
}
"""Training-success metrics (envace.training.trainer._summarise) -> the legend's name for them: success of imagined
(rehearsed / simulated) trajectories is never drawn as if it were real-environment success."""
TRAIN_SUCCESS_NOTE = (
    "Training success: 'imagined' is the success of rehearsed or simulated rollouts (envace, per_role, simulator), "
    "whose tool results the model imagined; 'real env' is the success of real_env's rollouts in the real environment. "
    "They measure different things; the real-environment evaluation is the main table."
)
LOADED_SUFFIX = " [loaded]"
"""Appended to ``document.title`` by each page's script once it ran."""


# --------------------------------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------------------------------


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value). Empty -> (nan, nan)."""
    if not len(xs):
        return float("nan"), float("nan")
    a = np.asarray(xs, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def fmt_ms(ms: tuple[float, float], digits: int = 3) -> str:
    m, s = ms
    if m != m:  # nan
        return "–"
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def _seeds(results: dict[str, Any], arm: str) -> list[dict[str, Any]]:
    return [results["runs"][arm][s] for s in sorted(results["runs"].get(arm, {}), key=int)]


def eval_values(results: dict[str, Any], arm: str, n: int, mode: str, metric: str) -> list[float]:
    """The metric of an arm at budget (n, mode), one value per seed."""
    out = []
    for rec in _seeds(results, arm):
        for e in rec["evals"]:
            if e["n"] == n and (n == 0 or e["mode"] == mode) and metric in e["metrics"]:
                out.append(float(e["metrics"][metric]))
    return out


def _eval_entry(rec: dict[str, Any], n: int, mode: str) -> dict[str, Any] | None:
    return next((e for e in rec["evals"] if e["n"] == n and (n == 0 or e["mode"] == mode)), None)


def per_task_outcomes(
    results: dict[str, Any], arm: str, n: int, mode: str, seeds: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """The arm's per-task rows at budget (n, mode), each task's ``successes`` pooled over the seeds (every seed
    evaluates the same held-out tasks), in task order; ``seeds`` restricts the pool. Empty when some seed's
    evaluation kept no per-task outcomes (results written before they were recorded)."""
    rows: dict[str, dict[str, Any]] = {}
    for s in sorted(results["runs"].get(arm, {}), key=int):
        if seeds is not None and s not in seeds:
            continue
        e = _eval_entry(results["runs"][arm][s], n, mode)
        if e is None:
            continue
        if "per_task" not in e:
            return []
        for r in e["per_task"]:
            row = rows.setdefault(
                r["task_id"], {k: v for k, v in r.items() if k in ("task_id", "domain", "kind")} | {"successes": []}
            )
            row["successes"] = row["successes"] + list(r["successes"])
    return list(rows.values())


def success_cell(results: dict[str, Any], arm: str, n: int, mode: str, spread: bool = False) -> str:
    """``rate [95% CI]``: the success rate of the arm's per-task outcomes pooled over seeds with its Wilson
    interval over tasks (envace.math.stats.rate_interval); ``spread`` appends ``· sd X`` over seeds when there are
    several. Results without per-task outcomes fall back to mean ± std over seeds."""
    rows = per_task_outcomes(results, arm, n, mode)
    per_seed = eval_values(results, arm, n, mode, "success_rate")
    if not rows:
        return fmt_ms(mean_std(per_seed))
    cell = fmt_rate(*rate_interval([r["successes"] for r in rows]))
    return cell + (f" · sd {mean_std(per_seed)[1]:.3f}" if spread and len(per_seed) > 1 else "")


def seed_cell(values: Sequence[float], digits: int = 3) -> str:
    """Spread over seeds: ``mean ± std (min–max)``; one seed: its value; none: ``–``."""
    sp = seed_spread(values)
    if not sp["n"]:
        return "–"
    if sp["n"] == 1:
        return f"{sp['mean']:.{digits}f}"
    return f"{sp['mean']:.{digits}f} ± {sp['std']:.{digits}f} ({sp['min']:.{digits}f}–{sp['max']:.{digits}f})"


def budget_keys(results: dict[str, Any]) -> list[tuple[int, str]]:
    """Every (N, mode) evaluated, in order."""
    keys: list[tuple[int, str]] = []
    for arm in results["arms"]:
        for rec in _seeds(results, arm):
            for e in rec["evals"]:
                k = (int(e["n"]), e["mode"])
                if k not in keys:
                    keys.append(k)
    return sorted(keys)


def fidelity_values(
    results: dict[str, Any], arm: str, group: str = "overall", name: str | None = None
) -> dict[str, list[float]]:
    """Per-seed fidelity metrics of an arm: overall, or one entry of by_domain / by_tool."""
    out: dict[str, list[float]] = {k: [] for k in ("n", *FID_METRICS)}
    for rec in _seeds(results, arm):
        f = rec.get("fidelity")
        if not f:
            continue
        s = f["overall"] if group == "overall" else f.get(group, {}).get(name)
        if not s or not s.get("n"):
            continue
        for k in out:
            out[k].append(float(s[k]))
    return out


def curve(results: dict[str, Any], arm: str, key: str) -> tuple[list[int], list[float], list[float]]:
    """(steps, mean, std) of a training metric over seeds, at the steps every seed logged."""
    per_seed = [
        {int(m["step"]): float(m[key]) for m in rec.get("curve") or [] if key in m} for rec in _seeds(results, arm)
    ]
    per_seed = [d for d in per_seed if d]
    if not per_seed:
        return [], [], []
    steps = sorted(set.intersection(*(set(d) for d in per_seed)))
    ms = [mean_std([d[s] for d in per_seed]) for s in steps]
    return steps, [m for m, _ in ms], [s for _, s in ms]


# --------------------------------------------------------------------------------------------------------
# Tables (rows of cells, rendered as Markdown or HTML)
# --------------------------------------------------------------------------------------------------------


MODE_SHORT = {"parallel": "par", "sequential": "seq"}


def _budget_label(n: int, mode: str) -> str:
    return "N=0" if n == 0 else f"N={n} {MODE_SHORT.get(mode, mode)}"


def main_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    k = int(results["config"].get("eval_samples", 1))
    metrics = list(MAIN_METRICS)
    if k > 1:
        metrics.insert(1, (f"pass^{k}", f"pass^{k}"))
    head = [
        "arm",
        "success [95% CI]",
        "success over seeds",
        *[lbl for _, lbl in metrics[1:]],
        "fidelity leaf acc",
        "train s",
    ]
    rows = []
    for arm in results["arms"]:
        row = [
            arm,
            success_cell(results, arm, 0, "none"),
            seed_cell(eval_values(results, arm, 0, "none", "success_rate")),
        ]
        row += [
            fmt_ms(
                mean_std(eval_values(results, arm, 0, "none", m)),
                3 if m in RATE_METRICS or m.startswith("pass^") else 1,
            )
            for m, _ in metrics[1:]
        ]
        row.append(fmt_ms(mean_std(fidelity_values(results, arm)["leaf_acc"])))
        row.append(fmt_ms(mean_std([r.get("train_s", 0.0) for r in _seeds(results, arm)]), 0))
        rows.append(row)
    return head, rows


def sweep_scope(results: dict[str, Any], arm: str) -> tuple[list[str], set[str]] | None:
    """(seeds, task ids) of an arm's test-time sweep (its evaluations at N > 0: ``tts_seeds`` and ``tts_tasks``
    may make them a subset of the N=0 ones), or None without a sweep or when it kept no per-task outcomes."""
    seeds: list[str] = []
    ids: set[str] = set()
    for s in sorted(results["runs"].get(arm, {}), key=int):
        ev = [e for e in results["runs"][arm][s]["evals"] if e["n"] > 0]
        if not ev:
            continue
        if any("per_task" not in e for e in ev):
            return None
        seeds.append(s)
        ids |= {r["task_id"] for e in ev for r in e["per_task"]}
    return (seeds, ids) if seeds else None


def sweep_rate(
    results: dict[str, Any], arm: str, n: int, mode: str
) -> tuple[tuple[float, float, float], list[float]] | None:
    """((rate, low, high) pooled over the sweep's seeds and tasks, [rate of each seed]) at (n, mode), N=0
    included, so every budget of the N curve is measured on the same tasks and seeds; None without a scope."""
    scope = sweep_scope(results, arm)
    if scope is None:
        return None
    seeds, ids = scope
    rows = [r for r in per_task_outcomes(results, arm, n, mode, seeds) if r["task_id"] in ids]
    if not rows:
        return None
    per_seed = []
    for s in seeds:
        mine = [r["successes"] for r in per_task_outcomes(results, arm, n, mode, [s]) if r["task_id"] in ids]
        if mine:
            per_seed.append(rate_interval(mine)[0])
    return rate_interval([r["successes"] for r in rows]), per_seed


def tts_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Success at every budget: ``rate [95% CI]`` pooled over the sweep's seeds and tasks (:func:`sweep_rate`, N=0
    on the same ones), and ``· sd`` over seeds when several. Results without per-task outcomes at N > 0 show
    :func:`success_cell` instead."""
    keys = budget_keys(results)
    head = ["arm", *[_budget_label(n, m) for n, m in keys]]
    rows = []
    for arm in tts_arms_run(results):
        cells = []
        for n, m in keys:
            sr = sweep_rate(results, arm, n, m)
            if sr is None:
                cells.append(success_cell(results, arm, n, m, spread=True))
                continue
            (rate, lo, hi), per_seed = sr
            cells.append(fmt_rate(rate, lo, hi) + (f" · sd {mean_std(per_seed)[1]:.3f}" if len(per_seed) > 1 else ""))
        rows.append([arm, *cells])
    return head, rows


def tts_arms_run(results: dict[str, Any]) -> list[str]:
    """The arms evaluated at some budget N > 0 (the test-time sweep), in arm order."""
    return [a for a in results["arms"] if any(e["n"] > 0 for rec in _seeds(results, a) for e in rec["evals"])]


def tts_tokens_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Generated tokens per task at every budget N > 0: ``attempts A · all P`` with A the tokens of the private
    attempts (Act + Rehearse of rehearsed attempts, or the plans of the compute-matched baseline) and P everything
    generated before the real run (+ reflections, memory), mean over seeds of the per-seed means; then the
    plan budget that was set. Whether the baseline was matched can be read off each row."""
    keys = [k for k in budget_keys(results) if k[0] > 0]
    head = ["arm", *[_budget_label(n, m) for n, m in keys]]
    rows = []
    for arm in tts_arms_run(results):
        cells = []
        for n, m in keys:
            att = eval_values(results, arm, n, m, "tts/attempt_tokens_per_task")
            allt = eval_values(results, arm, n, m, "tts/rehearsal_tokens_per_task")
            budgets = [
                e["plan_max_new_tokens"]
                for rec in _seeds(results, arm)
                for e in rec["evals"]
                if e["n"] == n and e["mode"] == m and "plan_max_new_tokens" in e
            ]
            cell = f"{np.mean(att):.0f} · {np.mean(allt):.0f}" if att and allt else "–"
            cells.append(cell + (f" (plan ≤ {np.mean(budgets):.0f})" if budgets else ""))
        rows.append([arm, *cells])
    return head, rows


def kind_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Success at N=0 by task kind (tasks carrying ``metadata["kind"]``), ``rate [95% CI] (tasks)`` pooled over
    seeds; no rows when no task has a kind."""
    per_arm = {arm: per_task_outcomes(results, arm, 0, "none") for arm in results["arms"]}
    kinds = sorted({str(r["kind"]) for rows in per_arm.values() for r in rows if "kind" in r})
    rows = []
    for arm, ts in per_arm.items():
        cells = []
        for k in kinds:
            sel = [r["successes"] for r in ts if str(r.get("kind")) == k]
            cells.append(f"{fmt_rate(*rate_interval(sel))} ({len(sel)})" if sel else "–")
        if kinds:
            rows.append([arm, *cells])
    return ["arm", *kinds], rows


def paired_table(results: dict[str, Any], baseline: str = "sft") -> tuple[list[str], list[list[str]]]:
    """Each RL arm against ``baseline`` at N=0, paired over the same held-out tasks (per-task outcomes pooled over
    the seeds both ran): both rates with 95% Wilson intervals, the difference (arm - baseline) with its paired
    bootstrap 95% interval, and the p-value (exact McNemar with one binary outcome per task, else paired
    sign-flip permutation); see envace.math.stats."""
    from .trials import compare_per_task

    head = [
        "arm",
        f"{baseline} [95% CI]",
        "arm [95% CI]",
        f"arm - {baseline}",
        "paired 95% CI",
        "p",
        "test",
        "tasks",
        "seeds",
    ]
    rows: list[list[str]] = []
    if baseline not in results["arms"]:
        return head, rows
    for arm in results["arms"]:
        if arm in ("base", baseline):
            continue
        seeds = sorted(set(results["runs"].get(arm, {})) & set(results["runs"].get(baseline, {})), key=int)
        a, b = per_task_outcomes(results, baseline, 0, "none", seeds), per_task_outcomes(results, arm, 0, "none", seeds)
        if not a or not b:
            rows.append([arm] + ["–"] * (len(head) - 1))
            continue
        c = compare_per_task(a, b)["overall"]
        rows.append(
            [
                arm,
                fmt_rate(c["a"]["rate"], *c["a"]["ci95"]),
                fmt_rate(c["b"]["rate"], *c["b"]["ci95"]),
                f"{c['diff']:+.3f}",
                "[{:+.3f}, {:+.3f}]".format(*c["diff_ci95"]),
                fmt_p(c["p"]),
                c["p_method"].replace("_", " "),
                str(c["n_tasks"]),
                str(len(seeds)),
            ]
        )
    return head, rows


# --------------------------------------------------------------------------------------------------------
# The paper's claims, each with its paired difference, interval and verdict
# --------------------------------------------------------------------------------------------------------

Term = tuple[int, str, int, str]
"""(coefficient, arm, N, mode) of a claim's per-task contrast: the task's mean success in that evaluation."""

VERDICTS = ("holds", "does not hold", "cannot tell at this scale", "not measured")


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
    in which every term was evaluated: a test-time sweep of fewer seeds pairs its N=0 term with those seeds only): ``diff`` (mean over tasks), ``ci95`` (paired bootstrap over tasks), ``p`` and
    ``p_method``, ``n_tasks``, ``seeds``; None when some evaluation is missing. Two terms (B - A) are exactly
    :func:`envace.math.stats.paired_comparison` (exact McNemar with one binary outcome per task); more (a difference
    of gains) resample the per-task contrast, with a sign-flip p-value."""
    arms = {a for _, a, _, _ in claim.terms}
    if not arms <= set(results["arms"]):
        return None
    common = sorted(set.intersection(*(set(results["runs"].get(a, {})) for a in arms)), key=int)
    seeds = [
        s for s in common if all(_eval_entry(results["runs"][a][s], n, m) is not None for _, a, n, m in claim.terms)
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
    }


def claim_n(results: dict[str, Any]) -> int:
    """The budget N of the test-time claims: the config's ``claim_n`` when evaluated, else the largest N > 0."""
    ns = sorted({n for n, _ in budget_keys(results) if n > 0})
    want = int(results["config"].get("claim_n", 2))
    return want if want in ns or not ns else ns[-1]


def claims_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One row per claim of :func:`paper_claims`: the contrast, the paper's number, the measured difference with its
    paired 95% interval and p-value, tasks, seeds and the verdict (:func:`claim_verdict`)."""
    head = ["claim", "paper", "contrast", "measured", "paired 95% CI", "p", "tasks", "seeds", "verdict"]
    rows = []
    for claim in paper_claims(claim_n(results)):
        contrast = " ".join(
            ("+ " if c > 0 else "− ") + f"{a}@{_budget_label(n, m)}" for c, a, n, m in claim.terms
        ).lstrip("+ ")
        m = measure_claim(results, claim)
        if m is None:
            rows.append([claim.text, claim.paper, contrast, "–", "–", "–", "0", "0", "not measured"])
            continue
        lo, hi = m["ci95"]
        rows.append(
            [
                claim.text,
                claim.paper,
                contrast,
                f"{m['diff']:+.3f}",
                f"[{lo:+.3f}, {hi:+.3f}]",
                fmt_p(m["p"]),
                str(m["n_tasks"]),
                str(len(m["seeds"])),
                claim_verdict(lo, hi, claim.direction),
            ]
        )
    return head, rows


# --------------------------------------------------------------------------------------------------------
# Rehearsal fidelity over training
# --------------------------------------------------------------------------------------------------------


def fidelity_curve(
    results: dict[str, Any], arm: str, metric: str = "leaf_acc"
) -> tuple[list[int], list[float], list[float]]:
    """(steps, mean, std over seeds) of an arm's fidelity on the fixed shadow set (``fidelity_curve`` of each
    seed's record), at the steps every seed measured with at least one scored pair."""
    per_seed = []
    for rec in _seeds(results, arm):
        pts = {
            int(p["step"]): float(p["summary"]["overall"][metric])
            for p in rec.get("fidelity_curve") or []
            if p.get("summary") and p["summary"]["overall"].get("n")
        }
        if pts:
            per_seed.append(pts)
    if not per_seed:
        return [], [], []
    steps = sorted(set.intersection(*(set(d) for d in per_seed)))
    ms = [mean_std([d[s] for d in per_seed]) for s in steps]
    return steps, [m for m, _ in ms], [s for _, s in ms]


def fidelity_curve_table(results: dict[str, Any], metric: str = "leaf_acc") -> tuple[list[str], list[list[str]]]:
    """Fidelity ``metric`` per RL arm at every measured step (mean ± std over seeds)."""
    curves = {a: fidelity_curve(results, a, metric) for a in results["arms"]}
    steps = sorted({s for st, _, _ in curves.values() for s in st})
    rows = []
    for arm, (st, mean, std) in curves.items():
        if st:
            at = {s: (m, sd) for s, m, sd in zip(st, mean, std)}
            rows.append([arm, *[fmt_ms(at[s]) if s in at else "–" for s in steps]])
    return ["arm", *[f"step {s}" for s in steps]], rows


def fidelity_table(results: dict[str, Any], group: str = "overall") -> tuple[list[str], list[list[str]]]:
    """Overall: one row per arm. by_domain / by_tool: one row per (arm, domain or tool)."""
    head = ["arm"] + ([] if group == "overall" else [group[3:]]) + ["pairs", *FID_METRICS]
    rows = []
    for arm in results["arms"]:
        names: list[str | None] = [None]
        if group != "overall":
            names = sorted(
                {n for rec in _seeds(results, arm) if rec.get("fidelity") for n in rec["fidelity"].get(group, {})}
            )
        for name in names:
            v = fidelity_values(results, arm, group, name)
            if not v["n"]:
                if group == "overall":  # keep the arm visible: its Rehearse role was never asked
                    rows.append([arm, "0"] + ["–"] * len(FID_METRICS))
                continue
            rows.append(
                [arm]
                + ([] if name is None else [name])
                + [f"{np.mean(v['n']):.0f}"]
                + [fmt_ms(mean_std(v[k])) for k in FID_METRICS]
            )
    return head, rows


def fidelity_breakdown_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Fidelity where rehearsal fails (envace.evaluation.fidelity.BREAKDOWNS): per arm, read vs write calls, the number of
    state fields changed, real success vs error and the position in the trajectory; mean ± std over seeds."""
    head = ["arm", "split", "bucket", "pairs", *FID_METRICS]
    rows = []
    for arm in results["arms"]:
        for key, bd in FID_BREAKDOWNS.items():
            for name in bd.order:
                v = fidelity_values(results, arm, key, name)
                if v["n"]:
                    rows.append(
                        [arm, key[3:], name, f"{np.mean(v['n']):.0f}"] + [fmt_ms(mean_std(v[k])) for k in FID_METRICS]
                    )
    return head, rows


def md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def html_table(head: list[str], rows: list[list[str]], cls: str = "t") -> str:
    h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>'


# --------------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def curve_lines(
    results: dict[str, Any], keys: str | dict[str, str], arms: Sequence[str] | None = None
) -> list[tuple[str, str, str]]:
    """The lines a figure of training metrics draws, as ``(legend label, arm, metric key)``: for one metric
    (``keys`` a str) one line per arm that logged it, labelled with the arm; for several named ones
    (``{key: name}``) one line per (arm, key) the arm logged, labelled ``"<arm> (<name>)"``."""
    named = {keys: ""} if isinstance(keys, str) else dict(keys)
    out = []
    for arm in arms if arms is not None else results["arms"]:
        for key, name in named.items():
            if curve(results, arm, key)[0]:
                out.append((f"{arm} ({name})" if name else arm, arm, key))
    return out


def plot_curves(
    results: dict[str, Any],
    key: str | dict[str, str],
    path: str,
    title: str,
    arms: Sequence[str] | None = None,
    ylabel: str | None = None,
) -> str:
    """Training metric(s) vs step, mean +- std band over seeds; ``key`` as in :func:`curve_lines`."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=100)
    lines = curve_lines(results, key, arms)
    for label, arm, k in lines:
        steps, mean, std = curve(results, arm, k)
        m, s = np.asarray(mean), np.asarray(std)
        ax.plot(steps, m, marker="o", ms=3, label=label)
        ax.fill_between(steps, m - s, m + s, alpha=0.2)
    if not lines:
        ax.text(0.5, 0.5, "no training steps logged", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel or (key if isinstance(key, str) else "value"))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_tts(results: dict[str, Any], path: str, metric: str = "success_rate") -> str:
    """Success vs rehearsal budget N per swept arm: parallel solid, sequential dashed, plan dotted (all from the N=0
    point), on the sweep's tasks and seeds with 95% Wilson bars (:func:`sweep_rate`; else mean ± std over seeds)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=100)
    keys = budget_keys(results)
    modes = sorted({m for n, m in keys if n > 0}) or ["none"]
    styles = {"parallel": "-", "sequential": "--", "plan": ":"}

    def point(
        arm: str, n: int, mode: str
    ) -> tuple[float, float, float]:  # (y, below, above): Wilson on the sweep, else ± std over seeds
        sr = sweep_rate(results, arm, n, mode) if metric == "success_rate" else None
        if sr is not None:
            (rate, lo, hi), _ = sr
            return rate, rate - lo, hi - rate
        m, sd = mean_std(eval_values(results, arm, n, mode, metric))
        return m, sd, sd

    for i, arm in enumerate(tts_arms_run(results) or results["arms"]):
        color = f"C{i % 10}"
        for mode in modes:
            pts = [(0, point(arm, 0, "none"))] + [(n, point(arm, n, mode)) for n, m in keys if n > 0 and m == mode]
            pts = [(n, v) for n, v in pts if v[0] == v[0]]  # drop budgets without values (nan)
            if pts:
                label = arm if mode == "none" else f"{arm} ({mode})"
                ax.errorbar(
                    [n for n, _ in pts],
                    [v[0] for _, v in pts],
                    yerr=[[v[1] for _, v in pts], [v[2] for _, v in pts]],
                    color=color,
                    linestyle=styles.get(mode, ":"),
                    marker="o",
                    ms=3,
                    capsize=2,
                    label=label,
                )
    ax.set_xlabel("rehearsal budget N")
    ax.set_ylabel(metric)
    ax.set_title("Test-time rehearsal budget")
    ax.set_xticks(sorted({n for n, _ in keys}))
    if metric in RATE_METRICS:
        ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_fidelity_curve(results: dict[str, Any], path: str, metric: str = "leaf_acc") -> str:
    """Rehearsal fidelity on the fixed shadow set vs RL step, one line per arm (mean ± std band over seeds)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=100)
    drawn = 0
    for arm in results["arms"]:
        steps, mean, std = fidelity_curve(results, arm, metric)
        if steps:
            m, sd = np.asarray(mean), np.asarray(std)
            ax.plot(steps, m, marker="o", ms=3, label=arm)
            ax.fill_between(steps, m - sd, m + sd, alpha=0.2)
            drawn += 1
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no fidelity curve (fidelity_every = 0)", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("RL iteration (0 = the SFT model)")
    ax.set_ylabel(f"fidelity {metric}")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title("Rehearsal fidelity on the fixed held-out shadow set")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------------
# Trajectory viewer
# --------------------------------------------------------------------------------------------------------


def json_html(obj: Any, bad: set[Path], cls: str = "mm", path: Path = ()) -> str:
    """Compact JSON as HTML; leaves whose path is in ``bad`` are wrapped in ``<span class=cls>``."""
    if isinstance(obj, dict) and obj:
        inner = ", ".join(
            f'<span class="k">{html.escape(json.dumps(k, ensure_ascii=False))}</span>: {json_html(v, bad, cls, path + (k,))}'
            for k, v in obj.items()
        )
        return "{" + inner + "}"
    if isinstance(obj, list) and obj:
        return "[" + ", ".join(json_html(v, bad, cls, path + (i,)) for i, v in enumerate(obj)) + "]"
    text = html.escape(json.dumps(obj, ensure_ascii=False))
    return f'<span class="{cls}">{text}</span>' if path in bad else text


def trajectory_html(traj: Trajectory, anchor: str) -> str:
    """One shadow trajectory: user turns, Act outputs and, per call, the rehearsed vs the real observation."""
    users = [m.content for m in traj.messages if m.role == "user"]
    out = [f'<section class="traj" id="{anchor}" data-anchor="{anchor}">']
    out.append(
        f"<h3>{html.escape(traj.id)}</h3><p class='meta'>task {html.escape(traj.task_id)} · mode {html.escape(traj.mode)} · truncated {html.escape(str(traj.truncated))}</p>"
    )
    turn = -1
    for si, step in enumerate(traj.steps):
        if step.user_turn != turn and step.user_turn < len(users):
            turn = step.user_turn
            out.append(f'<div class="user"><b>user</b> {html.escape(users[turn])}</div>')
        out.append(f'<div class="act"><b>act · step {si}</b><pre>{html.escape(step.action_text.strip())}</pre></div>')
        if not step.observations:
            continue
        out.append(
            '<table class="obs"><thead><tr><th>call</th><th>rehearsed</th><th>real (shadow)</th><th>scores</th></tr></thead><tbody>'
        )
        for i, obs in enumerate(step.observations):
            src = step.sources[i] if i < len(step.sources) else "?"
            real = step.shadow[i] if i < len(step.shadow) else None
            call = step.calls[i].key() if i < len(step.calls) else "(unparsed)"
            if real is None:
                out.append(
                    f"<tr><td><code>{html.escape(call)}</code></td><td><span class='src'>{html.escape(src)}</span> <code>{json_html(obs, set())}</code></td><td class='na'>not recorded</td><td></td></tr>"
                )
                continue
            bad_r, bad_t = mismatched_leaves(obs, real)
            sc = observation_fidelity(obs, real)
            cls = "match" if sc["exact"] else "diff"
            scores = " ".join(f"{k}={sc[k]:.2f}" for k in FID_METRICS)
            out.append(
                f"<tr class='{cls}'><td><code>{html.escape(call)}</code></td>"
                f"<td><span class='src'>{html.escape(src)}</span> <code>{json_html(obs, bad_r, 'mm')}</code></td>"
                f"<td><code>{json_html(real, bad_t, 'miss')}</code></td><td class='sc'>{scores}</td></tr>"
            )
        out.append("</tbody></table>")
    out.append(f"<p class='meta'>counters: {html.escape(json.dumps(traj.counters, sort_keys=True))}</p></section>")
    return "\n".join(out)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}th,td{border:1px solid #ccc;padding:4px 8px;vertical-align:top}
th{background:#f3f3f3}td{font-variant-numeric:tabular-nums;white-space:nowrap}
.meta{color:#666;font-size:12px}img{max-width:560px;width:48%;border:1px solid #eee;margin:6px}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;white-space:pre-wrap;word-break:break-word}
pre{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;padding:6px;margin:4px 0;font-size:12px}
.mm{background:#ffc9c9}.miss{background:#fff3b0}.k{color:#555}.src{font-size:11px;color:#fff;background:#888;border-radius:3px;padding:0 4px}
tr.match td{background:#eefbea}.na{color:#999}.sc{font-size:11px;color:#444;white-space:nowrap}
.user{background:#eef4ff;padding:6px;margin:6px 0}.act{margin:6px 0}.traj{border:1px solid #ddd;padding:10px;margin:12px 0}
.legend span{padding:0 6px;margin-right:8px}details{margin:6px 0}
"""


def _page(title: str, body: str, script: str = "") -> str:
    js = f"document.title = document.title + {json.dumps(LOADED_SUFFIX)};"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n{body}\n"
        f"<script>\n(function () {{\n{script}\n{js}\n}})();\n</script>\n</body></html>\n"
    )


def viewer_html(results: dict[str, Any]) -> str:
    """The trajectory viewer page: a picker and one section per kept shadow trajectory."""
    sections, options = [], []
    for arm in results["arms"]:
        for seed in sorted(results["runs"].get(arm, {}), key=int):
            for j, d in enumerate(results["runs"][arm][seed].get("examples") or []):
                traj = Trajectory.from_dict(d)
                anchor = f"t-{arm}-{seed}-{j}"
                n_pairs = sum(1 for s in traj.steps for x in s.shadow if x is not None)
                options.append(
                    f"<option value='{anchor}'>{html.escape(arm)} · seed {seed} · {html.escape(traj.task_id)} · {n_pairs} compared</option>"
                )
                sections.append(
                    f"<div class='arm-label meta'>arm <b>{html.escape(arm)}</b>, seed {seed}</div>"
                    + trajectory_html(traj, anchor)
                )
    if not sections:
        sections = ["<p>No shadow trajectories were kept (fidelity_tasks = 0?).</p>"]
    body = (
        "<h1>Rehearsed vs real: shadow trajectories</h1>"
        "<p>Each row puts the observation the model <i>rehearsed</i> for a call next to what the real environment "
        "returned for the same call (<i>shadow</i> mode: recorded, never shown to the policy). "
        "<span class='legend'><span class='mm'>rehearsed leaf that is wrong or invented</span>"
        "<span class='miss'>real leaf not reproduced</span></span> Rows in green match exactly.</p>"
        f"<p><label>trajectory: <select id='pick'>{''.join(options)}</select></label> "
        "<label><input type='checkbox' id='all'> show all</label> · <a href='report.html'>back to the report</a></p>"
        f"<div id='trajs'>{''.join(sections)}</div>"
    )
    script = """
var pick = document.getElementById('pick'), all = document.getElementById('all');
function show() {
  var secs = document.querySelectorAll('section.traj');
  for (var i = 0; i < secs.length; i++) {
    var on = all.checked || secs[i].getAttribute('data-anchor') === pick.value;
    secs[i].style.display = on ? '' : 'none';
    var lab = secs[i].previousElementSibling;
    if (lab && lab.className.indexOf('arm-label') >= 0) { lab.style.display = on ? '' : 'none'; }
  }
}
pick.addEventListener('change', show); all.addEventListener('change', show); show();
"""
    return _page("envace trajectory viewer", body, script)


# --------------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------------


def _img_data(path: str) -> str:
    with open(path, "rb") as f:
        return "data:image/png;base64," + base64.b64encode(f.read()).decode("ascii")


def _config_summary(c: dict[str, Any]) -> str:
    return (
        f"model `{c.get('model')}`, suite `{c.get('suite')}`, seeds {list(c.get('seeds', []))}; SFT {c.get('sft_steps')} steps; "
        f"RL {c.get('iterations')} iterations x B={c.get('batch_tasks')} x K={c.get('group_size')} (lr {c.get('lr')}, reward {c.get('reward')}); "
        f"evaluation on {c.get('eval_tasks')} `{c.get('eval_split')}` tasks x {c.get('eval_samples')} trials (T={c.get('eval_temperature')}), "
        f"rehearsal budgets N={list(c.get('tts_budgets', []))} ({', '.join(c.get('tts_modes', []))}; memory format "
        f"`{c.get('tts_memory')}`); fidelity on "
        f"{c.get('fidelity_tasks')} tasks x {c.get('fidelity_samples')}."
    )


def write_report(results: dict[str, Any], out_dir: str) -> dict[str, str]:
    """Write every report file into ``out_dir``; returns kind -> path."""
    os.makedirs(out_dir, exist_ok=True)
    p = lambda name: os.path.join(out_dir, name)  # noqa: E731
    rl_arms = [a for a in results["arms"] if a not in ("base", "sft")]
    figs = {
        "curve_reward": plot_curves(
            results, "reward/mean", p("curve_reward.png"), "Training reward (mean ± std over seeds)", rl_arms
        ),
        "curve_train_success": plot_curves(
            results,
            TRAIN_SUCCESS_CURVES,
            p("curve_train_success.png"),
            "Training success on rollouts: imagined (rehearsed) vs real env",
            rl_arms,
            ylabel="success rate",
        ),
        "curve_sft_nll": plot_curves(
            results, "sft/nll", p("curve_sft_nll.png"), "SFT warm-up NLL", [a for a in results["arms"] if a == "sft"]
        ),
        "tts_budget": plot_tts(results, p("tts_budget.png")),
        "fidelity_curve": plot_fidelity_curve(results, p("fidelity_curve.png")),
    }
    c = results["config"]
    n_seeds = max((len(results["runs"].get(a, {})) for a in results["arms"]), default=0)
    tables = {
        "claims": claims_table(results),
        "main": main_table(results),
        "paired": paired_table(results),
        "kinds": kind_table(results),
        "tts": tts_table(results),
        "tts_tokens": tts_tokens_table(results),
        "fidelity_curve": fidelity_curve_table(results),
        "fidelity": fidelity_table(results),
        "fidelity_domain": fidelity_table(results, "by_domain"),
        "fidelity_tool": fidelity_table(results, "by_tool"),
        "fidelity_breakdown": fidelity_breakdown_table(results),
    }
    captions = {
        "claims": "Each claim as a per-task contrast of evaluations on the same held-out tasks (outcomes pooled over the seeds every arm of the claim ran): "
        "the measured difference, its paired bootstrap 95% interval over tasks and p-value (two evaluations: envace.math.stats.paired_comparison, "
        "exact McNemar for one binary outcome per task; a difference of gains: sign-flip permutation of the per-task contrast). "
        "Verdict: holds = the interval excludes 0 in the claimed direction; does not hold = it excludes 0 in the other direction; "
        "cannot tell at this scale = it contains 0 (a ≥ claim has no margin here: it needs the same evidence as >). "
        "The paper's numbers are Qwen3-8B on tau2-Bench / BFCL; this is a small model on CPU.",
        "main": f"Held-out tasks in the real environment, no test-time rehearsal (N=0). Success: the per-task outcomes of all {n_seeds} seed(s) pooled, "
        "with the 95% Wilson interval over tasks (conservative with several outcomes per task, envace.math.stats); over seeds: mean ± std (min–max) "
        "of each seed's rate. Other columns: mean ± std over seeds.",
        "paired": "Each RL arm against SFT on the same held-out tasks (N=0, outcomes pooled over the seeds both ran): the difference with its paired "
        "bootstrap 95% interval over tasks (10,000 resamples, seeded) and its p-value (exact McNemar for one binary outcome per task, "
        "else a paired sign-flip permutation test of per-task mean success).",
        "kinds": "Success at N=0 by task kind (rate [95% Wilson interval] (tasks), pooled over seeds).",
        "tts": "Success rate with private test-time rehearsal of budget N before the single real run (par = parallel, seq = sequential, "
        "plan = the compute-matched baseline: N plans without tool results): rate [95% Wilson interval over tasks] pooled over the sweep's "
        "seeds and tasks (tts_seeds, tts_tasks; N=0 on the same ones), · sd = std of the per-seed rates.",
        "tts_tokens": "Generated tokens per task before the real run, at each budget: attempts · all (attempts = Act + Rehearse tokens of the rehearsed "
        "attempts, or the plans' tokens of the compute-matched baseline; all = + reflections and memory), mean over seeds; "
        "(plan ≤ T): the plan budget, the mean tokens of one parallel attempt of the same arm at that N. Per-task counts are in results.json.",
        "fidelity_curve": "Leaf-value accuracy of rehearsed observations on the same held-out shadow tasks (same rollout seed) at step 0 (the SFT model) "
        "and every fidelity_every RL iterations, mean ± std over seeds.",
        "fidelity": "Rehearsal fidelity of each arm's Rehearse model on shadow rollouts (valid JSON, exact match, key-set match, leaf-value accuracy, error-vs-success agreement).",
        "fidelity_domain": "Fidelity per domain.",
        "fidelity_tool": "Fidelity per tool.",
        "fidelity_breakdown": "Fidelity split where rehearsal fails: read (the real call changed no top-level state field) vs write, the number of "
        "state fields the real call changed, real success vs error observation, and the Act step the call came from (1, 2, 3+).",
    }
    titles = {
        "claims": "The paper's claims",
        "tts_tokens": "Test-time compute: generated tokens",
        "fidelity_curve": "Rehearsal fidelity over training",
        "main": "Main results",
        "paired": "Paired comparison with SFT",
        "kinds": "Success by task kind",
        "tts": "Test-time rehearsal",
        "fidelity": "Rehearsal fidelity",
        "fidelity_domain": "Fidelity by domain",
        "fidelity_tool": "Fidelity by tool",
        "fidelity_breakdown": "Fidelity by state change, outcome and position",
    }
    fig_titles = {
        "curve_reward": "Training reward",
        "curve_train_success": "Training success: imagined vs real env",
        "curve_sft_nll": "SFT warm-up",
        "tts_budget": "Rehearsal budget",
        "fidelity_curve": "Rehearsal fidelity over training",
    }
    docs = results.get("docs", {})
    arms_md = "\n".join(f"- **{a}**: {docs.get(a, '')}" for a in results["arms"])

    # Markdown
    md = [f"# EnvACE experiment in miniature\n\n{_config_summary(c)}\n\nArms:\n{arms_md}\n"]
    for key in [k for k in ("claims", "main", "paired", "kinds", "tts", "tts_tokens") if tables[k][1]]:
        md.append(f"## {titles[key]}\n\n{captions[key]}\n\n{md_table(*tables[key])}\n")
    md.append(
        "## Figures\n\n"
        + TRAIN_SUCCESS_NOTE
        + "\n\n"
        + "\n\n".join(f"![{fig_titles[k]}]({os.path.basename(v)})" for k, v in figs.items())
        + "\n"
    )
    for key in [k for k in ("fidelity_curve",) if tables[k][1]] + [
        "fidelity",
        "fidelity_breakdown",
        "fidelity_domain",
        "fidelity_tool",
    ]:
        md.append(f"## {titles[key]}\n\n{captions[key]}\n\n{md_table(*tables[key])}\n")
    md.append(
        "## Trajectories\n\nRehearsed vs real observations, mismatches highlighted: [trajectories.html](trajectories.html). Raw numbers: [results.json](results.json).\n"
    )
    if "elapsed_s" in results:
        md.append(f"Total time: {results['elapsed_s']:.0f} s.\n")
    with open(p("report.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(md))

    # HTML
    arms_html = "".join(f"<li><b>{html.escape(a)}</b>: {html.escape(docs.get(a, ''))}</li>" for a in results["arms"])
    body = [
        f"<h1>EnvACE experiment in miniature</h1><p>{html.escape(_config_summary(c).replace('`', ''))}</p><ul>{arms_html}</ul>"
    ]
    for key in [k for k in ("claims", "main", "paired", "kinds", "tts", "tts_tokens") if tables[k][1]]:
        body.append(
            f"<h2 id='{key}'>{titles[key]}</h2><p class='meta'>{html.escape(captions[key])}</p>{html_table(*tables[key])}"
        )
    body.append(
        f"<h2 id='figures'>Figures</h2><p class='meta'>{html.escape(TRAIN_SUCCESS_NOTE)}</p>"
        + "".join(f"<img alt='{html.escape(fig_titles[k])}' src='{_img_data(v)}'>" for k, v in figs.items())
    )
    if tables["fidelity_curve"][1]:
        body.append(
            f"<h3>{titles['fidelity_curve']}</h3><p class='meta'>{html.escape(captions['fidelity_curve'])}</p>{html_table(*tables['fidelity_curve'])}"
        )
    body.append(
        f"<h2 id='fidelity'>{titles['fidelity']}</h2><p class='meta'>{html.escape(captions['fidelity'])}</p>{html_table(*tables['fidelity'])}"
    )
    body.append(
        f"<h3>{titles['fidelity_breakdown']}</h3><p class='meta'>{html.escape(captions['fidelity_breakdown'])}</p>{html_table(*tables['fidelity_breakdown'])}"
    )
    for key in ("fidelity_domain", "fidelity_tool"):
        body.append(f"<details><summary>{titles[key]}</summary>{html_table(*tables[key])}</details>")
    body.append(
        "<h2 id='trajectories'>Trajectories</h2><p>Rehearsed vs real observations with mismatches highlighted: "
        "<a href='trajectories.html'>trajectory viewer</a>. Raw numbers: <a href='results.json'>results.json</a>.</p>"
    )
    if "elapsed_s" in results:
        body.append(f"<p class='meta'>Total time: {results['elapsed_s']:.0f} s.</p>")
    with open(p("report.html"), "w", encoding="utf-8") as f:
        f.write(_page("envace experiment report", "\n".join(body)))
    with open(p("trajectories.html"), "w", encoding="utf-8") as f:
        f.write(viewer_html(results))
    return {
        "md": p("report.md"),
        "html": p("report.html"),
        "viewer": p("trajectories.html"),
        "results": p("results.json"),
        **figs,
    }


__all__ = [
    "Claim",
    "VERDICTS",
    "paper_claims",
    "claim_verdict",
    "measure_claim",
    "claim_n",
    "claims_table",
    "fidelity_curve",
    "fidelity_curve_table",
    "plot_fidelity_curve",
    "tts_tokens_table",
    "tts_arms_run",
    "sweep_scope",
    "sweep_rate",
    "write_report",
    "main_table",
    "paired_table",
    "kind_table",
    "per_task_outcomes",
    "success_cell",
    "seed_cell",
    "tts_table",
    "fidelity_table",
    "md_table",
    "html_table",
    "plot_curves",
    "plot_tts",
    "viewer_html",
    "trajectory_html",
    "json_html",
    "fidelity_breakdown_table",
    "mean_std",
    "fmt_ms",
    "eval_values",
    "curve",
    "curve_lines",
    "TRAIN_SUCCESS_CURVES",
    "LOADED_SUFFIX",
]
