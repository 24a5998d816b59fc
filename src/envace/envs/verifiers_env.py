"""verifiers tasksets (the ``verifiers`` package, 0.4: ``verifiers.v1``) as envace suites: tasks, real tools, rubric.

A verifiers environment is a ``Taskset`` (its ``load()`` yields ``Task`` s: a ``TaskData`` row with the prompt and
the task's own fields, such as an answer) whose tools are ``Toolset`` s (classes of ``@vf.tool`` methods, served
over MCP; the taskset's ``toolsets(config)`` are shared by its tasks, the task class's ``toolsets(config)`` are made
per rollout) and whose rubric is the task's ``@vf.reward`` methods (and ``@vf.metric`` s, recorded beside them).
The suite spec names one:

- ``verifiers:<module>:<name>`` or ``verifiers:<path/to/file.py>:<name>``: ``<name>`` is a ``Taskset`` instance, a
  ``Taskset`` subclass (built with its default config) or a function of no arguments returning a ``Taskset``;
- ``verifiers:<taskset id>``: an installed verifiers taskset package, as ``vf-eval <id>`` loads it.

**Tasks.** Each verifiers task becomes an envace task of environment ``verifiers:<ref>``: its system prompt
(``TaskData.system_prompt``, else the prompt's system messages, else :data:`DEFAULT_SYSTEM`), one user turn (a text
prompt, or the text of the prompt's user messages), and the tools of its toolsets with their JSON schemas, named as
verifiers names them for the model (``<server>_<tool>``, or the bare tool name where the toolset's ``TOOL_PREFIX``
is None). Verifiers tasksets have no splits: a task's split is a stable hash of its key (:data:`TEST_FRACTION` of
them ``test``); ``all`` is both. The task's key, index and class are in ``metadata``; the row's own fields (an
answer) are not copied into the envace task, so nothing shown to the policy leaks them.

**The real environment** (:class:`VerifiersEnv`) runs the toolsets in this process: fresh instances per trajectory
(the taskset's shared ones too, so no state crosses trajectories), ``setup()`` (and ``setup_task(task)`` for the
task's own toolsets), each registered on an in-process ``MCPServer``; a call runs the real Python tool through it
(:data:`CALL_TIMEOUT_S`), and its result is an observation as over MCP (``envace.envs.mcp.result_observation``; a
tool that raises is a ``tool_error``). A toolset's typed state (``Toolset[Config, MyState]``, synced over an HTTP
channel in verifiers) is kept in the environment and is its :meth:`VerifiersEnv.state`. Nothing the model writes is
ever executed: only the named tool, with JSON arguments validated against its schema.

**The rubric** scores a trajectory: the trajectory becomes a verifiers ``Trace`` (the prompt, each assistant turn
with its tool calls, each observation as a tool message, the replies) and the task's ``score(trace)`` runs its
reward functions (async ones awaited, on the adapter's event loop) without a runtime (a reward that needs one is
skipped, as verifiers does offline). :func:`rubric_score` is the weighted sum of the rewards over the sum of the
positive weights, clipped to [0, 1]; the environment's success check (:meth:`VerifiersEnv.score`) succeeds when it
is 1. Registered rewards: ``"grounded"`` (the success check on the real run) and ``"verifiers_rubric"``
(:func:`envace.rewards.functions.verifiers_rubric`: the rubric score of any trajectory, a rehearsed one included,
without running a tool: usable as a training reward). Tools here are Python code that may reach the world, so a
rehearsed trajectory is not replayed for ``"grounded"`` unless the task opts in (``env_config["allow_replay"]``).

Bad input is a one-line ``ValueError`` naming what is wrong and the valid choices (:class:`VerifiersError`).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import math
import os
import random
import re
import sys
import threading
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.graph import MessageNode
from verifiers.v1.trace import AgentInfo, Trace, TraceTask
from verifiers.v1.types import AssistantMessage, SystemMessage, ToolMessage, UserMessage
from verifiers.v1.types import ToolCall as VFToolCall
from verifiers.v1.types import content_text

from ..core.types import Task, ToolCall, ToolSpec, Trajectory, error_obs
from .base import Environment, Score, ToolError
from .mcp import result_observation
from .registry import ENVS, SUITES
from .suites import hash_split

NAME = "verifiers"
SPLITS: tuple[str, ...] = ("train", "test", "all")
TEST_FRACTION = 0.3
CALL_TIMEOUT_S = 30.0  # one tool call
SETUP_TIMEOUT_S = 120.0  # a toolset's setup / setup_task / teardown, and one rubric scoring
DEFAULT_SYSTEM = "You are a helpful assistant. Use the tools when they help, then answer."
USAGE = (
    "'verifiers:<module>:<name>' or 'verifiers:<path/to/file.py>:<name>' (a verifiers Taskset, a Taskset subclass or "
    "a function returning a Taskset), or 'verifiers:<installed taskset id>'"
)


class VerifiersError(ValueError):
    """A verifiers taskset that cannot be adapted: the message is one line, naming what is wrong and the choices."""


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: " + " ".join(str(e).split())[:300]


# ---------------------------------------------------------------------------------- the event loop

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    """The adapter's event loop, in a daemon thread: toolsets, tools and rewards are async, and an environment may be
    used from any thread (the rollout's workers), even one that runs its own loop."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP.is_closed():
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="verifiers-env", daemon=True).start()
        return _LOOP


def run_async(coro: Any, timeout_s: float) -> Any:
    """``await coro`` on the adapter's loop; ``TimeoutError`` (the coroutine cancelled) after ``timeout_s``."""
    fut = asyncio.run_coroutine_threadsafe(coro, _loop())
    try:
        return fut.result(timeout_s)
    except TimeoutError:
        fut.cancel()
        raise


# ---------------------------------------------------------------------------------- resolving a taskset


def _import(module: str, ref: str) -> Any:
    try:
        if module.endswith(".py"):
            if not os.path.isfile(module):
                raise VerifiersError(f"verifiers taskset {ref!r}: no such file {module!r}; expected {USAGE}")
            name = "envace_vf_" + re.sub(r"\W", "_", os.path.abspath(module))
            if name not in sys.modules:
                spec = importlib.util.spec_from_file_location(name, module)
                mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
                sys.modules[name] = mod
                try:
                    spec.loader.exec_module(mod)  # type: ignore[union-attr]
                except BaseException:
                    del sys.modules[name]
                    raise
            return sys.modules[name]
        return importlib.import_module(module)
    except VerifiersError:
        raise
    except Exception as e:  # noqa: BLE001 - the taskset's module is not envace's: one line
        raise VerifiersError(f"verifiers taskset {ref!r}: module {module!r} does not import ({_one_line(e)})") from e


def _tasksets_in(mod: Any) -> list[str]:
    """The names in ``mod`` that a spec may name: Taskset instances and subclasses (functions are not listed)."""

    def own_subclass(v: Any) -> bool:  # defined in mod, not imported into it
        return isinstance(v, type) and issubclass(v, vf.Taskset) and v.__module__ == mod.__name__

    return sorted(
        k for k, v in vars(mod).items() if not k.startswith("_") and (isinstance(v, vf.Taskset) or own_subclass(v))
    )


def _build(obj: Any, what: str, ref: str) -> vf.Taskset:
    if isinstance(obj, vf.Taskset):
        return obj
    if isinstance(obj, type) and issubclass(obj, vf.Taskset):
        from verifiers.v1.utils.generic import concrete_type

        config_cls = concrete_type(obj, vf.TasksetConfig) or vf.TasksetConfig
        try:
            return obj(config_cls())
        except Exception as e:  # noqa: BLE001
            raise VerifiersError(
                f"verifiers taskset {ref!r}: {what!r} cannot be built with its default config {config_cls.__name__}() "
                f"({_one_line(e)}); name a function that returns the Taskset built as it needs"
            ) from e
    if callable(obj):
        try:
            made = obj()
        except Exception as e:  # noqa: BLE001
            raise VerifiersError(f"verifiers taskset {ref!r}: {what}() failed ({_one_line(e)})") from e
        if isinstance(made, vf.Taskset) or (isinstance(made, type) and issubclass(made, vf.Taskset)):
            return _build(made, f"{what}()", ref)
        raise VerifiersError(
            f"verifiers taskset {ref!r}: {what}() returned an object of type {type(made).__name__}, not a verifiers "
            "Taskset (verifiers.v1.Taskset: an instance or a subclass)"
        )
    raise VerifiersError(
        f"verifiers taskset {ref!r}: {what!r} is of type {type(obj).__name__}, not a verifiers Taskset, a Taskset "
        "subclass or a function returning one"
    )


def resolve_taskset(ref: str) -> vf.Taskset:
    """The verifiers ``Taskset`` that ``ref`` (the part of the spec after ``verifiers:``) names."""
    ref = ref.strip()
    if not ref:
        raise VerifiersError(f"the verifiers suite needs a taskset: {USAGE}")
    module, colon, attr = ref.rpartition(":")
    if not colon:  # an installed taskset package, as verifiers itself loads it
        from verifiers.v1.utils import loaders

        try:
            cls = loaders.taskset_class(ref)
            return cls(loaders.taskset_config_type(ref)())
        except Exception as e:  # noqa: BLE001
            raise VerifiersError(
                f"verifiers taskset {ref!r} is not an installed taskset package ({_one_line(e)}); expected {USAGE}"
            ) from e
    if not module or not attr:
        raise VerifiersError(f"verifiers taskset {ref!r} names no module or no object; expected {USAGE}")
    mod = _import(module, ref)
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            found = _tasksets_in(mod)
            choices = f"its tasksets: {', '.join(found)}" if found else "it defines no Taskset (instance or subclass)"
            raise VerifiersError(f"verifiers taskset {ref!r}: module {module!r} has no {attr!r}; {choices}")
        obj = getattr(obj, part)
    return _build(obj, attr, ref)


# ---------------------------------------------------------------------------------- toolsets


def _servers(taskset: vf.Taskset, vtask: vf.Task) -> list[tuple[Any, bool]]:
    """Fresh instances of the taskset's shared toolsets and of the task's own, each with ``per_task`` (whether it
    gets ``setup_task``)."""
    shared = [(s, False) for s in type(taskset).toolsets(taskset.config)]
    own = [(s, True) for s in type(vtask).toolsets(vtask.config)]
    for s, _ in shared + own:
        if not isinstance(s, vf.Toolset):
            raise VerifiersError(
                f"a toolsets() of verifiers task {type(vtask).__name__} returned a {type(s).__name__}; envace runs "
                "verifiers Toolset instances (classes of @vf.tool methods) in process"
            )
    return shared + own


def _hold_state(server: Any) -> Any:
    """Keep ``server``'s typed state in this process (verifiers syncs it over an HTTP channel): every call of the
    server reads and changes the same state object, returned here."""
    state = server._state_cls()

    async def pull() -> Any:
        return state

    async def push(before: bytes) -> None:
        return None

    server._pull_state, server._push_state = pull, push
    return state


class _Tools:
    """The toolsets of one task, set up and registered on in-process MCP servers: ``specs`` and ``call``."""

    def __init__(self, taskset: vf.Taskset, vtask: vf.Task, setup: bool):
        from mcp.server.mcpserver import MCPServer

        self.servers = _servers(taskset, vtask)
        self.states: dict[str, Any] = {}
        self.dispatch: dict[str, tuple[Any, str]] = {}
        self.specs: list[ToolSpec] = []
        self._setup_done: list[Any] = []
        try:
            for server, per_task in self.servers:
                prefix = server.server_name
                self.states[prefix or type(server).__name__] = _hold_state(server)
                if setup:
                    run_async(server.setup(), SETUP_TIMEOUT_S)
                    self._setup_done.append(server)
                    if per_task:
                        run_async(server.setup_task(vtask), SETUP_TIMEOUT_S)
                mcp = MCPServer(prefix or type(server).__name__)
                server.register(mcp)
                for tool in run_async(mcp.list_tools(), SETUP_TIMEOUT_S):
                    name = f"{prefix}_{tool.name}" if prefix else tool.name
                    if name in self.dispatch:
                        raise VerifiersError(
                            f"verifiers task {type(vtask).__name__}: two toolsets offer a tool {name!r}; give them "
                            "distinct names (or a TOOL_PREFIX)"
                        )
                    self.dispatch[name] = (mcp, tool.name)
                    schema = dict(tool.input_schema or {"type": "object", "properties": {}})
                    schema.pop("title", None)
                    self.specs.append(ToolSpec(name=name, description=tool.description or "", parameters=schema))
        except BaseException:
            self.close()
            raise

    def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """The observation of one call; a tool that raises is a :class:`ToolError` (its message), as an MCP server
        answers it (``isError``); ``TimeoutError`` after :data:`CALL_TIMEOUT_S`."""
        from mcp.shared.exceptions import MCPError

        mcp, raw = self.dispatch[name]
        try:
            result = run_async(mcp.call_tool(raw, arguments), CALL_TIMEOUT_S)
        except (TimeoutError, MCPError):
            raise
        except Exception as e:  # noqa: BLE001 - what the tool raised is the model's observation
            raise ToolError(" ".join(str(e).split())[:1000] or type(e).__name__) from e
        return result_observation(result)

    def close(self) -> None:
        while self._setup_done:
            server = self._setup_done.pop()
            try:
                run_async(server._exit_stack.aclose(), SETUP_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - closing must not raise
                pass


# ---------------------------------------------------------------------------------- tasks

_LOADED: dict[str, tuple[vf.Taskset, list[vf.Task], list[ToolSpec]]] = {}
_LOADED_LOCK = threading.Lock()


def loaded(ref: str) -> tuple[vf.Taskset, list[vf.Task], list[ToolSpec]]:
    """``(taskset, its tasks in load() order, their tools)`` of ``ref``, loaded once per process."""
    with _LOADED_LOCK:
        if ref not in _LOADED:
            taskset = resolve_taskset(ref)
            if not taskset.bounded:
                raise VerifiersError(
                    f"verifiers taskset {ref!r} is infinite; envace loads a finite one: name a function that returns "
                    "it bounded (taskset.take(n))"
                )
            try:
                tasks = list(taskset)
            except Exception as e:  # noqa: BLE001
                raise VerifiersError(f"verifiers taskset {ref!r}: load() failed ({_one_line(e)})") from e
            if not tasks:
                raise VerifiersError(f"verifiers taskset {ref!r}: load() yielded no task")
            tools = _Tools(taskset, tasks[0], setup=False).specs  # one task type per taskset: the same tools
            _LOADED[ref] = (taskset, tasks, tools)
        return _LOADED[ref]


def _prompt(ref: str, vtask: vf.Task) -> tuple[str | None, str]:
    """``(system text or None, the user turn)`` of a verifiers task's prompt."""
    data = vtask.data
    prompt = data.prompt
    where = f"verifiers taskset {ref!r} task {data.idx}"
    if prompt is None:
        raise VerifiersError(
            f"{where} has no prompt (the user opens the conversation); envace adapts tasks whose TaskData.prompt is "
            "a text or a list of system and user messages"
        )
    if isinstance(prompt, str):
        return None, prompt
    system, user = [], []
    for m in prompt:
        role = getattr(m, "role", None)
        if role == "system":
            system.append(content_text(m.content))
        elif role == "user":
            user.append(content_text(m.content))
        else:
            raise VerifiersError(
                f"{where}: its prompt has a {role!r} message; envace adapts prompts of system and user messages "
                "(roles: system, user)"
            )
    if not user:
        raise VerifiersError(f"{where}: its prompt has no user message (roles given: system only)")
    return ("\n\n".join(system) or None), "\n\n".join(user)


def _slug(ref: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", os.path.basename(ref.replace(":", "/").rstrip("/")) or ref).strip("_")[:40]


def to_task(ref: str, vtask: vf.Task, tools: list[ToolSpec]) -> Task:
    """The envace task of verifiers task ``vtask`` of taskset ``ref``."""
    data = vtask.data
    system, user = _prompt(ref, vtask)
    key = vtask.key
    return Task(
        id=f"vf_{_slug(ref)}_{data.id if data.id is not None else data.idx}",
        env=f"{NAME}:{ref}",
        system_prompt=data.system_prompt or system or DEFAULT_SYSTEM,
        user_turns=[user],
        tools=list(tools),
        env_config={"taskset": ref, "index": data.idx, "key": key},
        split=hash_split(f"verifiers-{key}", TEST_FRACTION),  # the task's content, wherever the taskset is named
        metadata={"source": NAME, "taskset": ref, "vf_task": type(vtask).__name__, "vf_id": data.id, "key": key},
    )


def load_verifiers_tasks(spec: str, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
    """``verifiers:<ref>``: the taskset's tasks of ``split`` (train, test or all), ``n`` of them sampled with
    ``seed`` (in load() order)."""
    if split not in SPLITS:
        raise VerifiersError(f"unknown split {split!r} for verifiers tasksets; valid: {', '.join(SPLITS)}")
    ref = spec.split(":", 1)[1].strip() if ":" in spec else ""
    if not ref:
        raise VerifiersError(f"the verifiers suite needs a taskset: {USAGE}")
    _, vtasks, tools = loaded(ref)
    tasks = [to_task(ref, t, tools) for t in vtasks]
    tasks = [t for t in tasks if split == "all" or t.split == split]
    if n is not None and n < len(tasks):
        keep = sorted(random.Random(seed).sample(range(len(tasks)), n))
        tasks = [tasks[i] for i in keep]
    return tasks


def verifiers_task(task: Task) -> tuple[vf.Taskset, vf.Task]:
    """The verifiers taskset and task an envace task of this adapter came from."""
    cfg = task.env_config
    if "taskset" not in cfg or "index" not in cfg:
        raise VerifiersError(
            f"task {task.id!r} of environment {task.env!r} names no verifiers task (env_config needs 'taskset' and "
            "'index', as load_tasks('verifiers:...') writes them)"
        )
    taskset, vtasks, _ = loaded(cfg["taskset"])
    index = cfg["index"]
    if not isinstance(index, int) or not 0 <= index < len(vtasks):
        raise VerifiersError(
            f"task {task.id!r}: index {index!r} is not a task of verifiers taskset {cfg['taskset']!r} "
            f"(0..{len(vtasks) - 1})"
        )
    vtask = vtasks[index]
    if cfg.get("key") not in (None, vtask.key):
        raise VerifiersError(
            f"task {task.id!r}: verifiers taskset {cfg['taskset']!r} now has another task at index {index} (its key "
            "changed); load the tasks again"
        )
    return taskset, vtask


# ---------------------------------------------------------------------------------- the rubric


def _text(obs: Any) -> str:
    return obs if isinstance(obs, str) else json.dumps(obs, ensure_ascii=False)


def to_trace(task: Task, vtask: vf.Task, traj: Trajectory) -> Trace:
    """``traj`` as a verifiers ``Trace`` of ``vtask``: the prompt as the task gives it, then per step the assistant
    message (its reply, or its tool calls with the action text) and one tool message per observation; a later user
    turn is a user message."""
    data = vtask.data
    messages: list[Any] = []
    if data.system_prompt:
        messages.append(SystemMessage(content=data.system_prompt))
    if isinstance(data.prompt, str):
        messages.append(UserMessage(content=data.prompt))
    else:
        messages.extend(data.prompt or [])
    n_prompt = len(messages)
    turn = 0
    for i, step in enumerate(traj.steps):
        if step.user_turn != turn and step.user_turn < len(task.user_turns):
            turn = step.user_turn
            messages.append(UserMessage(content=task.user_turns[turn]))
        if step.calls:
            ids = [f"call_{i}_{j}" for j in range(len(step.calls))]
            calls = [
                VFToolCall(id=cid, name=c.name, arguments=json.dumps(c.arguments, ensure_ascii=False))
                for cid, c in zip(ids, step.calls)
            ]
            messages.append(AssistantMessage(content=step.reply, tool_calls=calls))
            for cid, c, obs in zip(ids, step.calls, step.observations):
                messages.append(ToolMessage(tool_call_id=cid, name=c.name, content=_text(obs)))
        else:
            messages.append(AssistantMessage(content=step.reply if step.reply is not None else step.action_text))
    nodes = [
        MessageNode(parent=i - 1 if i else None, message=m, sampled=i >= n_prompt and m.role == "assistant")
        for i, m in enumerate(messages)
    ]
    return Trace(
        task=TraceTask(type=type(vtask).__name__, data=data, key=vtask.key, hash=vtask.hash),
        agent=AgentInfo(config=vf.AgentConfig()),
        nodes=nodes,
        is_completed=traj.truncated is None,
        ok=True,
    )


def rubric_score(task: Task, traj: Trajectory) -> Score:
    """The task's verifiers rubric on ``traj`` as it stands (real or rehearsed; no tool runs): ``reward`` = the
    weighted sum of its rewards over the sum of the positive weights, clipped to [0, 1]; ``success`` when that is
    1. ``details``: each reward's score and weight, the metrics, verifiers' own total (``vf_reward``)."""
    _, vtask = verifiers_task(task)
    trace = to_trace(task, vtask, traj)
    run_async(vtask.score(trace), SETUP_TIMEOUT_S)
    rewards = {k: r for k, r in trace.rewards.items() if r is not None}
    if not rewards:
        return Score(False, 0.0, {"note": f"verifiers task {type(vtask).__name__} has no reward function (@vf.reward)"})
    total = sum(r.score * r.weight for r in rewards.values())
    positive = sum(r.weight for r in rewards.values() if r.weight > 0)
    value = total / positive if positive > 0 else 0.0
    value = 0.0 if not math.isfinite(value) else min(1.0, max(0.0, value))
    details = {
        "rewards": {k: {"score": r.score, "weight": r.weight} for k, r in rewards.items()},
        "metrics": {k: v for k, v in trace.metrics.items() if v is not None},
        "vf_reward": total,
    }
    return Score(value >= 1.0 - 1e-9, value, details)


# ---------------------------------------------------------------------------------- the environment


class VerifiersEnv(Environment):
    """One verifiers task with its toolsets running in this process (see the module docstring)."""

    replay_safe = False  # a toolset is Python code that may reach the world: a replay needs env_config allow_replay

    def __init__(self, task: Task):
        super().__init__(task)
        taskset, self.vtask = verifiers_task(task)
        self.toolsets = _Tools(taskset, self.vtask, setup=True)
        self.history: list[dict[str, Any]] = []

    @property
    def tools(self) -> list[ToolSpec]:
        return self.task.tools or self.toolsets.specs

    def _execute(self, call: ToolCall) -> Any:
        try:  # a validated call (Environment.call): a tool of this task, arguments that fit its schema
            obs = self.toolsets.call(call.name, call.arguments)
        except TimeoutError:
            self._fault("timeout")
            obs = error_obs("timeout", f"tool {call.name!r} did not return within {CALL_TIMEOUT_S:g}s")
        self.history.append({"call": call.to_dict(), "observation": obs})
        return obs

    def state(self) -> dict[str, Any]:
        states = {}
        for name, s in self.toolsets.states.items():
            try:
                states[name] = s.model_dump(mode="json")
            except Exception:  # noqa: BLE001 - a state that is not JSON is shown as text
                states[name] = str(s)
        return json.loads(json.dumps({"toolsets": states, "history": self.history}, default=str))

    def score(self, traj: Trajectory) -> Score:
        return rubric_score(self.task, traj)

    def close(self) -> None:
        self.toolsets.close()


ENVS.add(NAME, VerifiersEnv)
SUITES.add(NAME, load_verifiers_tasks)
