"""Evaluation in the real environment: success, pass^k, tool F1, format validity, steps, tokens, time.

Each task is run K times (``samples``) for real (``real`` rollout mode), optionally after private test-time
rehearsal with a budget of N attempts (:func:`evaluate_at_budget`, which hands N > 0 to ``envace.tts``).
Success is the task's own check (``grounded`` reward) applied to the environment each trajectory ran in: the
rollout records it when the trajectory ends (``Trajectory.env_outcome``), so every call of a real trial is
executed exactly once (no replay: an MCP server's tools, or any with side effects, never run twice).

Metrics (keys of :attr:`EvalResult.metrics`):

- ``success_rate``: mean success over all N_tasks x K trials; ``pass^k`` for k = 1..K: tau2-bench's
  pass^k (:func:`pass_hat_k`) averaged over tasks (pass^1 equals the success rate).
- ``tool_precision`` / ``tool_recall`` / ``tool_f1``: FinMCP-Bench's TF1, the F1 of the *set* of called tool
  names vs the set of gold tool names (:func:`envace.rewards.tool_name_prf`), per trial, averaged over the
  trials of a task and then over tasks. ``call_precision`` / ``call_recall`` / ``call_f1``: the same over
  (name, canonical arguments) multisets (:func:`envace.rewards.call_prf`).
- ``format_valid_rate``: fraction of Act generations that parsed (a tool call or a text reply).
- ``steps_per_traj``, ``tool_calls_per_traj``, ``act_tokens_per_traj`` (generated Act tokens),
  ``context_tokens_per_traj`` (length of the final Act context), ``truncated_rate``, ``wall_s``.
- ``domain/<env>/success_rate`` per environment of the task set.

:func:`task_scores` and :func:`summarize` are pure (trajectories in, numbers out) and tested by hand.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .backends.base import Backend
from .rewards import REWARDS, RewardContext, call_prf, tool_name_prf
from .rollout import RolloutConfig, RolloutEngine
from .types import Task, Trajectory

# Metrics shown by :meth:`EvalResult.table` first, in this order (others follow alphabetically).
HEADLINE = (
    "success_rate", "pass^1", "tool_f1", "tool_precision", "tool_recall", "call_f1", "call_precision", "call_recall",
    "format_valid_rate", "steps_per_traj", "tool_calls_per_traj", "act_tokens_per_traj", "context_tokens_per_traj",
    "truncated_rate", "wall_s",
)


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
    trajectories: list[Trajectory] = field(default_factory=list)

    def table(self) -> str:
        return format_metrics(self.metrics)

    def to_dict(self, with_trajectories: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {"metrics": self.metrics, "per_task": self.per_task}
        if with_trajectories:
            d["trajectories"] = [t.to_dict(with_rows=False) for t in self.trajectories]
        return d


def format_metrics(metrics: dict[str, float]) -> str:
    """A two-column text table, headline metrics first."""
    passes = sorted((k for k in metrics if k.startswith("pass^")), key=lambda k: int(k[5:]))
    keys = [k for k in HEADLINE if k in metrics and k != "pass^1"]
    keys[1:1] = passes
    keys += sorted(k for k in metrics if k not in keys)
    w = max((len(k) for k in keys), default=10)
    return "\n".join(f"{k:<{w}}  {metrics[k]:.4g}" for k in keys)


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if len(xs) else 0.0


def task_scores(task: Task, trajs: Sequence[Trajectory]) -> dict[str, Any]:
    """Per-task scores of its K trials (rewards already set by the success check): the successes, and tool /
    call precision, recall and F1 against the gold actions, each averaged over the trials."""
    gold = task.flat_gold()
    tool = [tool_name_prf(t.calls(), gold) for t in trajs]
    call = [call_prf(t.calls(), gold) for t in trajs]
    out: dict[str, Any] = {"task_id": task.id, "domain": task.env, "successes": [bool(t.reward) for t in trajs]}
    for name, prf in (("tool", tool), ("call", call)):
        for i, part in enumerate(("precision", "recall", "f1")):
            out[f"{name}_{part}"] = _mean([x[i] for x in prf])
    out["steps"] = _mean([len(t.steps) for t in trajs])
    return out


def summarize(per_task: Sequence[dict[str, Any]], trajs: Sequence[Trajectory], samples: int, wall_s: float = 0.0) -> dict[str, float]:
    """Aggregate :func:`task_scores` rows and the trajectories' counters into the metrics of the module docstring."""
    n = max(1, len(trajs))
    acts = sum(t.counters.get("act/steps", 0) for t in trajs)
    parse_err = sum(t.counters.get("act/parse_errors", 0) for t in trajs)
    act_rows = [r for t in trajs for r in t.rows if r.role == "act"]
    last_act = [next((r for r in reversed(t.rows) if r.role == "act"), None) for t in trajs]
    m: dict[str, float] = {"success_rate": _mean([s for p in per_task for s in p["successes"]])}
    for k in range(1, samples + 1):
        m[f"pass^{k}"] = _mean([pass_hat_k(p["successes"], k) for p in per_task])
    for key in ("tool_precision", "tool_recall", "tool_f1", "call_precision", "call_recall", "call_f1"):
        m[key] = _mean([p[key] for p in per_task])
    m |= {
        "format_valid_rate": 1.0 - parse_err / max(1, acts),
        "tool_calls_per_traj": sum(t.counters.get("act/tool_calls", 0) for t in trajs) / n,
        "steps_per_traj": _mean([len(t.steps) for t in trajs]),
        "act_tokens_per_traj": sum(len(r.completion_ids) for r in act_rows) / n,
        "context_tokens_per_traj": sum(len(r.prompt_ids) + len(r.completion_ids) for r in last_act if r is not None) / n,
        "truncated_rate": _mean([t.truncated is not None for t in trajs]),
        "wall_s": float(wall_s),
    }
    for dom in sorted({p["domain"] for p in per_task}):
        m[f"domain/{dom}/success_rate"] = _mean([s for p in per_task if p["domain"] == dom for s in p["successes"]])
    return m


def evaluate(policy: Backend, tasks: list[Task], samples: int = 1, rollout: RolloutConfig | None = None, memory: dict[str, str] | None = None) -> EvalResult:
    """Run every task ``samples`` times against its real environment and compute the metrics.

    ``memory`` (task id -> text) is shown to Act as its rehearsal memory (test-time scaling, envace.tts).
    ``trajectories`` come task by task, ``samples`` per task, in the order of ``tasks``."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    cfg = dataclasses.replace(rollout or RolloutConfig(), mode="real", group_size=samples, shadow=False)
    t0 = time.perf_counter()
    trajs = RolloutEngine(policy, cfg, memory=memory).run(tasks, group_prefix="eval")
    wall = time.perf_counter() - t0
    by_task: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_task.setdefault(t.task_id, []).append(t)
    grounded, ctx = REWARDS.get("grounded"), RewardContext()
    per_task = []
    for task in tasks:
        ts = by_task.get(task.id, [])
        for t in ts:
            r = grounded(task, t, ctx)
            t.reward, t.reward_info = r.value, r.info
        per_task.append(task_scores(task, ts))
    return EvalResult(summarize(per_task, trajs, samples, wall), per_task, trajs)


def evaluate_at_budget(policy: Backend, tasks: list[Task], samples: int = 1, rollout: RolloutConfig | None = None, n: int = 0, mode: str = "parallel", tts_options: dict[str, Any] | None = None) -> EvalResult:
    """:func:`evaluate` after private test-time rehearsal with budget ``n`` (METHOD.md section 3).

    ``n == 0`` is plain :func:`evaluate`. ``n > 0`` hands over to :func:`envace.tts.evaluate_with_tts` with a
    ``TTSConfig(n=n, mode=mode, rollout=<rollout in rehearsal mode>, **tts_options)``: the attempts are
    self-rehearsed (no real call), then each task runs ``samples`` times for real with the rehearsal memory.
    The result's metrics gain ``tts/...`` keys and ``gen_tokens_per_task`` counts rehearsal tokens too."""
    rollout = rollout or RolloutConfig()
    if n < 0:
        raise ValueError(f"rehearsal budget n must be >= 0, got {n}")
    if n == 0:
        res = evaluate(policy, tasks, samples=samples, rollout=rollout)
        res.metrics["tts/n"] = 0.0
        res.metrics["gen_tokens_per_task"] = res.metrics["act_tokens_per_traj"] * samples
        return res
    try:
        from .tts import TTSConfig, evaluate_with_tts
    except ImportError as e:  # pragma: no cover - the module ships with envace; only a broken install lacks it
        raise RuntimeError(f"test-time rehearsal (n={n}) needs envace.tts, which failed to import: {e}") from e
    tcfg = TTSConfig(n=n, mode=mode, rollout=dataclasses.replace(rollout, mode="rehearsal", shadow=False), **(tts_options or {}))
    res = evaluate_with_tts(policy, tasks, tcfg, samples=samples)
    res.metrics["gen_tokens_per_task"] = res.metrics["act_tokens_per_traj"] * samples + res.metrics.get("tts/rehearsal_tokens_per_task", 0.0)
    return res


def resolve_model(path: str, role: str = "policy") -> str:
    """A model name or folder. A training checkpoint folder (``step-N/`` holding ``policy/``) resolves to its
    ``role`` model, and a training run folder (holding ``checkpoints/latest``) to its latest checkpoint's."""
    from .checkpoint import latest_checkpoint

    if not os.path.isdir(path) or os.path.isfile(os.path.join(path, "config.json")):
        return path
    ckpt = latest_checkpoint(os.path.join(path, "checkpoints")) or path
    return os.path.join(ckpt, role) if os.path.isfile(os.path.join(ckpt, role, "config.json")) else path


def evaluate_model(model: str, suite: str, split: str = "test", n: int | None = 20, samples: int = 1, seed: int = 0, tts_n: int = 0, tts_mode: str = "parallel", rollout: RolloutConfig | None = None, temperature: float | None = None, progress: bool = True, tts_options: dict[str, Any] | None = None, bf16: bool = False) -> EvalResult:
    """Load ``model`` (a name, a model folder or a training checkpoint folder) and evaluate it on ``n`` tasks of
    ``suite`` / ``split`` at rehearsal budget ``tts_n`` (``bf16``: generate in bf16, see ``HFBackend``). The real trials sample Act greedily when ``samples == 1``
    and at T=0.7 otherwise, unless ``temperature`` is given; rehearsal attempts keep ``rollout.act``."""
    from .backends.base import SamplingParams
    from .backends.hf import HFBackend
    from .envs import load_tasks
    from .models import load

    m, tok = load(resolve_model(model))
    tasks = load_tasks(suite, split, n=n, seed=seed)
    base = rollout or RolloutConfig(act=SamplingParams(max_new_tokens=160))
    final_act = base.act.with_(temperature=(0.0 if samples == 1 else 0.7) if temperature is None else temperature)
    rc = dataclasses.replace(base, seed=seed, progress=progress)
    if tts_n == 0:
        return evaluate_at_budget(HFBackend(m, tok, bf16=bf16), tasks, samples=samples, rollout=dataclasses.replace(rc, act=final_act))
    opts = {"final_act": final_act, **(tts_options or {})}
    return evaluate_at_budget(HFBackend(m, tok, bf16=bf16), tasks, samples=samples, rollout=rc, n=tts_n, mode=tts_mode, tts_options=opts)


def save_result(res: EvalResult, path: str, config: dict[str, Any] | None = None, with_trajectories: bool = False) -> None:
    """Write the metrics and per-task rows (and optionally the trajectories, without rows) as JSON."""
    d = res.to_dict(with_trajectories)
    if config is not None:
        d = {"config": config, **d}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(d, f, indent=1, default=str)
