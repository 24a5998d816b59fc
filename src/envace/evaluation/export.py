"""Trajectories as chat records that other tools read: OpenAI / Hugging Face messages with ``tool_calls``.

One record per trajectory, one JSON line each (``datasets.load_dataset("json", data_files=...)`` loads them; TRL's
``SFTTrainer`` takes the ``messages`` and ``tools`` columns)::

    {"messages": [...], "tools": [{"type": "function", "function": {...}}, ...], "id", "task_id", "group_id",
     "mode", "world": "real" | "imagined", "reward", "success", "truncated", "parse_errors",
     "observation_sources": [...], ("iteration" for a training run's trajectories)}

An Act step that called tools is ``{"role": "assistant", "content": TEXT or EMPTY, "tool_calls": [{"id": "call_S_J",
"type": "function", "function": {"name", "arguments": ARGS}}]}``, each observation ``{"role": "tool",
"tool_call_id": "call_S_J", "content": JSON TEXT}`` (S: the step, J: the call in it; the ids are unique in a record).
A text reply is a plain assistant message; user turns and the system message are as the policy saw them.

ARGS and EMPTY depend on who reads the records (:data:`TARGETS`):

- ``hf`` (the default): Hugging Face chat templates and TRL's ``SFTTrainer``. ARGS is the arguments object and EMPTY
  is ``""``: Qwen2.5's and Llama-3.1's templates write ``arguments | tojson`` (JSON text would come out as one escaped
  string), and templates that concatenate ``content`` (SmolLM2's) raise on null. ``datasets`` (5.x) reads
  ``messages`` as JSON values, so arguments of differing keys come back as written.
- ``openai``: OpenAI's fine-tuning format. ARGS is JSON text and EMPTY is null.

Where the pieces come from: ``Trajectory.messages`` is the Act chat in order (system, every user turn, assistant
outputs, tool results) but holds calls only in envace's ``<tool_call>`` text; ``Trajectory.steps`` holds the parsed
calls, observations and their sources but not the user's words. A record walks the messages and takes each
assistant message's calls from its step (one step per assistant message, in order; a mismatch is an error).
The tool schemas are the trajectory's own (``Trajectory.tools``) where the chat template rendered them and the system
message does not list them (``RolloutConfig.native_tools``), else they are read back from the system message's
``# Tools`` block (what the policy saw) (:func:`tools_of`).

Departures from the OpenAI format, where envace's chat has no OpenAI counterpart:

- a malformed Act output (no call ran) is an assistant text message followed by the parser's error as a *user*
  message: OpenAI has no tool message without a call. ``parse_errors`` counts them.
- a trajectory cut inside a step (``truncated``) may end on calls without results.

``world``: a trajectory rolled out in the real environment is ``real``; every other mode's observations were
imagined (Rehearse, a second model, a simulator) and the record says ``imagined``. Gold trajectories
(envace.training.sft.gold_trajectories) are ``real``: their Rehearse answers are the real environment's.
``observation_sources`` says, per tool message, how the rollout got it (``Step.sources``: rehearsed, real, cache,
validation, simulator); a gold trajectory's say ``rehearsed``, the role that played the real answers back.
``success`` is the real environment's own check where one ran (``Trajectory.env_outcome``), else null.

Two settings for templates that differ (:data:`CONTENT`, :data:`SYSTEM`; these registries and :data:`TARGETS` live in
:mod:`envace.chat.records`, where the export config checks its settings): ``content="raw"`` keeps the Act output
as generated (``<tool_call>`` blocks in the assistant text, ``tool_calls`` kept too): a ChatML template that ignores
``tool_calls`` (SmolLM2's) then renders the very context envace trained on. ``system="task"`` drops envace's tool
list (if the system message has one) and calling instructions from the system message, for a template that renders
``tools`` itself. A trajectory whose template rendered the tools has no tool list in its system message: its
``seen`` system message and ``tools``, rendered by that template, are what the policy saw.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Iterator

from ..chat.records import CONTENT, DEFAULT_TARGET, SYSTEM, TARGETS, TOOLS_HEADER, Target, task_system
from ..core.atomic import write_lines
from ..core.types import ToolSpec, Trajectory
from ..rollout.modes import MODES

REAL_MODES = frozenset(name for name in MODES if MODES.get(name).needs_env)
"""Rollout modes whose observations come from the real environment (envace.rollout.modes.MODES)."""


def tools_from_system(text: str) -> list[dict[str, Any]]:
    """The tool schemas of a system message built by ``envace.chat.prompts.act_system``, as OpenAI function schemas
    (``[]`` when it lists none). A line of the block that is not a tool's JSON is an error."""
    block = next((p for p in text.split("\n\n") if p.startswith(TOOLS_HEADER)), None)
    if block is None:
        return []
    tools = []
    for line in block[len(TOOLS_HEADER) :].splitlines():
        try:
            tools.append(ToolSpec.from_dict(json.loads(line)).to_openai())
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(
                f"the system message's tools block holds a line that is not a tool ({e}): {line[:80]!r}"
            ) from None
    return tools


def tools_of(traj: Trajectory) -> list[dict[str, Any]]:
    """The tool schemas a trajectory's Act was given, as OpenAI function schemas: its ``tools`` where it keeps them
    (the chat template rendered them), else those its system message lists (:func:`tools_from_system`)."""
    if traj.tools is not None:
        return [t.to_openai() for t in traj.tools]
    return tools_from_system(next((m.content for m in traj.messages if m.role == "system"), ""))


def call_id(step: int, j: int) -> str:
    """The id of call ``j`` of step ``step`` (unique within a trajectory)."""
    return f"call_{step}_{j}"


def world_of(traj: Trajectory) -> str:
    """``real`` if the real environment answered the trajectory's calls, else ``imagined``."""
    return "real" if traj.mode in REAL_MODES else "imagined"


def chat_messages(
    traj: Trajectory, content: str = "text", system: str = "seen", target: str = DEFAULT_TARGET
) -> tuple[list[dict[str, Any]], list[str], int]:
    """``(messages, observation sources, parse errors)`` of a trajectory: its Act chat in the OpenAI format
    (module docstring); the sources are those of the tool messages, in order. A trajectory whose messages do not
    match its steps (an assistant message per step, a tool message per answered call) is an error."""
    write_content, write_system, to = CONTENT.get(content), SYSTEM.get(system), TARGETS.get(target)
    out: list[dict[str, Any]] = []
    sources: list[str] = []
    parse_errors = 0
    steps = iter(enumerate(traj.steps))
    pending: list[
        tuple[str | None, str]
    ] = []  # (call id or None for a parse error's feedback, source) awaiting a tool message
    for m in traj.messages:
        if m.role == "system":
            out.append({"role": "system", "content": write_system(m.content)})
        elif m.role == "user":
            out.append({"role": "user", "content": m.content})
        elif m.role == "assistant":
            s, step = next(steps, (None, None))
            if step is None:
                raise ValueError(f"trajectory {traj.id}: more assistant messages than its {len(traj.steps)} steps")
            text = write_content(m, step)
            msg: dict[str, Any] = {"role": "assistant", "content": to.empty_content if text is None else text}
            if step.calls:
                msg["tool_calls"] = [
                    {
                        "id": call_id(s, j),
                        "type": "function",
                        "function": {"name": c.name, "arguments": to.arguments(c.arguments)},
                    }
                    for j, c in enumerate(step.calls)
                ]
            out.append(msg)
            if step.parse_error is not None:
                parse_errors += 1
                pending = [(None, "validation")]
            else:
                pending = [
                    (call_id(s, j), step.sources[j] if j < len(step.sources) else "") for j in range(len(step.calls))
                ]
        elif m.role == "tool":
            if not pending:
                raise ValueError(f"trajectory {traj.id}: a tool message that answers no call")
            cid, source = pending.pop(0)
            if cid is None:  # the parser's answer to a malformed output: no call to attach it to
                out.append({"role": "user", "content": m.content})
            else:
                out.append({"role": "tool", "tool_call_id": cid, "content": m.content})
                sources.append(source)
        else:
            raise ValueError(f"trajectory {traj.id}: a message of unknown role {m.role!r}")
    left = sum(1 for _ in steps)
    if left:
        raise ValueError(f"trajectory {traj.id}: {left} of its {len(traj.steps)} steps have no assistant message")
    return out, sources, parse_errors


def trajectory_record(
    traj: Trajectory,
    world: str | None = None,
    content: str = "text",
    system: str = "seen",
    extra: dict[str, Any] | None = None,
    target: str = DEFAULT_TARGET,
) -> dict[str, Any]:
    """One JSON record of a trajectory (module docstring). ``world`` overrides :func:`world_of` (gold trajectories
    are ``real``); ``extra`` fields (e.g. ``iteration``) are added."""
    if not traj.messages:
        raise ValueError(f"trajectory {traj.id}: no messages (only a rollout's trajectories can be exported)")
    messages, sources, parse_errors = chat_messages(traj, content, system, target)
    outcome = traj.env_outcome or {}
    return {
        "messages": messages,
        "tools": tools_of(traj),
        "id": traj.id,
        "task_id": traj.task_id,
        "group_id": traj.group_id,
        "mode": traj.mode,
        "world": world or world_of(traj),
        "reward": traj.reward,
        "success": outcome.get("success"),
        "truncated": traj.truncated,
        "parse_errors": parse_errors,
        "observation_sources": sources,
        **(extra or {}),
    }


# ------------------------------------------------------------------------------------------------ reading files


@dataclass
class ReadResult:
    """Trajectories read from files, with the extra fields of their lines (``iteration``), and one line per item
    that could not be read (``FILE:LINE: why``)."""

    items: list[tuple[Trajectory, dict[str, Any]]]
    errors: list[str]


EXTRA_FIELDS = ("iteration",)  # fields a trajectories file adds to Trajectory.to_dict (envace.training.trainer)


def _raw_items(path: str) -> Iterator[tuple[str, Any]]:
    """``(where, parsed JSON or an error string)`` for each trajectory of a file: JSON lines (a training run's
    ``trajectories.jsonl``, ``envace rollout --out``), or one JSON document with a ``trajectories`` list (``envace
    eval --trajectories --out``, ``envace fidelity --out``) or a list of them. A folder means its
    ``trajectories.jsonl``."""
    if os.path.isdir(path):
        path = os.path.join(path, "trajectories.jsonl")
    with open(path, encoding="utf-8", errors="replace") as f:
        first = f.readline()
    if not _is_object(first):  # not JSON lines: perhaps an indented results document
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        items = doc.get("trajectories") if isinstance(doc, dict) else doc
        if isinstance(items, list):
            for i, d in enumerate(items):
                yield f"{path}: trajectories[{i}]", d
            return
        if isinstance(doc, dict):
            yield path, "a JSON document without a 'trajectories' list (an eval result written without --trajectories?)"
            return
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except ValueError as e:
                yield f"{path}:{lineno}", f"not a JSON line ({e})"


def _is_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def read_trajectories(paths: list[str] | tuple[str, ...]) -> ReadResult:
    """Every trajectory the files hold; an item that is not one is skipped with a line in ``errors`` naming the
    file and line (or list index), and everything valid is kept. A file that does not exist is an error."""
    res = ReadResult([], [])
    for path in paths:
        for where, d in _raw_items(path):
            if isinstance(d, str):
                res.errors.append(f"{where}: {d}")
                continue
            try:
                traj = Trajectory.from_dict(d)
            except (KeyError, TypeError, AttributeError, ValueError) as e:
                res.errors.append(f"{where}: not a trajectory ({type(e).__name__}: {e})")
                continue
            res.items.append((traj, {k: d[k] for k in EXTRA_FIELDS if k in d}))
    return res


def export_records(
    items: list[tuple[Trajectory, dict[str, Any]]],
    real_only: bool = False,
    world: str | None = None,
    content: str = "text",
    system: str = "seen",
    target: str = DEFAULT_TARGET,
) -> tuple[list[dict[str, Any]], list[str], int]:
    """``(records, errors, skipped imagined)``: a record per trajectory; with ``real_only`` an imagined trajectory
    is left out (counted); a trajectory that cannot be converted is an error line, the others are kept."""
    records, errors, imagined = [], [], 0
    for traj, extra in items:
        if real_only and (world or world_of(traj)) != "real":
            imagined += 1
            continue
        try:
            records.append(trajectory_record(traj, world, content, system, extra, target))
        except ValueError as e:
            errors.append(str(e))
    return records, errors, imagined


def write_records(path: str, records: list[dict[str, Any]]) -> None:
    """Write records as JSON lines, replacing ``path`` atomically."""
    write_lines(path, [json.dumps(r, ensure_ascii=False) for r in records])


__all__ = [  # CONTENT, DEFAULT_TARGET, SYSTEM, TARGETS, Target, task_system: defined in envace.chat.records
    "CONTENT",
    "DEFAULT_TARGET",
    "SYSTEM",
    "TARGETS",
    "ReadResult",
    "Target",
    "call_id",
    "chat_messages",
    "export_records",
    "read_trajectories",
    "tools_from_system",
    "tools_of",
    "trajectory_record",
    "world_of",
    "write_records",
    "task_system",
]
