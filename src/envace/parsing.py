"""Parsing of model output. Nothing here raises on model text: every failure is a structured error.

Act emits one or several ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, or plain text
(a reply to the user). Rehearse emits ``<observation>{json}</observation>`` where the JSON is the tool's
result or a structured error object (see :func:`envace.types.error_obs`).

Model text is data: it is parsed with ``json.loads`` only and never evaluated.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from .types import ToolCall, ToolSpec, error_obs

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
OBS_RE = re.compile(r"<observation>(.*?)</observation>", re.DOTALL)
MAX_TEXT = 200_000  # longer model outputs are rejected as bad_format before any parsing
MAX_DEPTH = 64  # deeper JSON is rejected (guards recursion in validators)


@dataclass
class ActParse:
    """Result of parsing one Act output: tool calls, or a text reply, or an error (bad_format)."""

    calls: list[ToolCall] = field(default_factory=list)
    reply: str | None = None
    error: dict[str, Any] | None = None


def _depth(x: Any, limit: int = MAX_DEPTH) -> int:
    # iterative to avoid recursion on adversarial nesting
    stack = [(x, 1)]
    deepest = 0
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(node, dict):
            stack.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, d + 1) for v in node)
    return deepest


def _bad_text(x: Any) -> bool:
    """Whether a (shallow enough) JSON value holds a string that is not valid Unicode: a lone surrogate from a
    ``\\ud800`` escape cannot be written as UTF-8 or tokenized, so it must not get into a context or a log."""
    stack = [x]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"number {text[:40]} is out of range")
    return x


def _loads(text: str) -> tuple[Any, str | None]:
    """Strict JSON: no NaN / Infinity, no number that overflows a float, no invalid Unicode, bounded depth."""
    try:
        val = json.loads(text, parse_constant=_not_json, parse_float=_finite)
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError; huge ints raise ValueError
        return None, f"invalid JSON: {str(e)[:200]}"
    if _depth(val) > MAX_DEPTH:
        return None, f"JSON nested deeper than {MAX_DEPTH}"
    if _bad_text(val):
        return None, "invalid JSON: a string holds a lone surrogate (not valid Unicode)"
    return val, None


def parse_act(text: str) -> ActParse:
    """Parse an Act completion. Text without any ``<tool_call>`` tag is a reply; a tag with a body that is not a
    JSON object with a string ``name`` and an object ``arguments`` is a bad_format error (no call is run)."""
    if not isinstance(text, str):
        return ActParse(error=error_obs("bad_format", "output is not text"))
    if len(text) > MAX_TEXT:
        return ActParse(error=error_obs("bad_format", f"output longer than {MAX_TEXT} characters"))
    if _bad_text(text):
        return ActParse(error=error_obs("bad_format", "output is not valid Unicode (a lone surrogate)"))
    bodies = TOOL_CALL_RE.findall(text)
    if not bodies:
        if "<tool_call>" in text:
            return ActParse(error=error_obs("bad_format", "unterminated <tool_call> block"))
        reply = text.strip()
        return ActParse(reply=reply)
    calls: list[ToolCall] = []
    for body in bodies:
        val, err = _loads(body.strip())
        if err:
            return ActParse(error=error_obs("bad_format", f"tool call is not valid JSON ({err})"))
        if not isinstance(val, dict):
            return ActParse(error=error_obs("bad_format", "tool call must be a JSON object"))
        name, args = val.get("name"), val.get("arguments", {})
        if isinstance(args, str):  # some models emit arguments as a JSON string
            args, err = _loads(args)
            if err:
                return ActParse(error=error_obs("bad_format", f"arguments string is not valid JSON ({err})"))
        if not isinstance(name, str) or not name:
            return ActParse(error=error_obs("bad_format", "tool call needs a non-empty string 'name'"))
        if not isinstance(args, dict):
            return ActParse(error=error_obs("bad_format", "'arguments' must be a JSON object"))
        calls.append(ToolCall(name=name, arguments=args))
    return ActParse(calls=calls)


def validate_call(call: ToolCall, tools: list[ToolSpec]) -> dict[str, Any] | None:
    """Check that the tool exists and the arguments fit its schema; return an error observation or None."""
    spec = next((t for t in tools if t.name == call.name), None)
    if spec is None:
        names = ", ".join(t.name for t in tools)
        return error_obs("unknown_tool", f"no tool named {call.name[:100]!r}; available: {names}")
    try:
        validator = jsonschema.Draft202012Validator(spec.parameters or {"type": "object"})
        errors = sorted(validator.iter_errors(call.arguments), key=lambda e: list(e.path))
    except (jsonschema.exceptions.SchemaError, RecursionError, ValueError, TypeError) as e:
        return error_obs("bad_arguments", f"arguments could not be validated: {str(e)[:200]}")
    if errors:
        e = errors[0]
        where = ".".join(str(p) for p in e.path) or "arguments"
        return error_obs("bad_arguments", f"{where}: {e.message[:300]}")
    return None


def parse_observation(text: str) -> tuple[Any, dict[str, Any] | None]:
    """Parse a Rehearse completion into (observation, error). On failure the observation is the error itself,
    so the rollout can feed it back and go on; the error is returned separately to be counted."""
    if not isinstance(text, str) or len(text) > MAX_TEXT or _bad_text(text):
        err = error_obs("bad_format", "rehearsed observation is not text, not valid Unicode, or too long")
        return err, err
    m = OBS_RE.search(text)
    body = m.group(1) if m else None
    if body is None:
        # tolerate a missing closing tag when the generation was stopped on it
        if "<observation>" in text:
            body = text.split("<observation>", 1)[1]
        else:
            err = error_obs("bad_format", "rehearsed output has no <observation> block")
            return err, err
    val, e = _loads(body.strip())
    if e:
        err = error_obs("bad_format", f"rehearsed observation is not valid JSON ({e})")
        return err, err
    return val, None


def format_observation(obs: Any) -> str:
    """The Rehearse output format for an observation (used for SFT targets and cache hits)."""
    return "<observation>" + json.dumps(obs, ensure_ascii=False) + "</observation>"
