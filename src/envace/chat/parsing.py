"""Parsing of model output. Nothing here raises on model text: every failure is a structured error.

Act emits tool calls in its model family's format (:data:`TOOL_FORMATS`, chosen by :func:`tool_format_for`):
``hermes``, one or several ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (ChatML models:
SmolLM2, Qwen); ``llama3_json``, a reply that is a JSON object ``{"name": ..., "parameters": {...}}``, optionally
after ``<|python_tag|>`` (Llama 3.1+); ``mistral``, ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``;
or plain text (a reply to the user). Reasoning (``<think>...</think>``) is stripped before any of them parses. Rehearse
emits ``<observation>{json}</observation>`` where the JSON is the tool's result or a structured error object (see
:func:`envace.core.types.error_obs`).

Model text is data: it is parsed with ``json.loads`` only and never evaluated.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import jsonschema

from ..core.registry import Registry
from ..core.types import ToolCall, ToolSpec, error_obs

# The protocol strings, written once: hermes calls, and Rehearse's answer (the observation it imagines).
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
OBS_OPEN, OBS_CLOSE = "<observation>", "</observation>"
TOOL_CALL_RE = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)
OBS_RE = re.compile(re.escape(OBS_OPEN) + r"(.*?)" + re.escape(OBS_CLOSE), re.DOTALL)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)
PYTHON_TAG = "<|python_tag|>"  # Llama 3.1: opens a tool call (built-in tools; custom tools may omit it)
TOOL_CALLS_TAG = "[TOOL_CALLS]"  # Mistral: opens the list of calls
MAX_TEXT = 200_000  # longer model outputs are rejected as bad_format before any parsing
MAX_DEPTH = 64  # deeper JSON is rejected (guards recursion in validators)


@dataclass
class ActParse:
    """Result of parsing one Act output: tool calls, or a text reply, or an error (bad_format)."""

    calls: list[ToolCall] = field(default_factory=list)
    reply: str | None = None
    error: dict[str, Any] | None = None
    thinking: str | None = None
    """The ``<think>`` text removed before parsing (never parsed as a call, never shown to a user)."""


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


def _guard(text: Any) -> dict[str, Any] | None:
    """The bad_format error of an output that is not text, too long, or not valid Unicode; None if it is fine."""
    if not isinstance(text, str):
        return error_obs("bad_format", "output is not text")
    if len(text) > MAX_TEXT:
        return error_obs("bad_format", f"output longer than {MAX_TEXT} characters")
    if _bad_text(text):
        return error_obs("bad_format", "output is not valid Unicode (a lone surrogate)")
    return None


def strip_thinking(text: str) -> tuple[str, str | None, str | None]:
    """``(answer, thinking, error)``: ``text`` without its reasoning. Every ``<think>...</think>`` block goes; so
    does everything up to a ``</think>`` left without its opening tag (a generation prompt that opened the block,
    as some templates' do). An opening ``<think>`` left unclosed is an error (the model never answered); the
    answer is then the text before it.
    ``thinking`` is the removed text (None when there was none)."""
    removed = THINK_RE.findall(text)
    answer = THINK_RE.sub("", text)
    if THINK_CLOSE in answer:
        head, answer = answer.rsplit(THINK_CLOSE, 1)
        removed.append(head + THINK_CLOSE)
    if THINK_OPEN in answer:
        answer, rest = answer.split(THINK_OPEN, 1)
        removed.append(THINK_OPEN + rest)
        return answer, "".join(removed), "unterminated <think> block (no answer after the thinking)"
    return answer, "".join(removed) or None, None


def _bad(message: str, thinking: str | None = None) -> ActParse:
    return ActParse(error=error_obs("bad_format", message), thinking=thinking)


def _call_of(val: Any, arg_keys: tuple[str, ...]) -> ToolCall | str:
    """One call from a decoded JSON value (``name`` and the first of ``arg_keys`` present), or why it is not one."""
    if not isinstance(val, dict):
        return "tool call must be a JSON object"
    name = val.get("name")
    key = next((k for k in arg_keys if k in val), arg_keys[0])
    args = val.get(key, {})
    if isinstance(args, str):  # some models emit arguments as a JSON string
        args, err = _loads(args)
        if err:
            return f"arguments string is not valid JSON ({err})"
    if not isinstance(name, str) or not name:
        return "tool call needs a non-empty string 'name'"
    if not isinstance(args, dict):
        return f"'{key}' must be a JSON object"
    return ToolCall(name=name, arguments=args)


_STRICT = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)


def _json_values(text: str, sep: str | None = None) -> tuple[list[Any], str, str | None]:
    """``(values, rest, error)``: the JSON values at the start of ``text`` (one, or several separated by ``sep``),
    strict as :func:`_loads`, and the text after them."""
    vals, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        try:
            val, i = _STRICT.raw_decode(text, i)
        except (ValueError, RecursionError) as e:
            return vals, text[i:], f"invalid JSON: {str(e)[:200]}"
        if _depth(val) > MAX_DEPTH:
            return vals, text[i:], f"JSON nested deeper than {MAX_DEPTH}"
        if _bad_text(val):
            return vals, text[i:], "invalid JSON: a string holds a lone surrogate (not valid Unicode)"
        vals.append(val)
        rest = text[i:].lstrip()
        if sep is None or not rest.startswith(sep):
            return vals, rest, None
        i = len(text) - len(rest) + len(sep)


def _calls_of(vals: list[Any], arg_keys: tuple[str, ...], thinking: str | None) -> ActParse:
    calls = []
    for val in vals:
        call = _call_of(val, arg_keys)
        if isinstance(call, str):
            return _bad(call, thinking)
        calls.append(call)
    return ActParse(calls=calls, thinking=thinking)


def _names_a_call(vals: list[Any]) -> bool:
    return any(isinstance(v, dict) and "name" in v for v in vals)


def _hermes_parse(text: str, thinking: str | None) -> ActParse:
    bodies = TOOL_CALL_RE.findall(text)
    if not bodies:
        if CALL_OPEN in text:
            return _bad(f"unterminated {CALL_OPEN} block", thinking)
        return ActParse(reply=text.strip(), thinking=thinking)
    calls: list[ToolCall] = []
    for body in bodies:
        val, err = _loads(body.strip())
        if err:
            return _bad(f"tool call is not valid JSON ({err})", thinking)
        call = _call_of(val, ("arguments",))
        if isinstance(call, str):
            return _bad(call, thinking)
        calls.append(call)
    return ActParse(calls=calls, thinking=thinking)


def _hermes_render(calls: list[ToolCall]) -> str:
    return "".join(
        CALL_OPEN + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False) + CALL_CLOSE
        for c in calls
    )


def _llama3_parse(text: str, thinking: str | None) -> ActParse:
    s = text.strip()
    tagged = s.startswith(PYTHON_TAG)  # (a backend that decodes without special tokens has dropped it)
    body = s[len(PYTHON_TAG) :].strip() if tagged else s
    if not tagged and not body.startswith("{"):
        return ActParse(reply=s, thinking=thinking)
    vals, rest, err = _json_values(body, sep=";")
    if err:
        return _bad(f"tool call is not valid JSON ({err})", thinking)
    if not tagged and not _names_a_call(vals):
        return ActParse(reply=s, thinking=thinking)  # a JSON reply, not a call
    if rest:
        return _bad(f"text after the tool call JSON: {rest[:80]!r}", thinking)
    return _calls_of(vals, ("parameters", "arguments"), thinking)


def _llama3_render(calls: list[ToolCall]) -> str:
    return "; ".join(json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False) for c in calls)


def _mistral_parse(text: str, thinking: str | None) -> ActParse:
    s = text.strip()
    tagged = TOOL_CALLS_TAG in s  # (a backend that decodes without special tokens has dropped it)
    body = s.split(TOOL_CALLS_TAG, 1)[1].strip() if tagged else s
    if not tagged and not (body.startswith("[") and body[1:].lstrip().startswith("{")):
        return ActParse(reply=s, thinking=thinking)
    vals, rest, err = _json_values(body)
    if err:
        return _bad(f"tool calls are not valid JSON ({err})", thinking)
    items = vals[0] if isinstance(vals[0], list) else vals
    if not tagged and not _names_a_call(items):
        return ActParse(reply=s, thinking=thinking)  # a JSON reply, not a call
    if rest:
        return _bad(f"text after the tool calls JSON: {rest[:80]!r}", thinking)
    if not items:
        return _bad(f"{TOOL_CALLS_TAG} holds no call", thinking)
    return _calls_of(items, ("arguments", "parameters"), thinking)


def _mistral_render(calls: list[ToolCall]) -> str:
    return (
        TOOL_CALLS_TAG
        + " "
        + json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls], ensure_ascii=False)
    )


def _instructions(how: str) -> str:
    return (
        f"You can call tools. To call one, answer with {how} and nothing else. Tool results come back as tool "
        "messages. When you have what the user asked for, answer the user in plain text."
    )


@dataclass(frozen=True)
class ToolFormat:
    """How a model writes tool calls: its family's own syntax (Act's, and a tool-using LLM user's).

    ``parse(text)`` never raises on model text: thinking is stripped first (:func:`strip_thinking`), then the
    answer is calls, a reply, or a bad_format error (no call is run). ``render(calls)`` is the text a model of
    the family writes for those calls (SFT targets); ``instructions`` is the sentence of Act's system prompt
    that describes it (:func:`envace.chat.prompts.act_system`), made of ``call`` and ``several``."""

    name: str
    call: str
    """How one call is written, as a prompt says it (hermes: ``<tool_call>{"name": NAME, "arguments":
    {...}}</tool_call>``)."""
    several: str
    """How several calls are written (Act's instructions add it in parentheses after ``call``)."""
    parse_answer: Callable[[str, str | None], ActParse]
    """(the completion without its thinking, the thinking) -> the parse."""
    render_calls: Callable[[list[ToolCall]], str]
    hints: tuple[str, ...] = ()
    """Strings that, in a tokenizer's chat template or added tokens, say a model writes calls this way."""
    openers: tuple[str, ...] = ()
    """Strings a call reply starts with (llama3_json: a bare JSON object, as the HF backend decodes without special
    tokens); a server streaming text holds it back from the first of them (envace.serving.serve.streamable)."""

    @property
    def instructions(self) -> str:
        return _instructions(f"{self.call} ({self.several})")

    def parse(self, text: str) -> ActParse:
        err = _guard(text)
        if err is not None:
            return ActParse(error=err)
        answer, thinking, bad = strip_thinking(text)
        if bad:
            return _bad(bad, thinking)
        return self.parse_answer(answer, thinking)

    def render(self, calls: list[ToolCall]) -> str:
        if not calls:
            raise ValueError(f"tool format {self.name!r}: no calls to render")
        return self.render_calls(calls)


TOOL_FORMATS: Registry[ToolFormat] = Registry("tool format")
TOOL_FORMATS.add(
    "hermes",
    ToolFormat(
        "hermes",
        CALL_OPEN + '{"name": NAME, "arguments": {...}}' + CALL_CLOSE,
        "several blocks for several calls",
        _hermes_parse,
        _hermes_render,
        (CALL_OPEN,),
        (CALL_OPEN,),
    ),
)
TOOL_FORMATS.add(
    "llama3_json",
    ToolFormat(
        "llama3_json",
        'only a JSON object {"name": NAME, "parameters": {...}}',
        'several calls: objects separated by "; "',
        _llama3_parse,
        _llama3_render,
        (PYTHON_TAG, "ipython"),
        (PYTHON_TAG, "{"),
    ),
)
TOOL_FORMATS.add(
    "mistral",
    ToolFormat(
        "mistral",
        TOOL_CALLS_TAG + ' [{"name": NAME, "arguments": {...}}]',
        "one list holding every call",
        _mistral_parse,
        _mistral_render,
        (TOOL_CALLS_TAG,),
        (TOOL_CALLS_TAG,),
    ),
)
DETECTION_ORDER = ("mistral", "llama3_json", "hermes")
"""Tool formats tried in this order by :func:`tool_format_for`; the first whose hint the tokenizer shows wins."""
DEFAULT_TOOL_FORMAT = "hermes"


def tool_format_for(tokenizer: Any, name: str | None = None) -> ToolFormat:
    """The tool format named ``name`` (an unknown name lists the valid ones), or, for None, the one a tokenizer's
    chat template or added tokens hint at (``[TOOL_CALLS]`` -> mistral, ``<|python_tag|>`` or ``ipython`` ->
    llama3_json, ``<tool_call>`` -> hermes), hermes when none does (SmolLM2, ChatML models)."""
    if name is not None:
        return TOOL_FORMATS.get(name)
    template = getattr(tokenizer, "chat_template", None)
    seen = (
        (template if isinstance(template, str) else "")
        + "\n"
        + "\n".join(getattr(tokenizer, "added_tokens_encoder", None) or {})
    )
    for candidate in DETECTION_ORDER:
        if any(h in seen for h in TOOL_FORMATS.get(candidate).hints):
            return TOOL_FORMATS.get(candidate)
    return TOOL_FORMATS.get(DEFAULT_TOOL_FORMAT)


def parse_act(text: str) -> ActParse:
    """Parse an Act completion in the hermes format (``TOOL_FORMATS["hermes"].parse``). Text without any
    ``<tool_call>`` tag is a reply; a tag with a body that is not a JSON object with a string ``name`` and an
    object ``arguments`` is a bad_format error (no call is run); ``<think>`` text is never parsed as a call."""
    return TOOL_FORMATS.get("hermes").parse(text)


def render_act(calls: list[ToolCall]) -> str:
    """The text Act writes for ``calls`` in the hermes format (``TOOL_FORMATS["hermes"].render``): one
    ``<tool_call>`` block per call; the counterpart of :func:`parse_act`."""
    return TOOL_FORMATS.get("hermes").render(calls)


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


REHEARSE_FAILURE = "rehearsed "
"""How the message of a bad_format error that :func:`parse_observation` made begins: Rehearse's output failed, not
the call (:func:`rehearse_failed`)."""


def rehearse_failed(obs: Any) -> bool:
    """Whether ``obs`` is the error :func:`parse_observation` puts in place of an observation Rehearse did not write
    well (no block, not JSON, not text): the imagined world failed to answer, which says nothing about the call."""
    err = obs.get("error") if isinstance(obs, dict) and set(obs) == {"error"} else None
    return (
        isinstance(err, dict)
        and err.get("kind") == "bad_format"
        and str(err.get("message", "")).startswith(REHEARSE_FAILURE)
    )


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
        if OBS_OPEN in text:
            body = text.split(OBS_OPEN, 1)[1]
        else:
            err = error_obs("bad_format", f"rehearsed output has no {OBS_OPEN} block")
            return err, err
    val, e = _loads(body.strip())
    if e:
        err = error_obs("bad_format", f"rehearsed observation is not valid JSON ({e})")
        return err, err
    return val, None


def format_observation(obs: Any) -> str:
    """The Rehearse output format for an observation (used for SFT targets and cache hits)."""
    return OBS_OPEN + json.dumps(obs, ensure_ascii=False) + OBS_CLOSE
