"""Does a reward computed on an *imagined* trajectory agree with the *real* outcome of the same Act decisions?

EnvACE trains on rehearsed trajectories: the reward never sees the world, so a reward is only as good as its
agreement with what the world would have said. This module measures that agreement on **shadow rollouts**
(``RolloutConfig.shadow``): the policy acts on its own rehearsed observations, and every call is also executed,
in order, in a private copy of the task's real environment; when the trajectory ends the rollout applies the
environment's own success check to that copy and to the trajectory's (imagined) replies
(``Trajectory.env_outcome``). That is the real outcome of exactly these Act decisions. Each candidate reward is
computed on the imagined trajectory only (calls, rehearsed observations, replies: never the shadow
observations) and compared with it.

Per reward, over the trajectories it scored (a None reward is counted in ``n_unscored`` and left out; a
trajectory whose real check failed to run is left out of every reward and counted in ``n_no_outcome``):

- ``mean``: the mean reward; ``success_rate``: the real success rate of the same trajectories.
- ``auc``: P(reward of a real success > reward of a real failure), ties counting 1/2 (the Mann-Whitney AUC; 0.5 =
  no information, 1 = the reward ranks every success above every failure). None without both outcomes.
- ``group_auc``: the same, over pairs of trajectories *of the same task* only (``n_group_pairs`` such pairs with
  different real outcomes). GRPO's advantages compare trajectories within a task's group, so this is the
  agreement that decides the sign of the update; ``auc`` also credits telling easy tasks from hard ones.
- ``point_biserial``: the Pearson correlation of the reward with real success (0/1). None when either is constant.
- ``full_rate``: the share of trajectories given the full reward (``>= full - 1e-9``; ``full`` is the spec's sum
  of positive weights, 1 for every reward here); ``rewarded_failure_rate``: the share given the full reward
  although the real outcome is a failure: **rewarded hallucinations**, what an RL step on imagined trajectories
  reinforces wrongly; ``fail_given_full``: the same count over the fully rewarded trajectories;
  ``zero_success_rate``: the share given reward 0 although the real outcome is a success.

:func:`agreement_report` gives these overall and per task kind (``task.metadata["kind"]``), plus a bootstrap over
*tasks* (trajectories of a task stay together) of each reward's ``auc`` and ``group_auc`` minus a baseline's
(default ``gold_f1``) with a 95% percentile interval: the paired comparison that a choice of default needs.
:func:`measure_reward_agreement` runs the shadow rollouts and scores them; ``bench/reward_agreement.py`` is its
command line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..backends.base import Backend
from ..rewards.functions import RewardContext, RewardSpec, make_reward, parse_reward_spec
from ..rollout.engine import RolloutConfig, RolloutEngine
from ..core.types import Task, Trajectory

FULL_EPS = 1e-9
DEFAULT_BASELINE = "gold_f1"
METRIC_KEYS: tuple[str, ...] = (
    "n",
    "n_unscored",
    "mean",
    "success_rate",
    "auc",
    "group_auc",
    "n_group_pairs",
    "point_biserial",
    "full_rate",
    "rewarded_failure_rate",
    "fail_given_full",
    "zero_success_rate",
)


# --------------------------------------------------------------------------------------------------------
# Pure metrics
# --------------------------------------------------------------------------------------------------------


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """P(score of a positive > score of a negative) + 1/2 P(tie), over all (positive, negative) pairs; None
    without a positive or without a negative. Computed from mid-ranks (the Mann-Whitney U statistic)."""
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    i = 0
    while i < len(s):  # mid-ranks for ties (1-based)
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2
    return float(u / (n_pos * n_neg))


def group_auc(scores: Sequence[float], labels: Sequence[bool], groups: Sequence[Any]) -> tuple[float | None, int]:
    """:func:`auc` over pairs from the same group only: (P(positive ranked above negative) + 1/2 P(tie), number of
    such (positive, negative) pairs). (None, 0) when no group holds both outcomes."""
    by: dict[Any, list[tuple[float, bool]]] = {}
    for s, y, g in zip(scores, labels, groups):
        by.setdefault(g, []).append((float(s), bool(y)))
    wins, pairs = 0.0, 0
    for items in by.values():
        pos = [s for s, y in items if y]
        neg = [s for s, y in items if not y]
        for p in pos:
            for n in neg:
                wins += 1.0 if p > n else 0.5 if p == n else 0.0
        pairs += len(pos) * len(neg)
    return (wins / pairs if pairs else None), pairs


def point_biserial(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Pearson correlation of the scores with the 0/1 labels; None when either is constant (or fewer than 2)."""
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=float)
    if len(s) < 2 or np.ptp(s) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(s, y)[0, 1])


def agreement(
    scores: Sequence[float | None], labels: Sequence[bool], groups: Sequence[Any], full: float = 1.0
) -> dict[str, Any]:
    """The metrics of the module docstring for one reward. ``scores[i]`` None = unscored (counted, left out)."""
    keep = [i for i, s in enumerate(scores) if s is not None]
    s = [float(scores[i]) for i in keep]  # type: ignore[arg-type]
    y = [bool(labels[i]) for i in keep]
    g = [groups[i] for i in keep]
    n = len(s)
    out: dict[str, Any] = {"n": n, "n_unscored": len(scores) - n}
    if n == 0:
        return out | {k: None for k in METRIC_KEYS if k not in out}
    is_full = [v >= full - FULL_EPS for v in s]
    n_full = sum(is_full)
    n_full_fail = sum(f and not ok for f, ok in zip(is_full, y))
    ga, pairs = group_auc(s, y, g)
    return out | {
        "mean": sum(s) / n,
        "success_rate": sum(y) / n,
        "auc": auc(s, y),
        "group_auc": ga,
        "n_group_pairs": pairs,
        "point_biserial": point_biserial(s, y),
        "full_rate": n_full / n,
        "rewarded_failure_rate": n_full_fail / n,
        "fail_given_full": n_full_fail / n_full if n_full else None,
        "zero_success_rate": sum(v <= FULL_EPS and ok for v, ok in zip(s, y)) / n,
    }


def full_value(spec: RewardSpec) -> float:
    """The largest value a spec can take when each registered reward is in [0, 1]: its sum of positive weights."""
    return sum(w for w in parse_reward_spec(spec).values() if w > 0)


def spec_label(spec: RewardSpec) -> str:
    """A readable name for a spec: ``"gold_f1"``, ``"gold_f1*reply_facts"``, ``"0.5 gold_f1 + 0.5 reply_facts"``."""
    w = parse_reward_spec(spec)
    if len(w) == 1 and next(iter(w.values())) == 1.0:
        return next(iter(w))
    return " + ".join(f"{v:g} {k}" for k, v in w.items())


# --------------------------------------------------------------------------------------------------------
# Records and the report
# --------------------------------------------------------------------------------------------------------


@dataclass
class Record:
    """One imagined trajectory: its task, the task's kind, the real outcome of its calls and each reward's value."""

    task_id: str
    kind: str
    real_success: bool | None
    """The environment's own check on the shadow copy (None: no real outcome, e.g. the check crashed)."""
    rewards: dict[str, float | None]
    """Reward label (:func:`spec_label`) -> value on the imagined trajectory (None: unscored)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "kind": self.kind,
            "real_success": self.real_success,
            "rewards": dict(self.rewards),
        }


def real_success(traj: Trajectory) -> bool | None:
    """The real outcome of a shadow (or real) trajectory, from ``env_outcome``; None where there is none."""
    out = traj.env_outcome
    if not out or "success" not in out:
        return None
    return bool(out["success"])


def score_records(
    tasks: Sequence[Task], trajs: Sequence[Trajectory], specs: Sequence[RewardSpec], ctx: RewardContext | None = None
) -> list[Record]:
    """Score every trajectory with every spec (on the imagined trajectory; ``traj.reward`` is left alone)."""
    ctx = ctx or RewardContext()
    by_id = {t.id: t for t in tasks}
    fns = {spec_label(s): make_reward(s) for s in specs}
    out = []
    for traj in trajs:
        task = by_id[traj.task_id]
        values = {name: fn(task, traj, ctx).value for name, fn in fns.items()}
        out.append(Record(task.id, str(task.metadata.get("kind", "unknown")), real_success(traj), values))
    return out


def _metrics(records: Sequence[Record], name: str, full: float) -> dict[str, Any]:
    return agreement(
        [r.rewards[name] for r in records], [bool(r.real_success) for r in records], [r.task_id for r in records], full
    )


def bootstrap_difference(
    records: Sequence[Record],
    name: str,
    baseline: str,
    metric: str = "auc",
    resamples: int = 1000,
    seed: int = 0,
    full: float = 1.0,
) -> dict[str, Any]:
    """``metric`` of reward ``name`` minus the baseline's, on the same records, with a 95% percentile interval from
    resampling *tasks* with replacement (each task's trajectories together; the same resample for both rewards).
    Trajectories either reward left unscored are dropped for both. Resamples where either metric is undefined
    are skipped and counted (``n_undefined``)."""
    both = [r for r in records if r.rewards[name] is not None and r.rewards[baseline] is not None]
    point_a, point_b = _metrics(both, name, full)[metric], _metrics(both, baseline, 1.0)[metric]
    diff = None if point_a is None or point_b is None else point_a - point_b
    by_task: dict[str, list[Record]] = {}
    for r in both:
        by_task.setdefault(r.task_id, []).append(r)
    ids = sorted(by_task)
    rng = np.random.default_rng(seed)
    diffs, undefined = [], 0
    for _ in range(resamples if ids else 0):
        # a resampled task appears under a fresh group id, so group_auc never pairs two copies of one task
        sample = [
            Record(f"{k}:{r.task_id}", r.kind, r.real_success, r.rewards)
            for k, i in enumerate(rng.integers(0, len(ids), len(ids)))
            for r in by_task[ids[i]]
        ]
        a, b = _metrics(sample, name, full)[metric], _metrics(sample, baseline, 1.0)[metric]
        if a is None or b is None:
            undefined += 1
        else:
            diffs.append(a - b)
    lo, hi = (float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))) if diffs else (None, None)
    return {
        "metric": metric,
        "baseline": baseline,
        "diff": diff,
        "ci95": [lo, hi],
        "resamples": resamples,
        "n_undefined": undefined,
    }


def agreement_report(
    records: Sequence[Record],
    specs: Sequence[RewardSpec],
    baseline: str | None = DEFAULT_BASELINE,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Per reward: the metrics overall and per task kind, and (when ``baseline`` is one of the rewards) the
    bootstrap difference of ``auc`` and ``group_auc`` to it. Records without a real outcome are counted and left out."""
    usable = [r for r in records if r.real_success is not None]
    kinds = sorted({r.kind for r in usable})
    labels = [spec_label(s) for s in specs]
    fulls = {spec_label(s): full_value(s) for s in specs}
    out: dict[str, Any] = {
        "n_trajectories": len(records),
        "n_no_outcome": len(records) - len(usable),
        "n_tasks": len({r.task_id for r in usable}),
        "real_success_rate": (sum(bool(r.real_success) for r in usable) / len(usable)) if usable else None,
        "kinds": {k: sum(r.kind == k for r in usable) for k in kinds},
        "baseline": baseline if baseline in labels else None,
        "rewards": {},
    }
    for name in labels:
        entry: dict[str, Any] = {
            "overall": _metrics(usable, name, fulls[name]),
            "by_kind": {k: _metrics([r for r in usable if r.kind == k], name, fulls[name]) for k in kinds},
        }
        if out["baseline"] is not None and name != baseline:
            entry["vs_baseline"] = {
                m: bootstrap_difference(usable, name, baseline, m, resamples, seed, fulls[name])
                for m in ("auc", "group_auc")
            }
        out["rewards"][name] = entry
    return out


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}f}"


def _fmt_diff(d: Mapping[str, Any] | None) -> str:
    if not d or d.get("diff") is None:
        return "–"
    lo, hi = d["ci95"]
    return f"{d['diff']:+.3f} [{_fmt(lo)}, {_fmt(hi)}]"


def format_report(report: Mapping[str, Any]) -> str:
    """Markdown: one table overall (with the differences to the baseline), one row per (reward, kind) after it."""
    base = report.get("baseline")
    head = (
        "| reward | n | unscored | mean | AUC | group AUC (pairs) | "
        "point-biserial | full reward | rewarded failures | fail given full |"
    )
    if base:
        head += f" AUC − {base} [95% CI] | group AUC − {base} [95% CI] |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, e in report["rewards"].items():
        m = e["overall"]
        row = (
            f"| `{name}` | {m['n']} | {m['n_unscored']} | {_fmt(m['mean'])} | {_fmt(m['auc'])} | "
            f"{_fmt(m['group_auc'])} ({m['n_group_pairs'] or 0}) | {_fmt(m['point_biserial'])} | "
            f"{_fmt(m['full_rate'])} | {_fmt(m['rewarded_failure_rate'])} | {_fmt(m['fail_given_full'])} |"
        )
        if base:
            vs = e.get("vs_baseline", {})
            row += f" {_fmt_diff(vs.get('auc'))} | {_fmt_diff(vs.get('group_auc'))} |"
        lines.append(row)
    kinds = list(report.get("kinds", {}))
    if kinds:
        lines += [
            "",
            "By task kind (" + ", ".join(f"{k}: {n} trajectories" for k, n in report["kinds"].items()) + "):",
            "",
        ]
        lines.append("| reward | kind | real success | mean | AUC | group AUC (pairs) | rewarded failures |")
        lines.append("|---|---|---|---|---|---|---|")
        for name, e in report["rewards"].items():
            for k in kinds:
                m = e["by_kind"][k]
                lines.append(
                    f"| `{name}` | {k} | {_fmt(m['success_rate'])} | {_fmt(m['mean'])} | {_fmt(m['auc'])} | "
                    f"{_fmt(m['group_auc'])} ({m['n_group_pairs'] or 0}) | {_fmt(m['rewarded_failure_rate'])} |"
                )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------------------


def shadow_rollouts(
    policy: Backend,
    tasks: list[Task],
    rollout_cfg: RolloutConfig,
    batch_tasks: int = 8,
    *,
    group_size: int | None = None,
    seed: int | None = None,
) -> list[Trajectory]:
    """Rehearsal rollouts with the shadow environment on (the policy's own Rehearse), ``batch_tasks`` tasks per
    engine run (bounds the KV caches held at once); ``group_size`` per task from ``seed`` (None: the deprecated
    fields of ``rollout_cfg``). A ``rollout_cfg`` that still sets the deprecated ``mode`` to another mode than
    rehearsal is an error."""
    if rollout_cfg.mode != "rehearsal":
        raise ValueError(
            "reward agreement needs rehearsal rollouts with shadow=True (the real outcome of imagined trajectories)"
        )
    engine = RolloutEngine(policy, rollout_cfg, mode="rehearsal", shadow=True)
    out: list[Trajectory] = []
    for i in range(0, len(tasks), batch_tasks):
        out += engine.run(tasks[i : i + batch_tasks], group_prefix=f"b{i}-", group_size=group_size, seed=seed)
    return out


def measure_reward_agreement(
    policy: Backend,
    tasks: list[Task],
    specs: Sequence[RewardSpec],
    rollout_cfg: RolloutConfig,
    ctx: RewardContext | None = None,
    batch_tasks: int = 8,
    baseline: str | None = DEFAULT_BASELINE,
    resamples: int = 1000,
    seed: int = 0,
    *,
    group_size: int | None = None,
    rollout_seed: int | None = None,
) -> tuple[dict[str, Any], list[Record], list[Trajectory]]:
    """Shadow rollouts of ``tasks`` (``group_size`` each, sampled from ``rollout_seed``: :func:`shadow_rollouts`),
    every spec scored on each imagined trajectory, and :func:`agreement_report` (bootstrap seeded ``seed``)."""
    trajs = shadow_rollouts(policy, tasks, rollout_cfg, batch_tasks, group_size=group_size, seed=rollout_seed)
    records = score_records(tasks, trajs, specs, ctx)
    return agreement_report(records, specs, baseline, resamples, seed), records, trajs
