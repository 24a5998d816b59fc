"""The core data model: tools, calls, messages, tasks, generations, rows and trajectories.

Everything here is a plain dataclass. All but a backend's :class:`Generation` (made into a :class:`Row` before
anything is saved) round-trip through JSON (``to_dict`` / ``from_dict``) so that tasks, trajectories and rows can
be written as JSON lines and read back by a person or a later process. Most get both from :class:`JSONable`
(envace.core.config, with the config codec): one key per field, in field order (so the field order is the JSON key
order), nested dataclasses by their own ``to_dict`` / ``from_dict`` as the field types say; a missing key takes
the field default. The few that write another shape (a ``Message`` without calls, an OpenAI tool wrapper) say so
in their own methods.

Observations are JSON values. An error observation is ``{"error": {"kind": KIND, "message": TEXT}}`` with
KIND one of :data:`ERROR_KINDS`; the same shape is used by real environments, by the Rehearse role and by
the parsers, so a rehearsed error can be compared with a real one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from .config import JSONable, fields_from_dict, fields_to_dict  # noqa: F401 - (defined here before)

# Error kinds shared by parsers, real environments and rehearsed observations.
ERROR_KINDS: tuple[str, ...] = (
    "bad_format",  # the text is not a well-formed tool call / observation
    "unknown_tool",  # the call names a tool the task does not offer
    "bad_arguments",  # the arguments violate the tool's JSON schema
    "tool_error",  # the tool ran and reported a failure (e.g. insufficient funds)
    "tool_exception",  # the tool raised an unexpected exception
    "timeout",  # the tool did not return within its time limit
    "too_large",  # the observation exceeded the size limit
)


def error_obs(kind: str, message: str) -> dict[str, Any]:
    """A structured error observation; ``kind`` must be one of :data:`ERROR_KINDS`."""
    if kind not in ERROR_KINDS:
        raise ValueError(f"unknown error kind {kind!r}; valid: {', '.join(ERROR_KINDS)}")
    return {"error": {"kind": kind, "message": str(message)}}


def states_fact(text: str, fact: Any) -> bool:
    """Whether ``text`` states ``fact`` as a whole value, case-insensitively: not inside a longer number or word
    (``"99.00"`` is not stated by ``"$999.00"``, nor ``"frozen"`` by ``"unfrozen"``). The one rule of the built-in
    environments' and MCP tasks' success checks and of the rewards that check reported facts."""
    f = str(fact).lower()
    if not f:
        return True
    return re.search(rf"(?<![\w.]){re.escape(f)}(?![\w]|[.,]\d)", text.lower()) is not None


def is_error_obs(obs: Any) -> bool:
    return isinstance(obs, dict) and set(obs) == {"error"} and isinstance(obs["error"], dict) and "kind" in obs["error"]


def dumps(obj: Any) -> str:
    """Canonical compact JSON used everywhere an observation or arguments are shown to a model."""
    return json.dumps(obj, ensure_ascii=False, sort_keys=True, separators=(", ", ": "))


@dataclass
class ToolSpec(JSONable):
    """One tool in OpenAI function-calling form: a name, a description and a JSON schema for arguments."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    read_only: bool | None = None
    """Whether calling the tool leaves the world unchanged (MCP's ``readOnlyHint``, tau2's READ tools, the built-ins'
    tools without ``mutates``); None: not known. Never shown to the model (not in :meth:`to_openai`); the test-time
    memory ``agreed-live`` leaves a read's imagined result out (envace.rollout.memory.distill)."""

    def to_dict(self) -> dict[str, Any]:
        """The fields, ``read_only`` only where known (files written before it existed read back the same)."""
        d = fields_to_dict(self)
        if self.read_only is None:
            del d["read_only"]
        return d

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ToolSpec":
        """Also the OpenAI wrapper ``{"type": "function", "function": {...}}``; no parameters: an empty object."""
        if "function" in d:  # OpenAI wrapper
            d = d["function"]
        return cls(
            name=d["name"],
            description=d.get("description", ""),
            parameters=d.get("parameters") or {"type": "object", "properties": {}},
            read_only=d.get("read_only"),
        )


@dataclass
class ToolCall(JSONable):
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def key(self) -> str:
        """Canonical string identifying the call (name + sorted arguments); used for matching and caching."""
        return f"{self.name}({dumps(self.arguments)})"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ToolCall":
        """Arguments that are null or absent are ``{}``."""
        return cls(name=d["name"], arguments=dict(d.get("arguments") or {}))


@dataclass
class Message:
    """A chat message. ``role`` is system / user / assistant / tool. Assistant messages may carry tool calls;
    tool messages carry the observation of one call in ``content`` (JSON text)."""

    role: str
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Message":
        return cls(
            role=d["role"],
            content=d.get("content", ""),
            tool_calls=[ToolCall.from_dict(c) for c in d.get("tool_calls", [])],
        )


@dataclass
class ReferenceExample(JSONable):
    """A recorded real call and the result it returned (grounding for Rehearse; may be served as a cache hit).
    ``source`` is the id of the task whose environment produced it; ``state`` the key of the initial state it
    was made on when it was the first call of a fresh environment ("" otherwise; see ``envace.envs.references``)."""

    call: ToolCall
    result: Any
    source: str = ""
    state: str = ""


@dataclass
class ChecklistItem(JSONable):
    """One item of a task's checklist. ``rule`` is a machine-checkable rule (see ``envace.rewards.functions``), or None
    for items that only an LLM judge can check."""

    description: str
    rule: dict[str, Any] | None = None


@dataclass
class Task(JSONable):
    """A tool-use task.

    ``env`` names the environment factory (see ``envace.envs``) and ``env_config`` is what it needs to build
    the task's real environment (e.g. the initial state). ``user_turns`` are the scripted user messages; the
    next one arrives whenever Act answers with text. ``gold_actions[i]`` are the calls expected after user
    turn i; ``gold_replies[i]`` (optional) a reference text reply closing turn i.

    ``user_tools`` are tools of the *user's* side of the world (tau2 telecom: the customer's phone), which only
    the user simulator may call; ``user_actions[i]`` (optional) are the calls a scripted user makes on its side
    before its message of turn i (a gold user's actions). Both are empty for tasks without a user side.
    """

    id: str
    env: str
    system_prompt: str
    user_turns: list[str]
    tools: list[ToolSpec]
    env_config: dict[str, Any] = field(default_factory=dict)
    references: list[ReferenceExample] = field(default_factory=list)
    gold_actions: list[list[ToolCall]] = field(default_factory=list)
    gold_replies: list[str] = field(default_factory=list)
    checklist: list[ChecklistItem] = field(default_factory=list)
    expected_outputs: list[str] = field(default_factory=list)  # facts the final replies must communicate
    split: str = "train"
    metadata: dict[str, Any] = field(default_factory=dict)
    """Free-form facts about the task (source, kind, ...); ``max_steps``, where set, ends every episode of the task
    after that many Act steps as its protocol (BFCL single-turn: 1), not as a cut (``truncated`` stays None)."""
    user_tools: list[ToolSpec] = field(default_factory=list)
    user_actions: list[list[ToolCall]] = field(default_factory=list)

    @property
    def domain(self) -> str:
        return self.env.split(":", 1)[0]

    def read_only_tools(self) -> frozenset[str]:
        """The names of the task's tools known to change nothing (``ToolSpec.read_only``)."""
        return frozenset(t.name for t in self.tools if t.read_only)

    def tool(self, name: str) -> ToolSpec | None:
        for t in self.tools:
            if t.name == name:
                return t
        return None

    def flat_gold(self) -> list[ToolCall]:
        return [c for turn in self.gold_actions for c in turn]

    def to_dict(self) -> dict[str, Any]:
        """Every field; the user's side (``user_tools``, ``user_actions``) only where the task has one, so a task
        without it keeps the JSON it had before there was one."""
        return fields_to_dict(self, leave_out=tuple(n for n in ("user_tools", "user_actions") if not getattr(self, n)))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Task":
        """A task file may leave out the system prompt, the user turns and the tools (empty)."""
        return fields_from_dict(cls, d, system_prompt="", user_turns=[], tools=[])


@dataclass
class Generation:
    """What a backend returns for one prompt (``envace.backends.base.Backend.generate``): the sampled token ids with
    their log-probs, their text and why generation stopped."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (a stop string), "eos" (end-of-turn token), "length" (max_new_tokens), "abort"
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from a kept KV cache instead of being encoded again


@dataclass
class Row(JSONable):
    """One generation: the unit that training operates on.

    ``prompt_ids`` is everything the model conditioned on, ``completion_ids`` what it generated (including the
    stop / end-of-turn token that closed it), ``old_logprobs`` the sampling log-probs of the completion
    tokens (same length). ``role`` decides which losses see the row.
    """

    role: str
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    task_id: str
    traj_id: str
    group_id: str
    step: int = 0
    truncated: bool = False  # generation hit max_new_tokens without a stop

    @classmethod
    def from_generation(
        cls, role: str, prompt: list[int], g: Generation, task_id: str, traj_id: str, group_id: str, step: int = 0
    ) -> "Row":
        """The row of generation ``g`` (token ids, sampling log-probs, finish reason) from ``prompt``, as ``role``;
        truncated when it stopped at its token budget."""
        return cls(
            role=role,
            prompt_ids=list(prompt),
            completion_ids=list(g.token_ids),
            old_logprobs=list(g.logprobs),
            task_id=task_id,
            traj_id=traj_id,
            group_id=group_id,
            step=step,
            truncated=g.finish_reason == "length",
        )


ObsSource = Literal["rehearsed", "real", "simulator", "cache", "validation"]


@dataclass
class Step(JSONable):
    """One Act generation and what followed it.

    ``calls`` are the parsed tool calls (empty for a text reply or a parse failure); ``observations[i]`` is the
    observation fed back for ``calls[i]`` and ``sources[i]`` where it came from. ``shadow[i]`` holds the real
    observation recorded next to a rehearsed one in shadow mode (never shown to the policy), and
    ``shadow_changed[i]`` the top-level fields of the environment's ``state()`` that this real call changed
    (``[]``: a read; None where no real observation was recorded).
    """

    user_turn: int
    action_text: str
    calls: list[ToolCall] = field(default_factory=list)
    reply: str | None = None  # text reply to the user, if Act answered with text
    parse_error: dict[str, Any] | None = None
    observations: list[Any] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    shadow: list[Any] = field(default_factory=list)
    shadow_changed: list[list[str] | None] = field(default_factory=list)
    rehearse_texts: list[str] = field(default_factory=list)


UserSource = Literal["real", "unexecuted", "validation"]


@dataclass
class UserStep(JSONable):
    """One move of the user simulator on its own side of the conversation, never a training row: a generation
    (``text``, its raw output: a message to the agent, or user-side tool calls) or a scripted user's action
    (``text`` None). ``calls[i]`` ran on the user's side with observation ``observations[i]`` (seen by the user
    only) from ``sources[i]``: ``real`` (the task's environment, shared with the agent's calls), ``unexecuted``
    (no real environment in this rollout mode: recorded, applied when the trajectory is scored) or
    ``validation`` (the call failed the user tools' schema check and never ran). ``turn`` is the user turn it
    belongs to: it happened before that turn's message reached the agent."""

    turn: int
    text: str | None = None
    calls: list[ToolCall] = field(default_factory=list)
    observations: list[Any] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    parse_error: dict[str, Any] | None = None

    def executed_calls(self) -> list[ToolCall]:
        """The calls that ran, or would have run in a real environment (every source but ``validation``)."""
        return [c for c, s in zip(self.calls, self.sources) if s != "validation"]


@dataclass
class Trajectory(JSONable):
    """A finished (or truncated) episode of one task: the Act chat, the steps, the rows and the outcome. (The field
    order is the order of a saved trajectory's keys: the outcome first, the chat, steps and rows last.)"""

    id: str
    task_id: str
    group_id: str
    mode: str
    reward: float | None = None  # None = unscored (e.g. a judge failure): masked out of the update
    reward_info: dict[str, Any] = field(default_factory=dict)
    truncated: str | None = (
        None  # None, or why the episode was cut ("max_steps", "max_steps_per_turn", "context:act", "context:rehearse")
    )
    counters: dict[str, int] = field(default_factory=dict)
    env_outcome: dict[str, Any] | None = None
    """The real environment's own success check, applied by the rollout when it ended to the environment this
    trajectory's calls ran in (real mode, or the shadow copy): ``{"success", "reward", "details", "n_calls"}``
    or ``{"error"}`` (envace.envs.final_outcome). None when no real environment ran them (rehearsed)."""
    tools: list[ToolSpec] | None = None
    """The tools Act was given where its system message does not list them (the chat template rendered them,
    ``RolloutConfig.native_tools``); None: the system message's ``# Tools`` block lists them."""
    messages: list[Message] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    user_steps: list[UserStep] = field(default_factory=list)
    """What the user simulator did on its side (generations, user-side tool calls), in order (UserStep)."""
    rows: list[Row] = field(default_factory=list)

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def calls(self) -> list[ToolCall]:
        return [c for s in self.steps for c in s.calls]

    def replies(self) -> list[str]:
        return [s.reply for s in self.steps if s.reply is not None]

    def to_dict(self, with_rows: bool = True) -> dict[str, Any]:
        """``with_rows=False``: ``rows`` is ``[]`` (the logs: rows are token ids, for training only). ``tools`` only
        where the trajectory keeps them (a line from before it existed reads the same)."""
        skip = () if self.tools is not None else ("tools",)
        if with_rows:
            return fields_to_dict(self, leave_out=skip)
        return fields_to_dict(self, leave_out=("rows", *skip)) | {"rows": []}


def write_jsonl(path: str, items: list[Any], fsync: bool = True) -> None:
    """Append items (dataclasses with ``to_dict`` or plain dicts) as JSON lines, fsync'd."""
    import os

    with open(path, "a", encoding="utf-8") as f:
        for it in items:
            d = it.to_dict() if hasattr(it, "to_dict") else it
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """The JSON value of every non-blank line; a path ending in ``.gz`` is read through gzip (records and rollouts
    are committed gzipped)."""
    import gzip

    out = []
    with gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out
