"""The environment protocol, in the spirit of Gymnasium's ``Env`` and verifiers' ``env_response``.

An :class:`Environment` is the *real* world of one task: it is created from the task, executes tool calls
(returning observations; tool exceptions and timeouts become error observations and never escape), exposes a
JSON snapshot of its state, and scores a finished trajectory.

Environments are created by name through :data:`ENVS` (``task.env``, e.g. ``"bank"`` or ``"tau2:retail"``;
the part before ``:`` selects the factory) and task sets are loaded through :data:`SUITES`.

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
from ..core.registry import Registry
from ..core.types import Message, Task, ToolCall, ToolSpec, Trajectory, UserStep, error_obs, is_error_obs

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
trajectories in task order: what :meth:`Environment.prepare` gets (evaluation's: ``envace.evaluation.trials.player``)."""
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


# name -> factory(task) -> Environment. The name is the part of ``task.env`` before ':'.
ENVS: Registry[Callable[[Task], Environment]] = Registry("environment")
# name -> loader(spec, split, n, seed) -> list[Task]. ``spec`` is the full string (e.g. "bfcl:multi_turn_base").
SUITES: Registry[Callable[..., list[Task]]] = Registry("task suite")


# name -> task_at(spec, split, index) -> Task: a suite's task ``index`` of its stable order, built alone (the generated
# built-in suites, whose end is far off); :func:`task_at` loads the whole split of any other suite and indexes it.
TASK_AT: Registry[Callable[[str, str, int], Task]] = Registry("task indexer")


# name -> summary(per-task rows of an evaluation, suite spec) -> {"title", "text", ...}: a benchmark's own report of
# an evaluation of its tasks (BFCL's leaderboard table), shown after the metrics and saved with the result.
SUMMARIES: Registry[Callable[[Sequence[dict[str, Any]], str], dict[str, Any]]] = Registry("suite summary")


def suite_summary(spec: str, per_task: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The suite's own summary of an evaluation's per-task rows (:data:`SUMMARIES`), or None when it has none. A
    summary that fails says so in its text (``{"title", "text", "error"}``): the evaluation's results stand."""
    from . import ensure_registered
    from .references import split_spec

    spec, _ = split_spec(spec)
    ensure_registered(spec)
    prefix = spec.split(":", 1)[0]
    if prefix not in SUMMARIES:
        return None
    try:
        return SUMMARIES.get(prefix)(per_task, spec)
    except Exception as e:  # noqa: BLE001 - reported next to the metrics, never a lost evaluation
        error = f"{type(e).__name__}: {str(e)[:300]}"
        return {"title": f"{prefix} summary", "text": f"{prefix} summary failed: {error}", "error": error}


def make_env(task: Task) -> Environment:
    """The real environment of a task (refused for a task not yet prepared: :func:`require_prepared`)."""
    from . import ensure_registered

    ensure_registered(task.env)
    require_prepared([task])
    return ENVS.get(task.env.split(":", 1)[0])(task)


def alive_bound(task: Task) -> int | None:
    """How many environments of ``task``'s kind a rollout keeps alive at once: the task's
    ``env_config["max_alive"]``, else its environment's :attr:`Environment.max_alive` (None: no bound)."""
    from . import ensure_registered

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
    from . import ensure_registered

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


def load_tasks(spec: str, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
    """Load ``n`` tasks of a suite (``"builtin"``, ``"bank"``, ``"bfcl:multi_turn_base"``, ...) and split.
    Their references are records of other train tasks (``envace.envs.references``); the suffix
    ``@oracle-references`` (``"bank@oracle-references"``, ablations only: the answer leaks) gives each task its
    own gold calls with their real results instead, and every report using it says so in its title."""
    from . import ensure_registered
    from .references import REFERENCE_MODES, split_spec

    spec, mode = split_spec(spec)
    ensure_registered(spec)
    tasks = SUITES.get(spec.split(":", 1)[0])(spec, split=split, n=n, seed=seed)
    return REFERENCE_MODES.get(mode)(tasks) if mode else tasks


def task_at(spec: str, split: str, index: int) -> Task:
    """Task ``index`` (0-based) of a suite's split in the suite's own stable order, the order of
    ``load_tasks(spec, split)`` (a seeded sample of fewer tasks is another order). An index past the end (or below
    0) is a one-line error that says how many tasks there are; a generated built-in suite builds only that task."""
    from . import ensure_registered
    from .references import REFERENCE_MODES, split_spec

    base, mode = split_spec(spec)
    ensure_registered(base)
    name = base.split(":", 1)[0]
    if index < 0:
        raise ValueError(f"task index {index} of suite {spec!r} is negative; the first task is 0")
    if name in TASK_AT:
        task = TASK_AT.get(name)(base, split, index)
    else:
        tasks = SUITES.get(name)(base, split=split, n=None, seed=0)
        if index >= len(tasks):
            last = f" (0..{len(tasks) - 1})" if tasks else ""
            raise ValueError(
                f"task index {index} is past the end of suite {spec!r} split {split!r}: it has {len(tasks)} tasks{last}"
            )
        task = tasks[index]
    return REFERENCE_MODES.get(mode)([task])[0] if mode else task


KIND_GROWTH = 64  # load_tasks_of_kinds loads at most KIND_GROWTH * n tasks to find n of the asked kinds


def load_tasks_of_kinds(
    spec: str, split: str, n: int | None, seed: int, kinds: tuple[str, ...] | None, where: str = "task_kinds"
) -> list[Task]:
    """``n`` tasks of a suite and split whose ``metadata["kind"]`` is one of ``kinds`` (None: :func:`load_tasks`
    itself). They are the first ``n`` such tasks of ``load_tasks(spec, split, m, seed)`` for the smallest
    ``m = n * 2**j`` that has ``n`` of them (so with seed 0, the first ``n`` of the split's tasks of those kinds);
    fewer only where the suite runs out or ``m`` reaches ``KIND_GROWTH * n``. A filter that keeps no task is an
    error naming the kinds the suite's tasks do have (only the built-in suites label kinds)."""
    if kinds is None or n == 0:
        return load_tasks(spec, split, n=n, seed=seed)
    m = n
    while True:
        tasks = load_tasks(spec, split, n=m, seed=seed)
        kept = [t for t in tasks if t.metadata.get("kind") in kinds]
        if n is None or len(kept) >= n or len(tasks) < m or m >= KIND_GROWTH * n:
            break
        m *= 2
    if not kept:
        have: dict[str, int] = {}
        for t in tasks:
            k = str(t.metadata.get("kind", "<no kind label>"))
            have[k] = have.get(k, 0) + 1
        raise ValueError(f"{where}={list(kinds)} keeps none of {len(tasks)} {spec}/{split} tasks; their kinds: {have}")
    return kept[:n] if n is not None else kept


class ReplayNotAllowedError(ValueError):
    """A replay would execute calls a second time in an environment whose tools may have real side effects."""


def replay_allowed(task: Task) -> bool:
    """Whether :func:`replay` may run calls in a fresh environment of ``task``: its environment is replay-safe
    (:attr:`Environment.replay_safe`), or the task opts in with ``env_config["allow_replay"] = True``."""
    from . import ensure_registered

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
            "whose tools may have real side effects; score trajectories that ran in it from that run (real mode records "
            "its outcome), or, if re-running the calls is harmless, opt in with env_config allow_replay: true "
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
    "note": "no real environment in this rollout mode: the action is recorded and applied when the conversation is scored",
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
