"""Adversarial trajectories for auditing a reward (METHOD.md section 6: "A reward that cannot be earned without
doing the task"). Each case is data: a name and how it bends a task's gold episode (turns of calls and a reply).
:func:`real_trajectory` runs an episode in a real environment of the task and records its outcome as a real-mode
rollout does; :func:`rehearsed_trajectory` gives it imagined observations instead. :func:`audit` scores every case
of ``n`` tasks with a reward and counts, per case, the mean reward and the trajectories that earn full reward while
the real environment's own check fails (for a training reward that count must be 0: tests/test_reward_adversarial.py,
bench/reward_audit.py).
"""

from __future__ import annotations

import re
from typing import Any, Callable

from ..core.types import Step, Task, ToolCall, Trajectory, is_error_obs
from ..envs import final_outcome, load_tasks, make_env
from .functions import RewardContext, RewardSpec, make_reward

Turn = tuple[list[ToolCall], str]  # the calls of one user turn, then the reply


def bump_numbers(text: str) -> str:
    """Every number in ``text`` changed in its last digit: a misstated fact."""
    return re.sub(r"\d+(?:\.\d+)?", lambda m: m.group(0)[:-1] + str((int(m.group(0)[-1]) + 1) % 10), text)


def drop_last_call(turns: list[Turn]) -> list[Turn]:
    out = [(list(c), r) for c, r in turns]
    for calls, _ in reversed(out):
        if calls:
            calls.pop()
            break
    return out


CASES: dict[str, Callable[[Task, list[Turn]], list[Turn]]] = {
    "evasive reply": lambda task, turns: [(c, "Done: 1 request handled.") for c, _ in turns],
    "echoed user words": lambda task, turns: [(c, task.user_turns[i]) for i, (c, _) in enumerate(turns)],
    "misstated numbers": lambda task, turns: [(c, bump_numbers(r)) for c, r in turns],
    "skipped last call": lambda task, turns: drop_last_call(turns),
    "calls reversed": lambda task, turns: [(list(reversed(c)), r) for c, r in turns],
    "schema number": lambda task, turns: [(c, "The limit is 20 and the maximum is 20.") for c, _ in turns],
}
"""Real-mode cases: name -> how the case bends the gold episode of a task."""
ORDER_ONLY = ("calls reversed",)
"""Cases that are not adversarial on most tasks (the same calls in another order often succeed)."""


def gold_turns(task: Task) -> list[Turn]:
    return [(list(calls), reply) for calls, reply in zip(task.gold_actions, task.gold_replies)]


def _steps(task: Task, turns: list[Turn], observe: Callable[[ToolCall], Any], source: str) -> list[Step]:
    steps = []
    for t, (calls, reply) in enumerate(turns):
        if calls:
            obs = [observe(c) for c in calls]
            steps.append(
                Step(user_turn=t, action_text="", calls=calls, observations=obs, sources=[source] * len(calls))
            )
        steps.append(Step(user_turn=t, action_text=reply, reply=reply))
    return steps


def real_trajectory(task: Task, turns: list[Turn]) -> Trajectory:
    """The episode run in a real environment of the task, its outcome recorded as a real-mode rollout does."""
    env = make_env(task)
    try:
        traj = Trajectory(
            id="real", task_id=task.id, group_id="g", mode="real", steps=_steps(task, turns, env.call, "real")
        )
        traj.env_outcome = final_outcome(env, traj)
    finally:
        env.close()
    return traj


def rehearsed_trajectory(task: Task, turns: list[Turn], imagine: Callable[[ToolCall, Any], Any]) -> Trajectory:
    """The episode with imagined observations, ``imagine(call, what the real call returns)``."""
    env = make_env(task)
    try:
        steps = _steps(task, turns, lambda c: imagine(c, env.call(c)), "rehearsed")
    finally:
        env.close()
    return Trajectory(id="imagined", task_id=task.id, group_id="g", mode="rehearsal", steps=steps)


def imagined_success(call: ToolCall, real: Any) -> Any:
    """An error-free world: a failing call imagined to succeed."""
    return {"ok": True, "status": "completed"} if is_error_obs(real) else real


def imagined_balance(call: ToolCall, real: Any) -> Any:
    """A wrong balance imagined (999.00)."""
    return {**real, "balance": "999.00"} if isinstance(real, dict) and "balance" in real else real


IMAGINED: dict[str, tuple[str, Callable[[ToolCall, Any], Any], str]] = {
    "imagined success where the real call fails": ("recovery", imagined_success, "Done, all went through."),
    "imagined wrong balance, reported": ("read_only_report", imagined_balance, "The balance is $999.00."),
}
"""Rehearsed cases: name -> (the task kind it applies to, the imagined world, Act's reply in it)."""


def real_cases(suite: str, n: int, split: str = "test") -> list[tuple[Task, str, Trajectory]]:
    """(task, case name, real trajectory) for the gold episode and every case of :data:`CASES`, on ``n`` tasks."""
    out = []
    for task in load_tasks(suite, split, n=n):
        gold = gold_turns(task)
        out.append((task, "gold", real_trajectory(task, gold)))
        out += [(task, name, real_trajectory(task, bend(task, gold))) for name, bend in CASES.items()]
    return out


def audit(
    reward: RewardSpec, cases: list[tuple[Task, str, Trajectory]], ctx: RewardContext | None = None
) -> dict[str, dict[str, Any]]:
    """Per case: ``n``, ``mean`` reward, ``real_failures`` (the real check failed), ``full_on_failure`` (full
    reward although the real check failed) and up to five of those task ids."""
    fn, ctx = make_reward(reward), ctx or RewardContext()
    out: dict[str, dict[str, Any]] = {}
    for task, name, traj in cases:
        value = fn(task, traj, ctx).value
        row = out.setdefault(name, {"n": 0, "sum": 0.0, "real_failures": 0, "full_on_failure": 0, "examples": []})
        failed = not traj.env_outcome["success"]
        row["n"] += 1
        row["sum"] += float(value or 0.0)
        row["real_failures"] += failed
        if value is not None and value >= 1.0 and failed:
            row["full_on_failure"] += 1
            if len(row["examples"]) < 5:
                row["examples"].append(task.id)
    for row in out.values():
        row["mean"] = row.pop("sum") / row["n"]
    return out
