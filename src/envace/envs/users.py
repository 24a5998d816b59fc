"""User simulators: who speaks the user's turns of a conversation, and the user's own side of the world.

:class:`ScriptedUser` plays a task's scripted turns (and its ``user_actions``); benchmark adapters register others in
:data:`USERS` (tau2's LLM user). A user's tool calls go through a :class:`UserSide`, which runs them in the task's
real environment when there is one (:meth:`envace.envs.base.Environment.user_call`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

from ..chat.parsing import validate_call
from ..core.registry import Registry
from ..core.types import Message, Task, ToolCall, ToolSpec, Trajectory, UserStep
from .base import Environment


class UserSimulator(ABC):
    """Produces the user's messages of a conversation. The first call (no assistant reply yet) gives the
    opening message; later calls follow each text reply of Act. ``None`` ends the conversation.

    A user may also act on its own side of the world (``task.user_tools``) through a :class:`UserSide`, before
    its message; only the message reaches the agent."""

    @abstractmethod
    def reply(self, task: Task, messages: list["Message"], turn: int) -> str | None:
        """The user's message for ``turn`` (0-based) given the Act chat so far, or None when done."""


UNEXECUTED: dict[str, Any] = {
    "status": "not executed",
    "note": "no real environment in this rollout mode: the action is "
    "recorded and applied when the conversation is scored",
}
"""What a user-side call returns to the user where no real environment runs (rehearsal, simulator, per_role)."""


class UserSide:
    """The user's side of one trajectory: where a user simulator's tool calls go and are recorded.

    Every call is first checked against ``task.user_tools`` in code: a call that fails is answered by the
    error observation (source ``validation``) and never runs. A valid call runs in ``env`` (the task's real
    environment, the one the agent's calls run in, so state is shared) when there is one (source ``real``);
    otherwise (no real environment: rehearsal, simulator, per_role) it runs nowhere and is answered by
    :data:`UNEXECUTED` (source ``unexecuted``); scoring replays it with the agent's calls, as it replays
    rehearsed calls. Each move is a :class:`UserStep` appended to ``traj.user_steps`` (an own list without a
    trajectory) and counted in ``traj.counters`` under ``user/...``: never a training row."""

    def __init__(self, task: Task, env: Environment | None = None, traj: Trajectory | None = None):
        self.task = task
        self.env = env
        self.traj = traj
        self.steps: list[UserStep] = traj.user_steps if traj is not None else []

    @property
    def tools(self) -> list[ToolSpec]:
        return self.task.user_tools

    def call(self, call: ToolCall) -> tuple[Any, str]:
        """(observation, source) of one user-side call; never raises."""
        err = validate_call(call, self.tools)
        if err is not None:
            return err, "validation"
        if self.env is None:
            return dict(UNEXECUTED), "unexecuted"
        return self.env.user_call(call), "real"

    def act(self, turn: int, calls: list[ToolCall], text: str | None = None) -> list[Any]:
        """Make ``calls`` (in order) as one move of ``turn``; record it; return the observations."""
        results = [self.call(c) for c in calls]
        self.record(
            UserStep(
                turn=turn,
                text=text,
                calls=list(calls),
                observations=[o for o, _ in results],
                sources=[s for _, s in results],
            )
        )
        return [o for o, _ in results]

    def record(self, step: UserStep) -> None:
        self.steps.append(step)
        self.count("user/generations", int(step.text is not None))
        self.count("user/tool_calls", len(step.calls))
        self.count("user/parse_errors", int(step.parse_error is not None))
        for source in step.sources:
            self.count(f"user/calls_{source}")

    def count(self, key: str, n: int = 1) -> None:
        """Add to the trajectory's counter ``key`` (nothing without a trajectory)."""
        if self.traj is not None and n:
            self.traj.count(key, n)


class ScriptedUser(UserSimulator):
    """Plays ``task.user_turns`` in order: the default for every built-in and BFCL task. Where the task has
    ``user_actions``, the user makes turn i's actions on its side (:class:`UserSide`) before saying turn i."""

    def __init__(self, side: UserSide | None = None):
        self.side = side

    def reply(self, task: Task, messages: list["Message"], turn: int) -> str | None:
        if turn >= len(task.user_turns):
            return None
        actions = task.user_actions[turn] if turn < len(task.user_actions) else []
        if actions:
            side = self.side if self.side is not None else UserSide(task)
            for call in actions:  # one move per action, as a user does them one at a time
                side.act(turn, [call])
        return task.user_turns[turn]


# name -> factory(task, env=None, traj=None, backend=None, **kw) -> UserSimulator. The rollout gives every
# factory ``env`` (the real environment the user's calls run in: real mode only, else None), ``traj`` (the
# trajectory its side is recorded in) and ``backend`` (the rollout's user backend, or None); a factory takes
# what it needs. "scripted" is built in; benchmark adapters may add e.g. "llm".
USERS: Registry[Callable[..., UserSimulator]] = Registry("user simulator")
USERS.add("scripted", lambda task, env=None, traj=None, **kw: ScriptedUser(UserSide(task, env, traj)))
