"""Evaluation in the real environment: success, pass^k, tool F1, format validity, steps, tokens, time.

Each task is run K times (``samples``) for real (``real`` rollout mode) by a policy (``envace.evaluation.policy``):
a backend acting at once, or one that rehearses privately first (``envace.evaluation.tts.Rehearsing``), whose
records, metrics and tokens come back with its trials; :func:`evaluate` never calls back into it. Evaluation at a
budget of N attempts, and of a model by name on a suite, is one layer up (``envace.evaluation.budget``:
``evaluate_at_budget``, ``evaluate_model``), above both this module and ``envace.evaluation.tts``.
Success is the task's own check (``grounded`` reward) applied to the environment each trajectory ran in: the
rollout records it when the trajectory ends (``Trajectory.env_outcome``), so every call of a real trial is
executed exactly once (no replay: an MCP server's tools, or any with side effects, never run twice).

Metrics (keys of :attr:`EvalResult.metrics`):

- ``success_rate``: mean success over all N_tasks x K trials; ``pass^k`` for k = 1..K: tau2-bench's
  pass^k (:func:`pass_hat_k`) averaged over tasks (pass^1 equals the success rate).
- ``tool_precision`` / ``tool_recall`` / ``tool_f1``: FinMCP-Bench's TF1, the F1 of the *set* of called tool
  names vs the set of gold tool names (:func:`envace.rewards.functions.tool_name_prf`), per trial, averaged over the
  trials of a task and then over tasks. ``call_precision`` / ``call_recall`` / ``call_f1``: the same over
  (name, canonical arguments) multisets (:func:`envace.rewards.functions.call_prf`).
- ``format_valid_rate``: fraction of Act generations that parsed (a tool call or a text reply).
- ``steps_per_traj``, ``tool_calls_per_traj``, ``act_tokens_per_traj`` (generated Act tokens),
  ``context_tokens_per_traj`` (length of the final Act context), ``truncated_rate``, ``wall_s``.
- ``env/<fault>`` for each of ``envace.envs.FAULT_KINDS`` (``env/tool_exception``, ``env/timeout``, ...): how
  many calls the real environments answered with that fault, over all trials (an MCP server that crashed or
  hung shows here, not only in the trajectories).
- ``domain/<env>/success_rate`` per environment of the task set, and ``kind/<kind>/success_rate`` per task
  kind when tasks carry ``metadata["kind"]``; ``n_tasks``.
- Every success rate (and pass^k) ``key`` has its 95% interval over tasks in ``key/ci_lo`` and ``key/ci_hi``:
  the Wilson interval over tasks of the per-task mean (:func:`envace.math.stats.rate_interval`: exact Wilson with one
  sample per task, conservative with more). :func:`format_metrics` prints it next to the rate.

**Prepared tasks.** Before the trials, :func:`evaluate` lets each task's environment prepare it
(:func:`envace.envs.prepare_tasks`; a no-op for every task that needs nothing): BFCL's memory questions with
``writer=model`` first have the model under test play their scenario's prerequisite sessions, in order, which
write the memory the questions start from. Those episodes run with the model under test in real mode
(:func:`player`), are never scored nor counted in any metric but ``prepare/...`` (``prepare/episodes``,
``prepare/truncated_rate``, ``prepare/tool_calls_per_traj``, ``prepare/wall_s``), and are kept in
:attr:`EvalResult.prepared`.

A suite with its own report (``envace.envs.SUMMARIES``; BFCL: its leaderboard table with the overall score)
adds it to the result of ``envace.evaluation.budget.evaluate_model`` (``EvalResult.summary``), printed after the metrics
and saved.

Results keep per-task outcomes (``per_task``: ``task_id``, ``domain``, ``kind`` if any, ``successes`` one bool
per sample, the F1s), the suite, the split and the task ids, so :func:`compare_results` (``envace compare``) can
compare two saved results on the same tasks later, paired (envace.math.stats), without rerunning any model.

:func:`task_scores` and :func:`summarize` are pure (trajectories in, numbers out) and tested by hand.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..backends.base import Backend
from ..core.atomic import write_json
from ..envs import FAULT_KINDS, Play, prepare_tasks
from ..rewards.functions import call_prf, tool_name_prf
from ..rollout.engine import RolloutConfig, RolloutEngine
from ..math.stats import fmt_p, fmt_rate, paired_comparison, rate_interval, seed_cluster_bootstrap
from ..core.types import Task, Trajectory
from .policy import Policy, add_token_counts, as_policy
from .results import task_clusters

# Metrics shown by :meth:`EvalResult.table` first, in this order (others follow alphabetically).
HEADLINE = (
    "success_rate",
    "pass^1",
    "tool_f1",
    "tool_precision",
    "tool_recall",
    "call_f1",
    "call_precision",
    "call_recall",
    "format_valid_rate",
    "steps_per_traj",
    "tool_calls_per_traj",
    "act_tokens_per_traj",
    "context_tokens_per_traj",
    "truncated_rate",
    "wall_s",
)
CI_LO, CI_HI = "/ci_lo", "/ci_hi"
"""Suffixes of the 95% interval keys of a rate metric (``success_rate/ci_lo``)."""


def pass_hat_k(successes: Sequence[bool], k: int) -> float:
    """tau2-bench's pass^k for one task: the chance that k draws without replacement from its n trials all
    succeed, C(c, k) / C(n, k) with c successes."""
    n, c = len(successes), sum(bool(s) for s in successes)
    if k < 1:
        raise ValueError(f"pass^k needs k >= 1, got {k}")
    if k > n:
        raise ValueError(f"pass^{k} needs at least {k} trials, got {n}")
    return math.comb(c, k) / math.comb(n, k)


@dataclass
class EvalResult:
    metrics: dict[str, float]
    per_task: list[dict[str, Any]] = field(default_factory=list)
    """One :func:`task_scores` row per task, in task order (per-sample successes included)."""
    trajectories: list[Trajectory] = field(default_factory=list)
    suite: str = ""
    """The suite the tasks came from ("" when unknown: :func:`evaluate` got tasks, not a suite)."""
    split: str = ""
    """The tasks' split ("+"-joined when they mix splits)."""
    summary: dict[str, Any] | None = None
    """The suite's own report of the per-task results (``envace.envs.suite_summary``: BFCL's leaderboard table),
    or None; :meth:`table` prints its ``text`` after the metrics."""
    prepared: list[Trajectory] = field(default_factory=list)
    """The episodes played to prepare the tasks (:func:`prepare`: BFCL memory's prerequisite sessions with
    ``writer=model``), in play order; never scored (``reward`` None), in no metric but ``prepare/...``."""
    records: list[Any] = field(default_factory=list)
    """The policy's own per-task records (test-time rehearsal: ``RehearsalRecord``s; none for a backend acting
    at once); not part of :meth:`to_dict` (``envace.evaluation.tts.save_records`` writes them)."""

    def table(self) -> str:
        text = format_metrics(self.metrics)
        return text + "\n\n" + self.summary["text"] if self.summary else text

    def to_dict(self, with_trajectories: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {
            "suite": self.suite,
            "split": self.split,
            "task_ids": [p["task_id"] for p in self.per_task],
            "metrics": self.metrics,
            "per_task": self.per_task,
        }
        if self.summary is not None:
            d["summary"] = self.summary
        if with_trajectories:
            d["trajectories"] = [t.to_dict(with_rows=False) for t in self.trajectories]
            if self.prepared:
                d["prepared_trajectories"] = [t.to_dict(with_rows=False) for t in self.prepared]
        return d


def format_metrics(metrics: dict[str, float]) -> str:
    """A two-column text table, headline metrics first; a rate with an interval (``key/ci_lo``, ``key/ci_hi``)
    prints as ``0.500 [0.237, 0.763] (95% CI over tasks)``."""
    shown = [k for k in metrics if not k.endswith((CI_LO, CI_HI))]
    passes = sorted((k for k in shown if k.startswith("pass^")), key=lambda k: int(k[5:]))
    keys = [k for k in HEADLINE if k in metrics and k != "pass^1"]
    keys[1:1] = passes
    keys += sorted(k for k in shown if k not in keys)
    w = max((len(k) for k in keys), default=10)
    return "\n".join(f"{k:<{w}}  {_value(metrics, k)}" for k in keys)


def _value(metrics: dict[str, float], key: str) -> str:
    if key + CI_LO in metrics and key + CI_HI in metrics:
        return fmt_rate(metrics[key], metrics[key + CI_LO], metrics[key + CI_HI]) + " (95% CI over tasks)"
    return f"{metrics[key]:.4g}"


def rate_with_ci(metrics: dict[str, float], key: str = "success_rate", digits: int = 3) -> str:
    """``0.500 [0.237, 0.763]``, or just the rate when the metrics have no interval for it."""
    if key + CI_LO in metrics and key + CI_HI in metrics:
        return fmt_rate(metrics[key], metrics[key + CI_LO], metrics[key + CI_HI], digits)
    return f"{metrics[key]:.{digits}f}"


def _with_ci(m: dict[str, float], key: str, per_task_values: Sequence[Sequence[float]]) -> None:
    """Set the 95% interval keys of ``m[key]``: the Wilson interval over tasks of the per-task means (every task
    has its K samples, so the mean over tasks of per-task means is ``m[key]``). No task: no interval."""
    if per_task_values:
        _, m[key + CI_LO], m[key + CI_HI] = rate_interval(per_task_values)


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if len(xs) else 0.0


def task_scores(task: Task, trajs: Sequence[Trajectory]) -> dict[str, Any]:
    """Per-task scores of its K trials (rewards already set by the success check): the successes, and tool /
    call precision, recall and F1 against the gold actions, each averaged over the trials."""
    gold = task.flat_gold()
    tool = [tool_name_prf(t.calls(), gold) for t in trajs]
    call = [call_prf(t.calls(), gold) for t in trajs]
    out: dict[str, Any] = {"task_id": task.id, "domain": task.env, "successes": [bool(t.reward) for t in trajs]}
    for key in ("kind", "template"):  # what the report groups tasks by (envace.evaluation.claims: clusters)
        if key in task.metadata:
            out[key] = task.metadata[key]
    for name, prf in (("tool", tool), ("call", call)):
        for i, part in enumerate(("precision", "recall", "f1")):
            out[f"{name}_{part}"] = _mean([x[i] for x in prf])
    out["steps"] = _mean([len(t.steps) for t in trajs])
    return out


def summarize(
    per_task: Sequence[dict[str, Any]], trajs: Sequence[Trajectory], samples: int, wall_s: float = 0.0
) -> dict[str, float]:
    """Aggregate :func:`task_scores` rows and the trajectories' counters into the metrics of the module docstring."""
    n = max(1, len(trajs))
    acts = sum(t.counters.get("act/steps", 0) for t in trajs)
    parse_err = sum(t.counters.get("act/parse_errors", 0) for t in trajs)
    act_rows = [r for t in trajs for r in t.rows if r.role == "act"]
    last_act = [next((r for r in reversed(t.rows) if r.role == "act"), None) for t in trajs]
    m = success_metrics(per_task, samples)
    for key in ("tool_precision", "tool_recall", "tool_f1", "call_precision", "call_recall", "call_f1"):
        m[key] = _mean([p[key] for p in per_task])
    m |= {
        "format_valid_rate": 1.0 - parse_err / max(1, acts),
        "tool_calls_per_traj": sum(t.counters.get("act/tool_calls", 0) for t in trajs) / n,
        "steps_per_traj": _mean([len(t.steps) for t in trajs]),
        "act_tokens_per_traj": sum(len(r.completion_ids) for r in act_rows) / n,
        "context_tokens_per_traj": sum(len(r.prompt_ids) + len(r.completion_ids) for r in last_act if r is not None)
        / n,
        "truncated_rate": _mean([t.truncated is not None for t in trajs]),
        "wall_s": float(wall_s),
    }
    m |= fault_counts(trajs)
    return m


def success_metrics(per_task: Sequence[dict[str, Any]], samples: int) -> dict[str, float]:
    """The metrics that read only the per-task successes: ``success_rate``, ``pass^k`` (k = 1..samples), each with
    its interval, ``n_tasks``, and ``domain/<env>/success_rate`` / ``kind/<kind>/success_rate`` with theirs (part
    of :func:`summarize`; a stored evaluation whose successes were rescored gets its rates again from it)."""
    m: dict[str, float] = {"success_rate": _mean([s for p in per_task for s in p["successes"]])}
    _with_ci(m, "success_rate", [p["successes"] for p in per_task])
    for k in range(1, samples + 1):
        m[f"pass^{k}"] = _mean([pass_hat_k(p["successes"], k) for p in per_task])
        _with_ci(m, f"pass^{k}", [[pass_hat_k(p["successes"], k)] for p in per_task])
    m["n_tasks"] = float(len(per_task))
    for group in ("domain", "kind"):
        for name in sorted({str(p[group]) for p in per_task if group in p}):
            rows = [p["successes"] for p in per_task if str(p.get(group)) == name]
            m[f"{group}/{name}/success_rate"] = _mean([s for r in rows for s in r])
            _with_ci(m, f"{group}/{name}/success_rate", rows)
    return m


def fault_counts(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """``env/<fault>``: calls answered with each fault (every one of FAULT_KINDS, 0 included, and any other
    ``env/`` counter), summed over the trajectories."""
    keys = {f"env/{k}" for k in FAULT_KINDS} | {k for t in trajs for k in t.counters if k.startswith("env/")}
    return {k: float(sum(t.counters.get(k, 0) for t in trajs)) for k in sorted(keys)}


def player(policy: Backend, rollout: RolloutConfig, played: list[Trajectory], seed: int | None = None) -> Play:
    """The :data:`envace.envs.Play` of an evaluation: each task once, with ``policy`` in real mode and ``rollout``'s
    settings, except that an episode may take ``max_steps_per_turn`` steps per user turn (at least ``max_steps``)
    so that a conversation reaches its last turn unless the model itself runs over a turn's bound. Its
    trajectories are appended to ``played``; each batch has its progress bar (``prepare[<batch>]``). ``seed``: the
    episodes' (None: ``rollout.seed``, deprecated)."""

    batches = 0

    def play(tasks: list[Task]) -> list[Trajectory]:
        nonlocal batches
        turns = max((len(t.user_turns) for t in tasks), default=1)
        cfg = dataclasses.replace(rollout, max_steps=max(rollout.max_steps, rollout.max_steps_per_turn * turns))
        batches += 1
        trajs = RolloutEngine(policy, cfg, mode="real", shadow=False).run(
            tasks, group_prefix=f"prepare{batches}.", desc=f"prepare[{batches}]", group_size=1, seed=seed
        )
        played.extend(trajs)
        return trajs

    return play


def prepare(
    policy: Backend, tasks: list[Task], rollout: RolloutConfig, seed: int | None = None
) -> tuple[list[Task], list[Trajectory]]:
    """The tasks ready to run (:func:`envace.envs.prepare_tasks`, played by :func:`player`) and the episodes that
    took, in play order (none when no task needed preparing)."""
    played: list[Trajectory] = []
    return prepare_tasks(tasks, player(policy, rollout, played, seed)), played


def prepare_metrics(played: Sequence[Trajectory], wall_s: float = 0.0) -> dict[str, float]:
    """``prepare/...`` metrics of the episodes that prepared the tasks (none: no key)."""
    if not played:
        return {}
    return {
        "prepare/episodes": float(len(played)),
        "prepare/truncated_rate": _mean([t.truncated is not None for t in played]),
        "prepare/tool_calls_per_traj": _mean([len(t.calls()) for t in played]),
        "prepare/wall_s": float(wall_s),
    }


def evaluate(
    policy: Backend | Policy,
    tasks: list[Task],
    samples: int = 1,
    rollout: RolloutConfig | None = None,
    memory: dict[str, str] | None = None,
    seed: int | None = None,
) -> EvalResult:
    """Run every task ``samples`` times against its real environment and compute the metrics; ``rollout`` says how
    (its mode, group size and shadow are not used), ``seed`` seeds the sampling (None: ``rollout.seed``,
    deprecated).

    ``policy`` is a backend (it acts at once: :class:`envace.evaluation.policy.Plain`, showing Act ``memory``, task
    id -> text, where given) or a policy (:class:`envace.evaluation.policy.Policy`; test-time rehearsal:
    :class:`envace.evaluation.tts.Rehearsing`), whose records and metrics come with the result and whose private
    tokens go into the per-task rows (:func:`envace.evaluation.policy.add_token_counts`). The tasks are prepared
    first (:func:`prepare`, played by ``policy.backend``; see the module docstring). ``trajectories`` come task by
    task, ``samples`` per task, in the order of ``tasks``."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    agent = as_policy(policy, memory)
    cfg = rollout or RolloutConfig()
    seed = cfg.seed if seed is None else seed
    t0 = time.perf_counter()
    tasks, played = prepare(agent.backend, tasks, cfg, seed)
    prepare_s = time.perf_counter() - t0
    acted = agent.act(tasks, cfg, samples=samples, seed=seed)  # a private phase (if any), then the real trials, scored
    trajs = acted.trajectories
    by_task: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_task.setdefault(t.task_id, []).append(t)
    per_task = [task_scores(task, by_task.get(task.id, [])) for task in tasks]
    if acted.private_tokens is not None:
        add_token_counts(per_task, trajs, acted.private_tokens)
    metrics = summarize(per_task, trajs, samples, acted.wall_s) | prepare_metrics(played, prepare_s) | acted.metrics
    return EvalResult(metrics, per_task, trajs, split=split_of(tasks), prepared=played, records=acted.records)


def split_of(tasks: Sequence[Task]) -> str:
    """The tasks' split, "+"-joined (sorted) when they mix splits."""
    return "+".join(sorted({t.split for t in tasks}))


def save_result(
    res: EvalResult, path: str, config: dict[str, Any] | None = None, with_trajectories: bool = False
) -> None:
    """Write the metrics and per-task rows (and optionally the trajectories, without rows) as JSON."""
    d = res.to_dict(with_trajectories)
    if config is not None:
        d = {"config": config, **d}
    write_json(path, d, default=str)


# --------------------------------------------------------------------------------------------------------
# Paired comparison of two saved results (envace compare)
# --------------------------------------------------------------------------------------------------------


def load_result(path: str) -> dict[str, Any]:
    """A saved evaluation result (:func:`save_result`) as a dict; an error names the file if it is not one."""
    with open(path, encoding="utf-8") as f:
        try:
            d = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not JSON: {e}") from e
    if not isinstance(d, dict) or not isinstance(d.get("per_task"), list):
        raise ValueError(
            f"{path} is not a saved evaluation result (no per_task list; write one with envace eval --out)"
        )
    for i, row in enumerate(d["per_task"]):
        if (
            not isinstance(row, dict)
            or "task_id" not in row
            or not isinstance(row.get("successes"), list)
            or not row["successes"]
        ):
            raise ValueError(f"{path}: per_task[{i}] has no task_id or no per-sample successes")
    return d


def result_identity(d: dict[str, Any]) -> tuple[str, str, list[str]]:
    """(suite, split, task ids) of a saved result; suite and split fall back to its ``config``."""
    conf = d.get("config") or {}
    suite = d.get("suite") or conf.get("suite") or ""
    split = d.get("split") or conf.get("split") or ""
    return str(suite), str(split), [str(r["task_id"]) for r in d["per_task"]]


def comparison_mismatch(
    a: dict[str, Any], b: dict[str, Any], names: tuple[str, str] = ("A", "B"), examples: int = 3
) -> str | None:
    """Why two saved results cannot be compared paired (other suite, split or task set), or None."""
    (sa, pa, ta), (sb, pb, tb) = result_identity(a), result_identity(b)
    na, nb = names
    for label, x, y in (("suites", sa, sb), ("splits", pa, pb)):
        if x and y and x != y:
            return f"different {label}: {na} is {x!r}, {nb} is {y!r}"
    for name, ids in ((na, ta), (nb, tb)):
        dup = sorted(i for i, c in Counter(ids).items() if c > 1)
        if dup:
            return f"{name} lists task ids more than once: {', '.join(dup[:examples])}"
    only_a, only_b = sorted(set(ta) - set(tb)), sorted(set(tb) - set(ta))
    if only_a or only_b:
        ex = lambda xs: ", ".join(xs[:examples]) + (", ..." if len(xs) > examples else "")  # noqa: E731
        parts = ([f"{len(only_a)} only in {na} ({ex(only_a)})"] if only_a else []) + (
            [f"{len(only_b)} only in {nb} ({ex(only_b)})"] if only_b else []
        )
        return (
            f"different task sets: {len(only_a) + len(only_b)} task ids differ ({len(ta)} in {na}, {len(tb)} in {nb}): "
            + "; ".join(parts)
        )
    return None


def compare_per_task(
    rows_a: Sequence[dict[str, Any]], rows_b: Sequence[dict[str, Any]], resamples: int = 10_000, seed: int = 0
) -> dict[str, Any]:
    """Paired comparison (:func:`envace.math.stats.paired_comparison`) of two per-task lists over the tasks they share,
    aligned by task id: ``overall``, ``by_kind`` (tasks with ``kind``) and ``by_domain`` (with several domains),
    each ``{"n_tasks", "a": {"rate", "ci95"}, "b": {...}, "diff", "diff_ci95", "p", "p_method"}``. Where the tasks
    have two or more templates, ``overall`` also has ``diff_ci95_templates`` and ``n_templates``: the interval with
    whole templates resampled (:func:`envace.math.stats.seed_cluster_bootstrap`; a policy acts by template, so its
    tasks of one template succeed or fail together and the interval over tasks is too narrow for another draw of
    templates)."""
    by_b = {r["task_id"]: r for r in rows_b}
    pairs = [(r, by_b[r["task_id"]]) for r in rows_a if r["task_id"] in by_b]

    def cmp(ps: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
        c = paired_comparison([x["successes"] for x, _ in ps], [y["successes"] for _, y in ps], resamples, seed)
        rate = lambda r: {"rate": r[0], "ci95": [r[1], r[2]]}  # noqa: E731
        return {
            "n_tasks": c["n_tasks"],
            "a": rate(c["a"]),
            "b": rate(c["b"]),
            "diff": c["diff"],
            "diff_ci95": list(c["diff_ci"]),
            "p": c["p"],
            "p_method": c["p_method"],
        }

    out: dict[str, Any] = {"overall": cmp(pairs)}
    kind, clusters = task_clusters([x for x, _ in pairs])
    if kind == "templates":
        d = [float(np.mean(y["successes"]) - np.mean(x["successes"])) for x, y in pairs]
        b = seed_cluster_bootstrap([0] * len(d), clusters, d, resamples, seed)
        out["overall"] |= {"diff_ci95_templates": list(b["ci"]), "n_templates": b["n_clusters"]}
    for group in ("kind", "domain"):
        names = sorted({str(x[group]) for x, _ in pairs if group in x})
        if group == "domain" and len(names) < 2:
            continue
        out[f"by_{group}"] = {n: cmp([(x, y) for x, y in pairs if str(x.get(group)) == n]) for n in names}
    return out


def compare_results(
    a: dict[str, Any], b: dict[str, Any], names: tuple[str, str] = ("A", "B"), resamples: int = 10_000, seed: int = 0
) -> dict[str, Any]:
    """Compare saved result ``b`` with ``a`` on the same tasks (``envace compare``); refuses (ValueError naming
    the mismatch) results of other suites, splits or task sets."""
    why = comparison_mismatch(a, b, names)
    if why is not None:
        raise ValueError(f"cannot compare {names[0]} and {names[1]}: {why}")
    suite, split, ids = result_identity(a)
    samples = sorted({len(r["successes"]) for d in (a, b) for r in d["per_task"]})
    return {
        "a": names[0],
        "b": names[1],
        "suite": suite or result_identity(b)[0],
        "split": split or result_identity(b)[1],
        "n_tasks": len(ids),
        "samples": samples,
        "resamples": resamples,
        "seed": seed,
        **compare_per_task(a["per_task"], b["per_task"], resamples, seed),
    }


P_METHODS = {"mcnemar_exact": "exact McNemar", "sign_flip": "paired sign-flip permutation"}


def format_comparison(c: dict[str, Any]) -> str:
    """The table of :func:`compare_results`: per group, A and B success with 95% Wilson intervals over tasks,
    the difference B - A with its paired bootstrap 95% interval, and the p-value."""
    head = ["", "n", "A success [95% CI]", "B success [95% CI]", "B - A", "paired 95% CI", "p"]
    rows = []

    def row(name: str, x: dict[str, Any]) -> list[str]:
        lo, hi = x["diff_ci95"]
        return [
            name,
            str(x["n_tasks"]),
            fmt_rate(x["a"]["rate"], *x["a"]["ci95"]),
            fmt_rate(x["b"]["rate"], *x["b"]["ci95"]),
            f"{x['diff']:+.3f}",
            f"[{lo:+.3f}, {hi:+.3f}]",
            fmt_p(x["p"]),
        ]

    rows.append(row("overall", c["overall"]))
    for group in ("by_kind", "by_domain"):
        for name, x in c.get(group, {}).items():
            rows.append(row(f"{group[3:]}/{name}", x))
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    lines = [
        f"A = {c['a']}, B = {c['b']}: {c['suite'] or '?'}/{c['split'] or '?'}, "
        f"{c['n_tasks']} tasks, samples per task {'/'.join(map(str, c['samples']))}"
    ]
    lines += [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
        for r in [head] + rows
    ]
    methods = sorted(
        {c["overall"]["p_method"], *(x["p_method"] for g in ("by_kind", "by_domain") for x in c.get(g, {}).values())}
    )
    lines.append(
        "intervals: Wilson over tasks (per-task mean success); B - A: paired bootstrap over tasks "
        f"({c['resamples']} resamples, seed {c['seed']}); p: {', '.join(P_METHODS.get(m, m) for m in methods)}"
    )
    if "diff_ci95_templates" in c["overall"]:
        lo, hi = c["overall"]["diff_ci95_templates"]
        lines.append(
            f"overall B - A with whole templates resampled ({c['overall']['n_templates']} templates; a policy acts by "
            f"template, so this is the interval for another draw of templates): [{lo:+.3f}, {hi:+.3f}]"
        )
    return "\n".join(lines)
