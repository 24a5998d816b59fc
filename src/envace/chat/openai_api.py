"""OpenAI chat requests as envace's Act chat, and Act output as OpenAI replies (``envace serve``): pure functions.

In (:func:`act_messages`): OpenAI ``messages`` + ``tools`` become the :class:`~envace.core.types.Message` list that Act
would see for the same conversation, so a policy trained by envace is served the very context it was trained on:

- the tools go into the system message exactly as :func:`envace.chat.prompts.act_system` renders a task's (the client's
  first system message is the task's system prompt; none: an empty one): its ``# Tools`` block, one JSON schema a
  line, then :data:`~envace.chat.prompts.ACT_INSTRUCTIONS`; where the chat template renders the tools itself
  (``tool_list=False``, as Act's are with ``RolloutConfig.native_tools``) the ``# Tools`` block is left out and the
  server renders the system message with ``tools=`` (:meth:`envace.chat.prompts.ChatFormat.render`). Without tools the
  messages are taken as they are;
- an assistant message's ``tool_calls`` become the text the model's tool format writes for them (hermes:
  ``<tool_call>`` blocks, one a line; :data:`envace.chat.parsing.TOOL_FORMATS`, chosen as the rollout chooses it) after
  its text, as Act emits them; a ``tool`` message's content is the observation text, as Act is fed it. Its
  ``tool_call_id`` must answer a call of the assistant message before it (OpenAI's rule);
- ``developer`` messages are system messages; content is a string or a list of text parts.

Out (:func:`reply`): the completion is parsed by the same tool format; it is a tool-call reply only if every call
parses and names one of the request's tools. Model output is untrusted: anything else (a malformed
block, an unterminated one, an unknown tool) is returned as plain content, never as a call. Arguments are not
checked against the schemas (as OpenAI without ``strict``). A call reply's content is the text before the first
call opener (``ToolFormat.openers``: ``<tool_call>`` for hermes; trailing whitespace dropped; None if empty): text after
the blocks is dropped, as Act's instructions allow none.

Every problem with a request is a :class:`RequestError` naming the offending field (``messages[2].tool_call_id``).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Collection

from .parsing import TOOL_FORMATS, ToolFormat
from .prompts import act_system
from ..core.types import Message, Task, ToolCall, ToolSpec

HERMES = TOOL_FORMATS.get("hermes")
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MESSAGE_KEYS = {"role", "content", "tool_calls", "tool_call_id"}
EMPTY_ONLY_KEYS = {"name", "refusal", "annotations", "audio", "function_call", "reasoning_content"}
"""Message keys OpenAI clients send back with a reply message: accepted when empty (null, "", []), else refused."""
NAMED_ROLES = {"system", "developer", "user", "assistant"}
"""Roles whose messages may carry a participant ``name`` (multi-agent frameworks send it; OpenAI accepts it there)."""
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")


class RequestError(Exception):
    """A request the server refuses: an HTTP ``status`` answer with ``message`` naming ``param``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind


def text_content(content: Any, where: str, nullable: bool = False) -> str:
    """A message's content as text: a string, or a list of ``{"type": "text", "text": ...}`` parts (joined)."""
    if content is None and nullable:
        return ""
    if isinstance(content, list):
        if not all(isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str) for c in content):
            raise RequestError(f'{where} parts must be text parts ({{"type": "text", "text": ...}})', where)
        return "".join(c["text"] for c in content)
    if not isinstance(content, str):
        raise RequestError(f"{where} must be a string or a list of text parts", where)
    return content


def tool_specs(tools: Any) -> list[ToolSpec]:
    """The request's ``tools`` (OpenAI function tools) as envace tool specs; None: no tools."""
    if tools is None:
        return []
    if not isinstance(tools, list) or not tools:
        raise RequestError("'tools' must be a non-empty list of function tools", "tools")
    specs: list[ToolSpec] = []
    for j, t in enumerate(tools):
        where = f"tools[{j}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise RequestError(
                f'{where} must be {{"type": "function", "function": {{"name", "description", "parameters"}}}}', where
            )
        f = t["function"]
        extra = [f"{where}.{k}" for k in sorted(set(t) - {"type", "function"})] + [
            f"{where}.function.{k}" for k in sorted(set(f) - {"name", "description", "parameters", "strict"})
        ]
        if extra:
            raise RequestError(f"{extra[0]} is not supported", extra[0])
        name, desc, params = f.get("name"), f.get("description"), f.get("parameters")
        if not isinstance(name, str) or not name:
            raise RequestError(f"{where}.function.name must be a non-empty string", f"{where}.function.name")
        if any(s.name == name for s in specs):
            raise RequestError(f"{where}.function.name {name!r} names a tool twice", f"{where}.function.name")
        if desc is not None and not isinstance(desc, str):
            raise RequestError(f"{where}.function.description must be a string", f"{where}.function.description")
        if params is not None and not isinstance(params, dict):
            raise RequestError(
                f"{where}.function.parameters must be a JSON schema object", f"{where}.function.parameters"
            )
        if f.get("strict"):
            raise RequestError(
                f"{where}.function.strict: strict function calling is not "
                "supported (the model's calls are not constrained to the schema)",
                f"{where}.function.strict",
            )
        specs.append(ToolSpec.from_dict({"name": name, "description": desc or "", "parameters": params}))
    return specs


def parses_calls(tool_choice: Any, tools: list[ToolSpec]) -> bool:
    """Whether replies are parsed for tool calls: ``auto`` (the default) with tools; ``none`` never (the tools are
    still shown, as vLLM does by default). ``required`` and a named function cannot be honoured (the model's output
    is not constrained) and are refused."""
    if tool_choice is None or tool_choice == "auto":
        return bool(tools)
    if tool_choice == "none":
        return False
    if tool_choice == "required" or isinstance(tool_choice, dict):
        raise RequestError(
            f"tool_choice {json.dumps(tool_choice)} cannot be honoured: this server does not constrain the model to "
            'call a tool; use "auto" or "none"',
            "tool_choice",
        )
    raise RequestError(f'tool_choice must be "auto" or "none", got {tool_choice!r}', "tool_choice")


def _calls(value: Any, where: str) -> list[tuple[str, ToolCall]]:
    """An assistant message's ``tool_calls`` as (id, call) pairs."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    out = []
    for j, c in enumerate(value):
        w = f"{where}.tool_calls[{j}]"
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or c.get("type", "function") != "function" or not isinstance(c.get("id"), str):
            raise RequestError(f'{w} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}', w)
        if not isinstance(f.get("name"), str) or not f["name"]:
            raise RequestError(f"{w}.function.name must be a non-empty string", f"{w}.function.name")
        try:
            args = json.loads(f.get("arguments") or "{}") if isinstance(f.get("arguments", ""), str) else None
        except ValueError:
            args = None
        if not isinstance(args, dict):
            raise RequestError(f"{w}.function.arguments must be a JSON object in a string", f"{w}.function.arguments")
        out.append((c["id"], ToolCall(f["name"], args)))
    return out


def _check_name(m: dict, where: str) -> None:
    """A participant ``name`` (as OpenAI: letters, digits, ``_`` and ``-``, 1-64 of them) on the roles that take one.
    It is accepted and not shown to the model: envace's chats, like most chat templates, have no place for it."""
    name = m.get("name")
    if (
        m["role"] in NAMED_ROLES
        and name not in (None, "")
        and not (isinstance(name, str) and NAME_PATTERN.fullmatch(name))
    ):
        raise RequestError(
            f"{where}.name must be 1-64 letters, digits, underscores or hyphens (got {name!r})", f"{where}.name"
        )


def act_messages(
    messages: Any, tools: list[ToolSpec], fmt: ToolFormat = HERMES, tool_list: bool = True
) -> list[Message]:
    """OpenAI chat ``messages`` (and the request's tools) as the Act chat of a model whose tool format is ``fmt``
    (module docstring); ``tool_list``: the system message lists the tools as envace's text (False: the chat
    template renders them)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list", "messages")
    out: list[Message] = []
    pending: list[str] = []  # ids of the previous assistant message's calls not answered yet
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(f"{where} must be an object with role {', '.join(ROLES)}", f"{where}.role")
        role = ROLES[m["role"]]
        _check_name(m, where)
        for k, v in m.items():
            if k == "name" and m["role"] in NAMED_ROLES:
                continue
            allowed = (
                k in MESSAGE_KEYS
                and (k != "tool_calls" or role == "assistant")
                and (k != "tool_call_id" or role == "tool")
            )
            if not allowed and not (k in EMPTY_ONLY_KEYS and v in (None, "", [])):
                raise RequestError(f"{where}.{k} is not supported on a {m['role']} message", f"{where}.{k}")
        calls = _calls(m.get("tool_calls"), where) if role == "assistant" else []
        content = text_content(m.get("content"), f"{where}.content", nullable=role == "assistant")
        if role == "assistant":
            out.append(
                Message(
                    "assistant",
                    "\n".join(([content] if content else []) + ([fmt.render([c for _, c in calls])] if calls else [])),
                    tool_calls=[c for _, c in calls],
                )
            )
            pending = [cid for cid, _ in calls]
        elif role == "tool":
            cid = m.get("tool_call_id")
            if not isinstance(cid, str) or cid not in pending:
                raise RequestError(
                    f"{where}.tool_call_id {cid!r} answers no unanswered tool call of the assistant message before it",
                    f"{where}.tool_call_id",
                )
            pending.remove(cid)
            out.append(Message("tool", content))
        else:
            out.append(Message(role, content))
            pending = []
    if tools:
        system, rest = (out[0].content, out[1:]) if out[0].role == "system" else ("", out)
        out = [
            Message(
                "system",
                act_system(
                    Task(id="serve", env="", system_prompt=system, user_turns=[], tools=tools),
                    tools=fmt,
                    tool_list=tool_list,
                ),
            )
        ] + rest
    return out


def reply(text: str, tool_names: Collection[str] | None, fmt: ToolFormat = HERMES) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a completion: calls only where ``tool_names`` is given and the text is a well-formed
    call reply in tool format ``fmt`` naming only those tools (module docstring); otherwise the text itself and
    no calls."""
    at = [text.index(o) for o in fmt.openers if o in text]
    if not tool_names or not at:
        return text, []
    parsed = fmt.parse(text)
    if not parsed.calls or any(c.name not in tool_names for c in parsed.calls):
        return text, []
    return text[: min(at)].rstrip() or None, parsed.calls


def openai_tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Calls as an OpenAI message's ``tool_calls`` (fresh ids, arguments as JSON text)."""
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for c in calls
    ]
