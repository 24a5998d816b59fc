"""What :func:`envace.evaluation.trials.evaluate` runs: a policy that plays prepared tasks in their real environments.

A policy has a ``backend`` (every token it generates comes from it) and ``act(tasks, rollout, samples=, seed=)``: the
real trials of the tasks, ``samples`` per task sampled from ``seed``, scored by each environment's own check
(``grounded``), returned as :class:`Acted` with whatever the policy generated before them. Two policies:

- :class:`Plain`: acts at once (Act sees the task, and a memory per task if one is given).
- :class:`envace.evaluation.tts.Rehearsing`: rehearses each task privately first (test-time rehearsal), then acts
  as ``Plain`` does with the memory it distilled; its records, ``tts/...`` metrics and the tokens it generated
  before acting come back in :class:`Acted`.

So ``evaluate`` calls one method and gets everything: it never calls back into test-time rehearsal, and test-time
rehearsal never calls ``evaluate``. :func:`add_token_counts` writes what each task cost into its per-task row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from ..backends.base import Backend
from ..core.types import Task, Trajectory
from ..rewards.functions import REWARDS, score_trajectories
from ..rollout.engine import RolloutConfig, RolloutEngine


@dataclass
class Acted:
    """What a policy did for a list of tasks: its real trials, and what came before them."""

    trajectories: list[Trajectory]
    """The real trials, task by task (``group_size`` per task, in task order), scored (``reward`` set)."""
    wall_s: float = 0.0
    """Seconds the real trials took (what came before them not included)."""
    private_tokens: dict[str, tuple[int, int]] | None = None
    """Task id -> (attempt tokens, every private token) generated before the real trials; None: no private phase
    (then the per-task rows get no token columns)."""
    records: list[Any] = field(default_factory=list)
    """The policy's own account of each task (test-time rehearsal: its RehearsalRecords, ``final`` and ``success``
    set from the real trials)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The policy's own metrics (test-time rehearsal: ``tts/...``), added after the trials' metrics."""


class Policy(Protocol):
    """What evaluate runs (module docstring)."""

    backend: Backend

    def act(self, tasks: list[Task], rollout: RolloutConfig, *, samples: int = 1, seed: int = 0) -> Acted: ...


@dataclass
class Plain:
    """A backend acting at once: each task ``samples`` times in real mode (``rollout`` as given, sampled from
    ``seed``), with ``memory`` (task id -> text) shown to Act as its rehearsal memory where given."""

    backend: Backend
    memory: dict[str, str] | None = None

    def act(self, tasks: list[Task], rollout: RolloutConfig, *, samples: int = 1, seed: int = 0) -> Acted:
        t0 = time.perf_counter()
        engine = RolloutEngine(self.backend, rollout, memory=self.memory, mode="real", shadow=False)
        trajs = engine.run(tasks, group_prefix="eval", group_size=samples, seed=seed)
        wall = time.perf_counter() - t0
        score_trajectories({t.id: t for t in tasks}, trajs, REWARDS.get("grounded"))
        return Acted(trajs, wall)


def as_policy(policy: Backend | Policy, memory: dict[str, str] | None = None) -> Policy:
    """``policy`` itself if it is a policy (not a backend, and has ``act``), else a :class:`Plain` policy of that
    backend showing ``memory``. A policy brings its own memory: giving it one too is an error."""
    if isinstance(policy, Backend) or not hasattr(policy, "act"):
        return Plain(policy, memory)  # type: ignore[arg-type]
    if memory:
        raise ValueError("a memory was given with a policy that brings its own (give it a backend instead)")
    return policy


def real_tokens(trajs: Sequence[Trajectory]) -> int:
    """Act tokens generated in real trials."""
    return sum(len(r.completion_ids) for t in trajs for r in t.rows if r.role == "act")


def add_token_counts(
    per_task: list[dict[str, Any]],
    trajectories: Sequence[Trajectory],
    private: Mapping[str, tuple[int, int]] | None = None,
) -> None:
    """Write each task's generated tokens into its per-task row (in place): ``attempt_tokens`` and
    ``private_tokens`` of the private phase (``private``: task id -> the two; 0 without one), ``real_tokens`` (Act
    tokens of its real trials, all samples) and ``gen_tokens``, their sum. The per-task record of what a budget
    cost, so a compute-matched comparison can be checked task by task."""
    by_task: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        by_task.setdefault(t.task_id, []).append(t)
    for row in per_task:
        att, priv = (private or {}).get(row["task_id"], (0, 0))
        real = real_tokens(by_task.get(row["task_id"], []))
        row |= {"attempt_tokens": att, "private_tokens": priv, "real_tokens": real, "gen_tokens": priv + real}


__all__ = ["Acted", "Policy", "Plain", "as_policy", "real_tokens", "add_token_counts"]
