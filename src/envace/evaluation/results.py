"""An experiment's ``results.json`` (envace.evaluation.experiment), read: the values of an arm per seed, at a
budget (N, mode), pooled over seeds with intervals over tasks, and the training curves. Pure functions of the dict;
the report's tables (envace.evaluation.report) and the paper's claims (envace.evaluation.claims) read it here.
"""

from __future__ import annotations

import functools
from typing import Any, Collection, Sequence

import numpy as np

from ..envs.builtin import task_from_id
from .fidelity import METRICS as FID_METRICS
from ..math.stats import fmt_rate, rate_interval, seed_spread


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value). Empty -> (nan, nan)."""
    if not len(xs):
        return float("nan"), float("nan")
    a = np.asarray(xs, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def fmt_ms(ms: tuple[float, float], digits: int = 3, n: int = 2) -> str:
    """``mean ± std``; of ``n`` = 1 value (one seed) the value alone, which has no spread to show."""
    m, s = ms
    if m != m:  # nan
        return "–"
    return f"{m:.{digits}f}" if n == 1 else f"{m:.{digits}f} ± {s:.{digits}f}"


def fmt_values(xs: Sequence[float], digits: int = 3) -> str:
    """:func:`fmt_ms` of the values' mean and std: ``mean ± std`` over several, one value alone, none ``–``."""
    return fmt_ms(mean_std(xs), digits, n=len(xs))


def seed_runs(results: dict[str, Any], arm: str) -> list[dict[str, Any]]:
    """The arm's run record of each seed, in seed order."""
    return [results["runs"][arm][s] for s in sorted(results["runs"].get(arm, {}), key=int)]


def eval_values(results: dict[str, Any], arm: str, n: int, mode: str, metric: str) -> list[float]:
    """The metric of an arm at budget (n, mode), one value per seed."""
    out = []
    for rec in seed_runs(results, arm):
        for e in rec["evals"]:
            if e["n"] == n and (n == 0 or e["mode"] == mode) and metric in e["metrics"]:
                out.append(float(e["metrics"][metric]))
    return out


def eval_entry(rec: dict[str, Any], n: int, mode: str) -> dict[str, Any] | None:
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
        e = eval_entry(results["runs"][arm][s], n, mode)
        if e is None:
            continue
        if "per_task" not in e:
            return []
        for r in e["per_task"]:
            row = rows.setdefault(
                r["task_id"],
                {k: v for k, v in r.items() if k in ("task_id", "domain", "kind", "template")} | {"successes": []},
            )
            row["successes"] = row["successes"] + list(r["successes"])
    return list(rows.values())


@functools.cache
def builtin_template(task_id: str) -> str | None:
    """The template of a built-in suite's task, rebuilt from its id (results written before per-task rows kept
    ``template``); None for a task of any other environment."""
    try:
        return task_from_id(task_id).metadata.get("template")
    except (KeyError, ValueError, IndexError):  # not "<suite>-<split>-<index>" of a built-in suite
        return None


def task_clusters(rows: Sequence[dict[str, Any]]) -> tuple[str, list[str]]:
    """The unit that outcomes move together in, for each per-task row: ``("templates", [template, ...])`` where
    every row has a template (its ``template``, else :func:`builtin_template` of its id) and there are at least
    two, else ``("tasks", [task_id, ...])``: each task its own cluster."""
    names = [r.get("template") or builtin_template(r["task_id"]) for r in rows]
    if all(names) and len(set(names)) >= 2:
        return "templates", [str(n) for n in names]
    return "tasks", [r["task_id"] for r in rows]


def success_cell(results: dict[str, Any], arm: str, n: int, mode: str, spread: bool = False) -> str:
    """``rate [95% CI]``: the success rate of the arm's per-task outcomes pooled over seeds with its Wilson
    interval over tasks (envace.math.stats.rate_interval); ``spread`` appends ``· sd X`` over seeds when there are
    several. Results without per-task outcomes fall back to mean ± std over seeds."""
    rows = per_task_outcomes(results, arm, n, mode)
    per_seed = eval_values(results, arm, n, mode, "success_rate")
    if not rows:
        return fmt_values(per_seed)
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
        for rec in seed_runs(results, arm):
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
    for rec in seed_runs(results, arm):
        f = rec.get("fidelity")
        if not f:
            continue
        s = f["overall"] if group == "overall" else f.get(group, {}).get(name)
        if not s or not s.get("n"):
            continue
        for k in out:
            out[k].append(float(s[k]))
    return out


def over_seeds(per_seed: list[dict[int, float]]) -> tuple[list[int], list[float], list[float]]:
    """(steps, mean, std over seeds) of per-seed curves ``{step: value}``, at the steps every non-empty one has."""
    per_seed = [d for d in per_seed if d]
    if not per_seed:
        return [], [], []
    steps = sorted(set.intersection(*(set(d) for d in per_seed)))
    ms = [mean_std([d[s] for d in per_seed]) for s in steps]
    return steps, [m for m, _ in ms], [s for _, s in ms]


def curve(results: dict[str, Any], arm: str, key: str) -> tuple[list[int], list[float], list[float]]:
    """(steps, mean, std) of a training metric over seeds, at the steps every seed logged."""
    return over_seeds(
        [{int(m["step"]): float(m[key]) for m in rec.get("curve") or [] if key in m} for rec in seed_runs(results, arm)]
    )


def extra_splits(results: dict[str, Any]) -> list[str]:
    """The further held-out splits some run was evaluated on (``splits`` of a run record: the experiment's
    ``ood_split``), sorted."""
    runs = [rec for by_seed in results["runs"].values() for rec in by_seed.values()]
    return sorted({sp for rec in runs for sp in rec.get("splits", {})})


def split_view(results: dict[str, Any], split: str) -> dict[str, Any]:
    """The results as if ``split`` were the evaluation split: each run's ``evals`` replaced by its evaluations on that
    split (``splits[split]``; none where the arm was not evaluated there), the config's ``eval_split`` set to it.
    Every table and claim reads the view as it reads the main results."""
    runs = {
        arm: {s: {**rec, "evals": rec.get("splits", {}).get(split, [])} for s, rec in by_seed.items()}
        for arm, by_seed in results["runs"].items()
    }
    return {**results, "config": {**results["config"], "eval_split": split}, "runs": runs}


def outcome_changes(
    results: dict[str, Any],
    arm: str,
    baseline: str,
    n: int = 0,
    mode: str = "none",
    baseline_at: tuple[int, str] | None = None,
    tasks: Collection[str] | None = None,
) -> dict[str, int] | None:
    """How many outcomes ``arm`` changed against ``baseline`` at budget (n, mode), paired task by task within each
    seed both ran: ``won`` (the arm's mean success on the task above the baseline's), ``lost`` (below), ``same``,
    ``seeds``. None without per-task outcomes to pair. ``baseline_at``: the baseline's budget, if not (n, mode)
    (an arm against itself at N=0); ``tasks``: only these task ids."""
    out = {"won": 0, "lost": 0, "same": 0, "seeds": 0}
    for s in sorted(set(results["runs"].get(arm, {})) & set(results["runs"].get(baseline, {})), key=int):
        ea = eval_entry(results["runs"][baseline][s], *(baseline_at or (n, mode)))
        eb = eval_entry(results["runs"][arm][s], n, mode)
        if ea is None or eb is None or "per_task" not in ea or "per_task" not in eb:
            continue
        out["seeds"] += 1
        base = [r for r in ea["per_task"] if tasks is None or r["task_id"] in tasks]
        for k, v in task_changes(base, eb["per_task"]).items():
            out[k] += v
    return out if out["seeds"] else None


def task_changes(baseline: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Per-task rows (``task_id``, ``successes``) paired with the baseline's on the same tasks: ``won`` (mean
    success above the baseline's), ``lost`` (below), ``same``; tasks the baseline lacks are left out."""
    base = {r["task_id"]: float(np.mean(r["successes"])) for r in baseline}
    out = {"won": 0, "lost": 0, "same": 0}
    for r in rows:
        if r["task_id"] in base:
            d = float(np.mean(r["successes"])) - base[r["task_id"]]
            out["won" if d > 0 else "lost" if d < 0 else "same"] += 1
    return out


MODE_SHORT = {"parallel": "par", "sequential": "seq"}


def budget_label(n: int, mode: str) -> str:
    return "N=0" if n == 0 else f"N={n} {MODE_SHORT.get(mode, mode)}"


__all__ = [
    "seed_runs",
    "mean_std",
    "fmt_ms",
    "fmt_values",
    "eval_values",
    "eval_entry",
    "per_task_outcomes",
    "builtin_template",
    "task_clusters",
    "success_cell",
    "seed_cell",
    "budget_keys",
    "budget_label",
    "fidelity_values",
    "curve",
    "over_seeds",
    "extra_splits",
    "split_view",
    "outcome_changes",
    "task_changes",
    "MODE_SHORT",
]
