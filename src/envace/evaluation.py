"""Evaluation in the real environment: success, pass^k, tool F1, format validity, steps, tokens, time.

Each task is run K times for real (``real`` rollout mode; optionally after private test-time rehearsal, see
envace.tts). Success is the task's own state-based check, applied by replaying the trajectory's calls in a fresh
environment (``grounded`` reward): real environments here are deterministic, so this equals checking the
environment the trajectory ran in.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .backends.base import Backend
from .rewards import REWARDS, RewardContext, call_prf, tool_name_prf
from .rollout import RolloutConfig, RolloutEngine
from .types import Task, Trajectory


def pass_hat_k(successes: list[bool], k: int) -> float:
    """tau2-bench's pass^k for one task: the chance that k draws without replacement from its n trials all
    succeed, C(c, k) / C(n, k) with c successes."""
    n, c = len(successes), sum(successes)
    if k > n:
        raise ValueError(f"pass^{k} needs at least {k} trials, got {n}")
    return math.comb(c, k) / math.comb(n, k)


@dataclass
class EvalResult:
    metrics: dict[str, float]
    per_task: list[dict[str, Any]] = field(default_factory=list)
    trajectories: list[Trajectory] = field(default_factory=list)

    def table(self) -> str:
        keys = [k for k in self.metrics]
        w = max(len(k) for k in keys) if keys else 10
        return "\n".join(f"{k:<{w}}  {self.metrics[k]:.4g}" for k in keys)


def evaluate(policy: Backend, tasks: list[Task], samples: int = 1, rollout: RolloutConfig | None = None, memory: dict[str, str] | None = None) -> EvalResult:
    """Run every task ``samples`` times against its real environment and compute the metrics."""
    cfg = rollout or RolloutConfig()
    cfg = RolloutConfig(**{**cfg.__dict__, "mode": "real", "group_size": samples, "shadow": False})
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
        succ, f1s, tf1s = [], [], []
        for t in ts:
            r = grounded(task, t, ctx)
            t.reward, t.reward_info = r.value, r.info
            succ.append(bool(r.value))
            f1s.append(call_prf(t.calls(), task.flat_gold())[2])
            tf1s.append(tool_name_prf(t.calls(), task.flat_gold())[2])
        per_task.append({"task_id": task.id, "successes": succ, "call_f1": float(np.mean(f1s)) if f1s else 0.0, "tool_f1": float(np.mean(tf1s)) if tf1s else 0.0})
    n_steps = [len(t.steps) for t in trajs]
    act_rows = [r for t in trajs for r in t.rows if r.role == "act"]
    parse_err = sum(t.counters.get("act/parse_errors", 0) for t in trajs)
    n_calls = sum(t.counters.get("act/tool_calls", 0) for t in trajs)
    n_acts = sum(t.counters.get("act/steps", 0) for t in trajs)
    metrics = {
        "success_rate": float(np.mean([s for p in per_task for s in p["successes"]])) if trajs else 0.0,
        "call_f1": float(np.mean([p["call_f1"] for p in per_task])) if per_task else 0.0,
        "tool_f1": float(np.mean([p["tool_f1"] for p in per_task])) if per_task else 0.0,
        "format_valid_rate": 1.0 - parse_err / max(1, n_acts),
        "tool_calls_per_traj": n_calls / max(1, len(trajs)),
        "steps_per_traj": float(np.mean(n_steps)) if n_steps else 0.0,
        "act_tokens_per_traj": sum(len(r.completion_ids) for r in act_rows) / max(1, len(trajs)),
        "truncated_rate": float(np.mean([t.truncated is not None for t in trajs])) if trajs else 0.0,
        "wall_s": wall,
    }
    for k in range(1, samples + 1):
        metrics[f"pass^{k}"] = float(np.mean([pass_hat_k(p["successes"], k) for p in per_task])) if per_task else 0.0
    return EvalResult(metrics, per_task, trajs)


def save_result(res: EvalResult, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"metrics": res.metrics, "per_task": res.per_task}, f, indent=1)
