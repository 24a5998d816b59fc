"""The environment protocol, in the spirit of Gymnasium's ``Env`` and verifiers' ``env_response``.

An :class:`Environment` is the *real* world of one task: it is created from the task, executes tool calls
(returning observations; tool exceptions and timeouts become error observations and never escape), exposes a
JSON snapshot of its state, and scores a finished trajectory.

Environments are created by name through :data:`ENVS` (``task.env``, e.g. ``"bank"`` or ``"tau2:retail"``;
the part before ``:`` selects the factory: :func:`make_env`) and task sets are loaded through :data:`SUITES`
(:mod:`envace.envs.suites`); both registries live in :mod:`envace.envs.registry` and are importable from here too.
User simulators are :mod:`envace.envs.users`.

**Preparing tasks.** A task may need episodes played by the model under test before it can run (BFCL's memory
questions with ``writer=model``: the prerequisite sessions write the memory the questions start from). Such a task
says why in ``env_config["unprepared"]``; :func:`prepare_tasks` hands it to its environment's
:meth:`Environment.prepare` with a :data:`Play` (evaluation's: real-mode episodes with the model under test), which
returns the task ready to run. Evaluation prepares its tasks before the trials; a rollout or an environment of a
task still unprepared (training, rehearsal, a replay) is an error that gives the reason (:func:`require_prepared`).
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..chat.parsing import validate_call
from ..core.types import Task, ToolCall, ToolSpec, Trajectory, error_obs, is_error_obs
from .registry import ENVS, ensure_registered
from .registry import SUITES, SUMMARIES, TASK_AT  # noqa: F401 - re-exported: environment modules import them from here

MAX_OBS_CHARS = 20_000  # observations larger than this become a too_large error
FAULT_KINDS: tuple[str, ...] = ("tool_exception", "timeout", "non_json", "too_large")
"""What :attr:`Environment.faults` counts: a tool that raised (or a server that exited), one that did not return
in time, a result that is not JSON, one too large to show."""


class ToolError(Exception):
    """Raised by a tool to report an expected failure (becomes a ``tool_error`` observation)."""


class EnvStartupError(RuntimeError):
    """An environment's server or subprocess could not be started. The message is one line: what was run and
    why it failed (the CLI prints it as ``envace <cmd>: error: ...``)."""


@dataclass
class Score:
    """Outcome of a finished trajectory. ``success`` is the task's own success check; ``reward`` in [0, 1]."""

    success: bool
    reward: float
    details: dict[str, Any] = field(default_factory=dict)


Play = Callable[[list[Task]], list[Trajectory]]
"""Plays tasks with the model under test, each once in its real environment (real mode), and returns their
trajectories in task order: what :meth:`Environment.prepare` gets (evaluation's:
``envace.evaluation.trials.player``)."""
Prepare = Callable[[list[Task], Play], list[Task]]
"""(tasks, play) -> the same tasks, in order, ready to run (:meth:`Environment.prepare`)."""
UNPREPARED = "unprepared"
"""The ``env_config`` key of a task that needs its environment's :meth:`Environment.prepare` before it runs; its value
says why (shown by the error of :func:`require_prepared`)."""


class Environment(ABC):
    """The real environment of one task.

    ``faults`` counts what went wrong inside tools (``tool_exception``, ``timeout``, ``non_json``, ``too_large``);
    the rollout engine adds them to the trajectory's counters as ``env/<kind>``. ``call_timeout_s`` (None: off)
    bounds each call: a call still running after it is answered with a ``timeout`` error observation (set it on
    a subclass, or on an instance, for tools that may hang)."""

    call_timeout_s: float | None = None
    replay_safe: bool = True
    """Whether running calls again in a fresh instance has no effect outside this process, so that scoring may
    replay a trajectory that no real environment ran (a rehearsed one, :func:`replay`). False where tools reach
    the world (MCP servers): such a replay then needs the task's explicit opt-in ``env_config["allow_replay"]``."""

    max_alive: int | None = None
    """How many instances a rollout keeps alive at once (None: no bound). Set where an instance is costly (an MCP
    server process): a trajectory then starts when another one's environment has closed (a task may set its own
    with ``env_config["max_alive"]``; :func:`alive_bound`)."""

    @classmethod
    def prepare(cls, tasks: list[Task], play: Play) -> list[Task]:
        """The tasks of this environment ready to run: the same tasks in the same order, each one marked
        ``env_config["unprepared"]`` replaced by its ready version (without the mark), made by playing the episodes
        it needs with ``play``. Evaluation calls it (:func:`prepare_tasks`) before the trials; the default has
        nothing to prepare."""
        return tasks

    def __init__(self, task: Task):
        self.task = task
        self.n_calls = 0
        self.n_user_calls = 0
        self.faults: dict[str, int] = {}

    @property
    def tools(self) -> list[ToolSpec]:
        return self.task.tools

    def call(self, call: ToolCall) -> Any:
        """Validate and execute one call; always returns an observation (a JSON value), never raises."""
        self.n_calls += 1
        return self._guarded(call, self.tools, self._execute)

    def user_call(self, call: ToolCall) -> Any:
        """A call of the *user's* side (``task.user_tools``, e.g. the customer's phone), made by the user simulator
        in the same world as the agent's calls; validated against the user tools, never raises, like :meth:`call`."""
        self.n_user_calls += 1
        return self._guarded(call, self.task.user_tools, self._execute_user)

    def _guarded(self, call: ToolCall, tools: list[ToolSpec], execute: Callable[[ToolCall], Any]) -> Any:
        err = validate_call(call, tools)
        if err is not None:
            return err
        try:
            if self.call_timeout_s:
                done, obs = _run_with_timeout(lambda: execute(call), self.call_timeout_s)
                if not done:
                    self._fault("timeout")
                    obs = error_obs("timeout", f"tool {call.name!r} did not return within {self.call_timeout_s:g}s")
            else:
                obs = execute(call)
        except ToolError as e:
            obs = error_obs("tool_error", str(e))
        except Exception as e:  # noqa: BLE001 - a tool failure is an observation, not a crash
            self._fault("tool_exception")
            obs = error_obs("tool_exception", f"{type(e).__name__}: {str(e)[:300]}")
        return self._bound(obs)

    def _fault(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    def _bound(self, obs: Any) -> Any:
        coerced: list[str] = []

        def as_text(x: Any) -> str:  # a non-JSON leaf (a set, bytes, a datetime ...) is shown as its str(), counted
            coerced.append(type(x).__name__)
            return str(x)

        try:
            text = json.dumps(obs, ensure_ascii=False, allow_nan=False, default=as_text)
            text.encode("utf-8")  # a lone surrogate cannot be logged or tokenized (UnicodeEncodeError is a ValueError)
        except (TypeError, ValueError, RecursionError) as e:
            self._fault("non_json")
            return error_obs("tool_exception", f"tool returned a non-JSON value: {type(e).__name__}")
        if coerced:
            self._fault("non_json")
        if len(text) > MAX_OBS_CHARS:
            self._fault("too_large")
            return error_obs("too_large", f"observation of {len(text)} characters exceeds {MAX_OBS_CHARS}")
        return json.loads(text)  # normalise (tuples -> lists, non-JSON scalars -> str)

    @abstractmethod
    def _execute(self, call: ToolCall) -> Any:
        """Run a validated call and return its JSON-able result; raise :class:`ToolError` for expected failures."""

    def _execute_user(self, call: ToolCall) -> Any:
        """Run a validated user-side call (environments whose tasks have ``user_tools`` override this)."""
        raise ToolError(f"environment {self.task.env!r} has no user-side tools")

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """A JSON snapshot of the environment's state."""

    @abstractmethod
    def score(self, traj: Trajectory) -> Score:
        """Apply the task's own success check to a finished trajectory run against this environment."""

    def close(self) -> None:
        pass


def call_with_timeout(fn: Callable[[], Any], timeout_s: float) -> Any:
    """Run ``fn`` in a worker thread; return its result, or a timeout error observation after ``timeout_s``.
    (A Python thread cannot be killed: a hung tool keeps its thread, but the rollout goes on.)"""
    done, value = _run_with_timeout(fn, timeout_s)
    return value if done else error_obs("timeout", f"tool did not return within {timeout_s:g}s")


def _run_with_timeout(fn: Callable[[], Any], timeout_s: float) -> tuple[bool, Any]:
    """``(True, fn())`` if ``fn`` returns within ``timeout_s`` (its exception is re-raised), else ``(False, None)``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        return False, None
    if "error" in box:
        raise box["error"]
    return True, box["value"]


def make_env(task: Task) -> Environment:
    """The real environment of a task (refused for a task not yet prepared: :func:`require_prepared`)."""
    ensure_registered(task.env)
    require_prepared([task])
    return ENVS.get(task.env.split(":", 1)[0])(task)


def alive_bound(task: Task) -> int | None:
    """How many environments of ``task``'s kind a rollout keeps alive at once: the task's
    ``env_config["max_alive"]``, else its environment's :attr:`Environment.max_alive` (None: no bound)."""
    bound = task.env_config.get("max_alive")
    if bound is None:
        ensure_registered(task.env)
        bound = getattr(ENVS.get(task.env.split(":", 1)[0]), "max_alive", None)
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 1):
        raise ValueError(f"task {task.id!r}: max_alive must be an integer >= 1, got {bound!r}")
    return bound


def unprepared(task: Task) -> str | None:
    """Why the task needs its environment's :meth:`Environment.prepare` before it runs, or None when it does not."""
    why = task.env_config.get(UNPREPARED)
    return None if why is None else str(why)


def require_prepared(tasks: Sequence[Task]) -> None:
    """Raise ``ValueError`` (naming the first such task and why) if a task still needs preparing."""
    waiting = [t for t in tasks if unprepared(t) is not None]
    if waiting:
        more = f" (and {len(waiting) - 1} more)" if len(waiting) > 1 else ""
        raise ValueError(
            f"task {waiting[0].id!r}{more} cannot run before its environment prepares it: {unprepared(waiting[0])}"
        )


def prepare_groups(tasks: list[Task], play: Play, prepare_of: Callable[[Task], Prepare | None]) -> list[Task]:
    """The tasks, each group sharing one prepare function (``prepare_of``; None: nothing to prepare) prepared by
    it, back in their places. A prepare that returns other tasks (count or ids) is an error."""
    out = list(tasks)
    groups: dict[Prepare, list[int]] = {}
    for i, t in enumerate(tasks):
        fn = prepare_of(t)
        if fn is not None:
            groups.setdefault(fn, []).append(i)
    for fn, idx in groups.items():
        done = fn([tasks[i] for i in idx], play)
        if [t.id for t in done] != [tasks[i].id for i in idx]:
            raise ValueError(f"{fn!r} returned other tasks than it was given")
        for i, t in zip(idx, done):
            out[i] = t
    return out


def prepare_tasks(tasks: list[Task], play: Play) -> list[Task]:
    """The tasks ready to run: those not ready (:func:`unprepared`) prepared by their environment factory's
    ``prepare`` (:meth:`Environment.prepare`) with ``play``, in place; the others as they are. A task still
    unprepared afterwards is an error (:func:`require_prepared`)."""
    if all(unprepared(t) is None for t in tasks):
        return tasks

    def prepare_of(task: Task) -> Prepare | None:
        if unprepared(task) is None:
            return None
        ensure_registered(task.env)
        return getattr(ENVS.get(task.env.split(":", 1)[0]), "prepare", None)

    out = prepare_groups(tasks, play, prepare_of)
    require_prepared(out)
    return out


class ReplayNotAllowedError(ValueError):
    """A replay would execute calls a second time in an environment whose tools may have real side effects."""


def replay_allowed(task: Task) -> bool:
    """Whether :func:`replay` may run calls in a fresh environment of ``task``: its environment is replay-safe
    (:attr:`Environment.replay_safe`), or the task opts in with ``env_config["allow_replay"] = True``."""
    ensure_registered(task.env)
    factory = ENVS.get(task.env.split(":", 1)[0])
    return bool(getattr(factory, "replay_safe", True)) or task.env_config.get("allow_replay") is True


def replay(task: Task, calls: list[ToolCall]) -> tuple[Environment, list[Any]]:
    """Execute calls in a fresh real environment of the task; return the environment and the observations.

    Refused (:class:`ReplayNotAllowedError`) where the environment is not replay-safe and the task does not
    opt in: on an MCP server the calls would really run again."""
    if not replay_allowed(task):
        raise ReplayNotAllowedError(
            f"replaying {len(calls)} call(s) of task {task.id!r} would run them again on environment {task.env!r}, "
            "whose tools may have real side effects; score trajectories that ran in it from that run (real mode "
            "records its outcome), or, if re-running the calls is harmless, opt in with env_config allow_replay: true "
            '(an MCP tasks file: "allow_replay": true)'
        )
    env = make_env(task)
    return env, [env.call(c) for c in calls]


def final_outcome(env: Environment, traj: Trajectory) -> dict[str, Any]:
    """``env``'s own success check of ``traj`` (``env`` being the environment its calls ran in), as JSON:
    ``{"success", "reward", "details", "n_calls"}``, or ``{"error": ...}`` when the check raised."""
    try:
        s = env.score(traj)
        return json.loads(
            json.dumps(
                {"success": bool(s.success), "reward": float(s.reward), "details": s.details, "n_calls": env.n_calls},
                default=str,
            )
        )
    except Exception as e:  # noqa: BLE001 - a crashing success check is reported, the trajectory goes unscored
        return {"error": f"{type(e).__name__}: {str(e)[:300]}", "n_calls": env.n_calls}


@dataclass
class CheckReport:
    ok: bool
    problems: list[str]


def check_env(
    task: Task, calls: list[ToolCall] | None = None, factory: Callable[[Task], Environment] | None = None
) -> CheckReport:
    """Check an environment the way rehearsal fidelity needs it: two fresh environments given the same calls
    return the same observations and end in the same state; states and observations are JSON; tool errors
    come back as error observations. ``calls`` defaults to the task's gold actions."""
    factory = factory or make_env
    calls = task.flat_gold() if calls is None else calls
    problems: list[str] = []
    runs = []
    for _ in range(2):
        env = factory(task)
        try:
            obs = [env.call(c) for c in calls]
            # a call to an unknown tool must come back as an error, not raise
            bogus = env.call(ToolCall(name="__no_such_tool__", arguments={}))
            if not is_error_obs(bogus) or bogus["error"]["kind"] != "unknown_tool":
                problems.append(f"unknown tool gave {bogus!r}, expected an unknown_tool error")
            state = env.state()
            json.dumps(state)
            json.dumps(obs)
        except Exception as e:  # noqa: BLE001
            problems.append(f"{type(e).__name__}: {e}")
            return CheckReport(False, problems)
        finally:
            env.close()
        runs.append((obs, state))
    (o1, s1), (o2, s2) = runs
    for i, (a, b) in enumerate(zip(o1, o2)):
        if a != b:
            problems.append(f"call {i} ({calls[i].name}) not deterministic: {a!r} != {b!r}")
    if s1 != s2:
        problems.append("final state differs between two identical runs")
    return CheckReport(not problems, problems)
