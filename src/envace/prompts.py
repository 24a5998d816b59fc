"""What each role sees, rendered to token ids.

Contexts are built by *appending* token segments, never by re-templating a whole chat: the completion a
model generated stays in its context exactly as sampled (no re-tokenisation), and consecutive turns of one
context share their prefix token for token, so a backend can keep that prefix's KV cache.

Act sees the usual agent chat (system prompt with tool schemas, user turns, its own calls, tool results).
Rehearse sees its own context (METHOD.md section 1): a simulator system prompt, the candidate tool schemas,
optional reference call -> result examples, then per call a user message holding the conversation since the
previous call (serialized) and the current call (name, schema, arguments); its reply is the observation.
Departure from the reference code, for prefix reuse: the Rehearse context of a trajectory is one growing chat
(earlier calls and the observations it produced stay as earlier turns) instead of a fresh prompt per call.
The information is the same: the whole conversation so far and the current call.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .types import Message, ReferenceExample, Task, ToolCall, ToolSpec, dumps

ACT_INSTRUCTIONS = (
    "You can call tools. To call one, answer with <tool_call>{\"name\": NAME, \"arguments\": {...}}</tool_call> "
    "(several blocks for several calls) and nothing else. Tool results come back as tool messages. "
    "When you have what the user asked for, answer the user in plain text."
)

REHEARSE_SYSTEM = (
    "You are a precise tool simulator. You are given tool schemas, reference examples of real calls, the "
    "conversation so far and one tool call. First validate the call: the tool must exist and the arguments "
    "must fit its schema; if not, return {\"error\": {\"kind\": \"unknown_tool\" or \"bad_arguments\", "
    "\"message\": ...}}. Otherwise return exactly what the real tool would return, consistent with the "
    "conversation and the examples (a failure the tool would report is {\"error\": {\"kind\": \"tool_error\", "
    "\"message\": ...}}). Answer with <observation>{json}</observation> and nothing else."
)


def render_tools(tools: list[ToolSpec]) -> str:
    return "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters}, ensure_ascii=False) for t in tools)


def act_system(task: Task, memory: str | None = None) -> str:
    parts = [task.system_prompt.strip(), "# Tools\n" + render_tools(task.tools), ACT_INSTRUCTIONS]
    if memory:
        parts.append("# Notes from private rehearsal\n" + memory.strip())
    return "\n\n".join(p for p in parts if p)


def rehearse_system(task: Task, references: list[ReferenceExample] | None = None) -> str:
    refs = task.references if references is None else references
    parts = [REHEARSE_SYSTEM, "# Tools\n" + render_tools(task.tools)]
    if refs:
        parts.append("# Reference examples\n" + "\n".join(f"{r.call.key()} -> {dumps(r.result)}" for r in refs))
    return "\n\n".join(parts)


def serialize_messages(messages: list[Message]) -> str:
    """A compact transcript of (part of) the Act chat for the Rehearse context."""
    lines = []
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "assistant" and m.tool_calls:
            lines.append("[assistant] " + " ".join(c.key() for c in m.tool_calls))
        elif m.role == "tool":
            lines.append(f"[tool] {m.content}")
        else:
            lines.append(f"[{m.role}] {m.content.strip()}")
    return "\n".join(lines)


def rehearse_user_message(transcript: list[str], call: ToolCall, spec: ToolSpec | None) -> str:
    """The Rehearse user message: the conversation lines since the previous rehearsed call, then the call."""
    conv = "\n".join(transcript) or "(nothing new)"
    schema = json.dumps(spec.parameters, ensure_ascii=False) if spec else "(no such tool)"
    return f"Conversation since the last call:\n{conv}\n\nCurrent call:\nname: {call.name}\nschema: {schema}\narguments: {dumps(call.arguments)}"


@dataclass
class ChatFormat:
    """ChatML-style rendering into token segments (SmolLM2 and Qwen use ChatML)."""

    tokenizer: Any
    start: str = "<|im_start|>"
    end: str = "<|im_end|>"

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> "ChatFormat":
        vocab = tokenizer.get_vocab()
        if "<|im_start|>" not in vocab or "<|im_end|>" not in vocab:
            raise ValueError("only ChatML tokenizers (<|im_start|>/<|im_end|>) are supported by ChatFormat")
        return cls(tokenizer)

    @property
    def end_id(self) -> int:
        return self.tokenizer.convert_tokens_to_ids(self.end)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def __post_init__(self) -> None:
        added = getattr(self.tokenizer, "added_tokens_encoder", None) or {}
        self._specials = tuple(sorted(set(added) | set(getattr(self.tokenizer, "all_special_tokens", []))))

    def message(self, role: str, content: str) -> list[int]:
        """One message. Content is data: a special-token string inside it (``<|im_start|>system`` in a tool
        result or in the arguments of a call) is encoded as plain text, never as a control token."""
        if any(sp in content for sp in self._specials):
            text_ids = self.tokenizer.encode(content, add_special_tokens=False, split_special_tokens=True)
            return self.encode(f"{self.start}{role}\n") + text_ids + self.encode(f"{self.end}\n")
        return self.encode(f"{self.start}{role}\n{content}{self.end}\n")

    def generation_prompt(self, role: str = "assistant") -> list[int]:
        return self.encode(f"{self.start}{role}\n")

    def close_completion(self, completion_ids: list[int]) -> list[int]:
        """Tokens that close an assistant turn after a completion (the end tag unless generated, a newline)."""
        tail = [] if completion_ids and completion_ids[-1] == self.end_id else [self.end_id]
        return tail + self.encode("\n")

    def render(self, messages: list[dict[str, str]] | list[Message], add_generation_prompt: bool = True) -> list[int]:
        ids: list[int] = []
        for m in messages:
            role, content = (m.role, m.content) if isinstance(m, Message) else (m["role"], m["content"])
            ids += self.message(role, content)
        if add_generation_prompt:
            ids += self.generation_prompt()
        return ids


def tool_message_content(obs: Any) -> str:
    return json.dumps(obs, ensure_ascii=False)
