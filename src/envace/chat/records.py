"""How a trajectory's chat is written as a record for other tools (envace.evaluation.export, ``envace export``): who
reads it (:data:`TARGETS`: ``hf`` chat templates and TRL, or ``openai`` fine-tuning), how an assistant message's
content is written (:data:`CONTENT`) and what the system message keeps (:data:`SYSTEM`). Registries of names, so a
config (``envace.config.ExportConfig``) can check its settings against them without importing the exporter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from .parsing import TOOL_CALL_RE, TOOL_FORMATS
from .prompts import ACT_INSTRUCTIONS
from ..core.registry import Registry
from ..core.types import Message, Step

TOOLS_HEADER = "# Tools\n"  # envace.chat.prompts.act_system: the tools block, one JSON object per line


@dataclass(frozen=True)
class Target:
    """What one consumer of the records expects where the OpenAI format and Hugging Face chat templates differ."""

    arguments: Callable[[dict[str, Any]], Any]
    """A call's ``function.arguments`` from its arguments: JSON text (OpenAI) or the object itself (templates)."""
    empty_content: str | None
    """The content of an assistant message that only calls tools: ``None`` (OpenAI's null) or ``""``."""


# who reads the records (module docstring)
TARGETS: Registry[Target] = Registry("export target")
TARGETS.add("openai", Target(arguments=lambda args: json.dumps(args, ensure_ascii=False), empty_content=None))
TARGETS.add("hf", Target(arguments=lambda args: dict(args), empty_content=""))
DEFAULT_TARGET = "hf"

# how an assistant message's content is written: fn(the message as envace stored it, its step) -> content
CONTENT: Registry[Callable[[Message, Step], str | None]] = Registry("export content style")
CONTENT.add("text", lambda m, step: (TOOL_CALL_RE.sub("", m.content).strip() or None) if step.calls else m.content)
CONTENT.add("raw", lambda m, step: m.content)

# how the system message is written: fn(system text as the policy saw it) -> text
SYSTEM: Registry[Callable[[str], str]] = Registry("export system style")
SYSTEM.add("seen", lambda text: text)


@SYSTEM.register("task")
def task_system(text: str) -> str:
    """The system message without envace's tool list (if it has one: a native-tools system message has none) and
    calling instructions (the task's prompt and any rehearsal memory stay)."""
    how = {ACT_INSTRUCTIONS} | {TOOL_FORMATS.get(n).instructions for n in TOOL_FORMATS}  # any tool format's
    parts = [p for p in text.split("\n\n") if not p.startswith(TOOLS_HEADER) and p.strip() not in how]
    return "\n\n".join(parts)


__all__ = ["TOOLS_HEADER", "Target", "TARGETS", "DEFAULT_TARGET", "CONTENT", "SYSTEM", "task_system"]
