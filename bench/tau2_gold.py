"""Gold replay of tau2-bench tasks: does the gold conversation reach tau2's own evaluator reward of 1.0?

Each task is played through the rollout engine (envace.training.sft.gold_trajectories): Act follows the task's gold
calls and gold replies (a GoldTeacher backend in place of a model), the built-in "scripted" user says the scripted turns
and, on telecom, performs the task's recorded user-side actions (toggle airplane mode, reboot, ...) on the user's
device before the turn that reports them. In ``real`` mode every call, the agent's and the user's, runs in the
task's one tau2 environment and the trajectory is scored by the rollout (``env_outcome``); in ``rehearsal`` mode
no real environment runs (Rehearse answers from the gold script, the user's actions run nowhere) and scoring
replays the agent's and the user's calls in order in a fresh environment. A task that falls short of 1.0 is put in
a category: the reward components that failed (``ENV_ASSERTION``, ``ACTION``, ``DB``, ``COMMUNICATE``), an
evaluator error, or a truncation.

Usage: python bench/tau2_gold.py [--domain telecom] [--split all] [--mode real|rehearsal] [--n N] [--out-dir ...]
(telecom's default split, "all" here, has 114 tasks; about 5 s on 2 cores.)
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Any

import common  # noqa: F401  (thread and hub settings before torch)
from common import DEFAULT_OUT, write_result

from envace.envs import load_tasks
from envace.envs.tau2 import score_trajectory
from envace.backends.models import load_tokenizer
from envace.rollout.engine import RolloutConfig
from envace.training.sft import gold_trajectories
from envace.core.types import Task, Trajectory


def outcome(task: Task, traj: Trajectory) -> dict[str, Any]:
    """The evaluator's verdict: the rollout's (real mode) or a replay's (rehearsal)."""
    if traj.env_outcome is not None:
        return traj.env_outcome
    s = score_trajectory(task, traj)
    return {"success": s.success, "reward": s.reward, "details": s.details}


def failure_category(traj: Trajectory, out: dict[str, Any]) -> str:
    """Why a gold replay fell short of 1.0: truncated / evaluator error / the failed reward components."""
    if traj.truncated:
        return f"truncated:{traj.truncated}"
    details = out.get("details", {})
    if "error" in out or "error" in details:
        return "evaluator_error"
    failed = sorted(k for k, v in details.get("reward_breakdown", {}).items() if v < 1.0)
    return "+".join(failed) or "other"


def gold_replay(domain: str, split: str, mode: str, n: int | None = None) -> dict[str, Any]:
    tasks = load_tasks(f"tau2:{domain}", split, n=n)
    cfg = RolloutConfig(max_steps=256, max_steps_per_turn=256, max_context_tokens=1 << 24)
    t0 = time.perf_counter()
    trajs = gold_trajectories(load_tokenizer("tiny-random"), tasks, cfg, mode=mode)
    results = [(t, tr, outcome(t, tr)) for t, tr in zip(tasks, trajs)]
    failures = {t.id: failure_category(tr, o) for t, tr, o in results if not o.get("success")}
    return {
        "domain": domain,
        "split": split,
        "mode": mode,
        "n_tasks": len(tasks),
        "n_full_reward": len(tasks) - len(failures),
        "n_with_user_actions": sum(bool(t.user_actions) for t in tasks),
        "n_user_calls": sum(tr.counters.get("user/tool_calls", 0) for _, tr, _ in results),
        "failure_categories": dict(collections.Counter(failures.values())),
        "failures": failures,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--domain", default="telecom")
    ap.add_argument("--split", default="all", help="train | test | all (the domain's default task set)")
    ap.add_argument("--mode", default="real", choices=["real", "rehearsal"])
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--out-dir", default=str(DEFAULT_OUT))
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    result = gold_replay(args.domain, args.split, args.mode, args.n)
    print(
        f"{args.domain}/{args.split} ({args.mode}): {result['n_full_reward']}/{result['n_tasks']} "
        f"gold replays score 1.0; failures by category: {result['failure_categories'] or 'none'}"
    )
    write_result(args.name or f"tau2_gold_{args.domain}_{args.mode}", result, args.out_dir)


if __name__ == "__main__":
    main()
