"""Rehearsal lessons: what self-rehearsed attempts of a task found, distilled by rule into short notes for Act.

A small model copies what its context shows. Pasting earlier imagined dialogues into Act's prompt (calls written
``name({json})``, as transcripts write them) taught the 135M model to answer in that syntax, which parses as a
reply, not a call (issue 29). :func:`distill` therefore writes no dialogue: it lists the distinct calls the
attempts made, each written in Act's own tool format (``ToolFormat.render``), with the value its rehearsed
observation returned, the calls whose rehearsed observation was an error (to avoid), malformed calls and attempts
that called nothing, then the model's reflections, each cut to a line, with any ``name({json})`` in them rewritten
in the tool format. Every section is bounded (items, characters); the caller caps the whole in tokens.

Two things the 135M model was measured to copy into its real run (shop-world val, bench/tts_val.py) are kept out:
a call whose *rehearsed* observation was unreadable (Rehearse wrote no valid JSON: ``rehearse_failed``) is not a
call to avoid, only a call whose result was not imagined; and a reflection that holds call markup which does not
parse (e.g. an error object written inside ``<tool_call>``) is dropped, since the final Act copied it as its call.

Only rehearsed observations may reach the notes: an observation whose source is the real environment raises
(a memory shown before the real run must never carry what the real world returned; METHOD.md section 6).
:func:`rehearsal_lessons` rolls out the attempts (rehearsal mode: no environment) and distills them, for
training rows whose Act prompt carries such notes (envace.training.sft).
"""

from __future__ import annotations

import json
import re
from typing import Any, Collection, Iterator, Sequence

from ..backends.base import Backend
from ..chat.parsing import ToolFormat, rehearse_failed, tool_format_for
from ..chat.prompts import ChatFormat
from ..core.types import Task, ToolCall, Trajectory, dumps, is_error_obs
from .engine import RolloutConfig, RolloutEngine

LESSONS_HEADER = "What your private rehearsals found (tool results were imagined; check them in the real run):"
REAL_SOURCES = ("real",)
"""Observation sources that are the real environment's answer: never allowed in rehearsal notes."""
_CALL_TEXT = re.compile(r"([A-Za-z_][\w.\-]*)\(\{")


def clip(text: str, max_chars: int) -> str:
    """``text`` on one line, at most ``max_chars`` characters (an ellipsis marks a cut)."""
    one = " ".join(text.split())
    return one if len(one) <= max_chars else one[: max(0, max_chars - 3)].rstrip() + "..."


def _calls_in(text: str) -> Iterator[tuple[int, int, ToolCall]]:
    """Each decodable ``name({json})`` of ``text`` (a transcript's way of writing a call): (start, end, call), in
    order, never overlapping; anything that does not decode as a JSON object followed by ``)`` is skipped."""
    i = 0
    decoder = json.JSONDecoder()
    for m in _CALL_TEXT.finditer(text):
        if m.start() < i:
            continue
        try:
            args, end = decoder.raw_decode(text, m.end() - 1)
        except ValueError:
            continue
        if isinstance(args, dict) and text[end : end + 1] == ")":
            i = end + 1
            yield m.start(), i, ToolCall(m.group(1), args)


def in_tool_format(text: str, tools: ToolFormat) -> str:
    """``text`` with every ``name({json})`` (a transcript's way of writing a call) rewritten as ``tools`` writes
    that call; anything that does not decode as a JSON object followed by ``)`` is left as it is."""
    out, i = [], 0
    for start, end, call in _calls_in(text):
        out += [text[i:start], tools.render([call])]
        i = end
    return "".join(out) + text[i:]


def cap_tokens(text: str, max_tokens: int, fmt: ChatFormat, keep: str = "head") -> tuple[str, dict[str, Any] | None]:
    """Cut ``text`` to at most ``max_tokens`` tokens (counted as ``fmt.encode`` counts them, marker included).

    keep: head (cut the end) | tail (cut the start) | middle (keep both ends, cut the middle) | lines (drop whole
    lines from the end, no marker: notes never end in half a call). Returns the kept
    text and None, or ``{"tokens_before", "tokens_after", "cut_text"}`` when something was cut.
    """
    if keep not in ("head", "tail", "middle", "lines"):
        raise ValueError(f"keep must be head, tail, middle or lines, got {keep!r}")
    ids = fmt.encode(text)
    if len(ids) <= max_tokens:
        return text, None
    if keep == "lines":  # whole lines from the end: never half a call
        lines = text.split("\n")
        while lines and len(fmt.encode("\n".join(lines))) > max_tokens:
            lines.pop()
        kept = "\n".join(lines)
        n_kept = len(fmt.encode(kept)) if kept else 0
        return kept, {"tokens_before": len(ids), "tokens_after": n_kept, "cut_text": text[len(kept) :].lstrip("\n")}
    budget = max_tokens - len(fmt.encode(f" [... {len(ids)} tokens cut ...] ")) - 1
    while True:
        budget = max(0, budget)
        h = {"head": budget, "tail": 0, "middle": (budget + 1) // 2}[keep]
        t = budget - h
        head_ids, tail_ids, cut_ids = ids[:h], ids[len(ids) - t :] if t else [], ids[h : len(ids) - t]
        marker = f" [... {len(cut_ids)} tokens cut ...] "
        kept = (fmt.tokenizer.decode(head_ids) + marker + fmt.tokenizer.decode(tail_ids)).strip()
        n_kept = len(fmt.encode(kept))
        if n_kept <= max_tokens or budget == 0:
            break
        budget -= max(1, n_kept - max_tokens)
    if n_kept > max_tokens:  # not even the marker fits
        kept, n_kept = "", 0
    return kept, {"tokens_before": len(ids), "tokens_after": n_kept, "cut_text": fmt.tokenizer.decode(cut_ids)}


def _seen(entry: dict[str, Any], k: int) -> None:
    if k not in entry["attempts"]:
        entry["attempts"].append(k)


def _leaves(obj: Any) -> Iterator[str]:
    """The scalar values of a JSON value, as text (booleans and nulls left out: they name no entity)."""
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _leaves(v)
    elif obj is not None and not isinstance(obj, bool):
        yield str(obj)


def imagined_args(call: ToolCall, seen: dict[str, str], user_text: str) -> dict[str, str]:
    """Argument name -> the tool whose earlier *imagined* observation held the argument's value, for each argument
    the attempt took from an imagined result: its value is among ``seen`` (value -> the tool that returned it) and
    the user's text does not hold it. Only scalar arguments are checked."""
    out = {}
    for name, v in call.arguments.items():
        if isinstance(v, (dict, list, bool)) or v is None:
            continue
        if (src := seen.get(str(v))) is not None and str(v) not in user_text:
            out[name] = src
    return out


def _masked(call: ToolCall, masked: dict[str, str]) -> ToolCall:
    """``call`` with its imagined argument values replaced by one placeholder (two attempts that cancelled different
    invented orders made the same call)."""
    return ToolCall(call.name, {k: ("<real>" if k in masked else v) for k, v in call.arguments.items()})


def _in_words(call: ToolCall, masked: dict[str, str]) -> str:
    """A call whose values came from imagined results, said without them and without call markup (the final Act
    copied a quoted call's invented order id after the real read had listed other ids; shop-world-decide test)."""
    taken = ", ".join(f"{k} from the real result of {src}" for k, src in masked.items())
    rest = ", ".join(f"{k} {dumps(v)}" for k, v in call.arguments.items() if k not in masked)
    return f"{call.name} with its {taken}" + (f", {rest}" if rest else "") + " (the rehearsal's values were imagined)"


def distill(
    attempts: Sequence[Trajectory],
    tools: ToolFormat,
    reflections: Sequence[str] = (),
    plans: Sequence[str] = (),
    *,
    max_calls: int = 6,
    max_errors: int = 4,
    value_chars: int = 160,
    text_chars: int = 200,
    header: str = LESSONS_HEADER,
    agreed: bool = False,
    read_only: Collection[str] = (),
    live_reads: bool = False,
    real_values: bool = False,
) -> str:
    """Short notes from self-rehearsed ``attempts`` (and their ``reflections``, or ``plans`` of a plan-only budget).

    Sections, in order (a head cut drops the last first): calls that got a non-error observation, in the order
    first made, each rendered by ``tools`` with its observation (at most ``max_calls``, ``value_chars`` each) and,
    over several attempts, how many made it; calls whose every observation was an error, with the error (at most
    ``max_errors``); calls whose rehearsed observation was unreadable (:func:`envace.chat.parsing.rehearse_failed`;
    at most ``max_calls``); malformed calls and attempts without a call; the plans and reflections (``text_chars``
    each) that hold no malformed call markup.
    ``agreed``: only the calls that every attempt made (a consensus: over several attempts that chose different
    calls, e.g. two different orders, the final Act made both; measured on shop-world test, issue 29), and one line
    saying how many were left out.
    ``live_reads``: a call to a tool named in ``read_only`` is listed in its place among the calls made, without
    its imagined result (or imagined error), as a read to make in the real run (on shop-world-decide val the final
    Act took a quoted read's imagined result as done and acted on invented order ids; issue 29). The other calls
    keep their rehearsed results.
    ``real_values``: a call with an argument whose value the attempt took from an earlier imagined observation
    (:func:`imagined_args`) is said in words, naming the tool whose real result holds the value, without the
    imagined value, without call markup and without its own imagined result; attempts that made it with different
    invented values agree on it.
    Raises ValueError on an observation from the real environment (:data:`REAL_SOURCES`).
    """
    found: dict[str, dict[str, Any]] = {}  # call key -> {call, ok, err, attempts}, in first-made order
    malformed, silent = 0, []
    for k, traj in enumerate(attempts):
        seen: dict[str, str] = {}  # value -> the tool whose imagined observation held it, in this attempt
        user_text = "\n".join(m.content for m in traj.messages if m.role == "user")
        for step in traj.steps:
            malformed += step.parse_error is not None
            for call, obs, src in zip(step.calls, step.observations, step.sources):
                if src in REAL_SOURCES:
                    raise ValueError(f"attempt {k + 1} of {traj.task_id}: a real observation cannot go into notes")
                masked = imagined_args(call, seen, user_text) if real_values else {}
                key = _masked(call, masked).key()
                e = found.setdefault(key, {"call": call, "ok": None, "err": None, "attempts": [], "masked": masked})
                _seen(e, k)
                if rehearse_failed(obs):  # the imagined world did not answer: nothing learnt about the call
                    continue
                if is_error_obs(obs):
                    e["err"] = e["err"] or obs["error"]
                    continue
                if e["ok"] is None:
                    e["ok"] = obs
                for v in _leaves(obs):
                    seen.setdefault(v, call.name)
        if not traj.calls():
            silent.append(k + 1)
    many = len(attempts) > 1
    left_out = 0
    if agreed:
        kept = {k: e for k, e in found.items() if len(e["attempts"]) == len(attempts)}
        left_out, found = len(found) - len(kept), kept
    live = {k for k, e in found.items() if live_reads and e["call"].name in read_only}
    worked = [(k, e) for k, e in found.items() if k in live or e["ok"] is not None]
    failed = [e for k, e in found.items() if k not in live and e["ok"] is None and e["err"] is not None]
    unknown = [e for k, e in found.items() if k not in live and e["ok"] is None and e["err"] is None]
    said = lambda e: _in_words(e["call"], e["masked"]) if e["masked"] else tools.render([e["call"]])  # noqa: E731
    lines = [header]
    if worked:
        lines.append(
            "Your rehearsals made these calls, in this order:" if live else "Calls that worked, in the order made:"
        )
        for k, e in worked[:max_calls]:
            times = f" ({len(e['attempts'])} of {len(attempts)} attempts)" if many else ""
            if k in live:
                lines.append(f"- {said(e)}: a read; make it in the real run and use its real result{times}")
            elif e["masked"]:  # its imagined result would hold the imagined values too
                lines.append(f"- {said(e)}{times}")
            else:
                lines.append(f"- {said(e)} returned {clip(dumps(e['ok']), value_chars)}{times}")
    if failed:
        lines.append("Calls to avoid (they returned an error):")
        for e in failed[:max_errors]:
            err = f"{e['err'].get('kind', 'error')}: {e['err'].get('message', '')}"
            lines.append(f"- {said(e)} -> {clip(err, value_chars)}")
    if unknown:
        lines.append("Calls whose result the rehearsal did not imagine (check them in the real run):")
        lines += [f"- {said(e)}" for e in unknown[:max_calls]]
    if left_out:
        lines.append(f"- {left_out} call(s) that only some attempts made are left out: the attempts disagreed.")
    if malformed:
        lines.append(f"- {malformed} malformed call(s): write a call exactly as {tools.call}.")
    if silent:
        which = ", ".join(map(str, silent)) if many else "The attempt"
        lines.append(f"- {'Attempts ' + which if many else which} called no tool.")
    if not found and not left_out and not malformed and not plans:
        lines.append("- No tool was called.")
    for label, texts in (("Your plans", plans), ("Your reflections", reflections)):
        kept = [(i + 1, clip(in_tool_format(t, tools), text_chars)) for i, t in enumerate(texts) if _readable(t, tools)]
        if kept:  # numbered by attempt
            lines.append(f"{label}:")
            lines += [f"- {i}: {t}" for i, t in kept]
    return "\n".join(lines)


_MARKUP = re.compile(r"[<>{}\[\]]")


def _readable(text: str, tools: ToolFormat) -> bool:
    """A reflection worth showing, as the model wrote it: prose. Not blank, no malformed call in the model's own
    tool format (``tools.parse``), and, once its ``name({json})`` calls are taken out, no markup at all (tags,
    braces, brackets): measured on shop-world val, the 135M model's reflections were often HTML or an error object
    inside tags, and the final Act copied that markup instead of writing a call."""
    if not text.strip() or tools.parse(text).error is not None:
        return False
    return not _MARKUP.search(_without_calls(text))


def _without_calls(text: str) -> str:
    """``text`` without its decodable ``name({json})`` calls (:func:`_calls_in`)."""
    out, i = [], 0
    for start, end, _ in _calls_in(text):
        out.append(text[i:start])
        i = end
    return "".join(out) + text[i:]


RULE_FORMATS: dict[str, dict[str, bool]] = {
    "calls": {},
    "agreed": {"agreed": True},
    "agreed-live": {"agreed": True, "live_reads": True},
    "agreed-real": {"agreed": True, "live_reads": True, "real_values": True},
}
"""The rule-based memory formats without reflections (as envace.evaluation.tts.MEMORY_FORMATS names them): the
:func:`distill` options of each, for test-time memories (``lessons`` is ``calls`` with the reflections) and for
notes made where no reflection exists (training rows' notes)."""


def rehearsal_lessons(
    policy: Backend,
    tasks: list[Task],
    rollout: RolloutConfig,
    n: int,
    max_tokens: int = 256,
    seed: int | None = None,
    memory: str = "calls",
) -> dict[str, str]:
    """Task id -> :func:`distill` of ``n`` self-rehearsed attempts of the task by ``policy`` (no reflections), in the
    format ``memory`` (:data:`RULE_FORMATS`; a read-only tool is one whose ToolSpec says so), cut to ``max_tokens``
    tokens as test-time scaling cuts m_x (``TTSConfig.memory_max_tokens``).

    The attempts run in rehearsal mode without shadow (whatever the deprecated fields of ``rollout`` say): they never
    touch a real environment. ``seed``: their sampling's (None: ``rollout.seed``, deprecated)."""
    if n < 1:
        raise ValueError(f"rehearsal_lessons needs n >= 1 attempts, got {n}")
    if memory not in RULE_FORMATS:
        raise ValueError(f"memory format {memory!r} has no rule without reflections; valid: {', '.join(RULE_FORMATS)}")
    cfg = rollout
    engine = RolloutEngine(policy, cfg, mode="rehearsal", shadow=False)
    if engine.rollout_mode.needs_env:
        raise RuntimeError("rehearsal attempts must not use a real environment")
    trajs = engine.run(tasks, group_prefix="lessons", group_size=n, seed=seed)
    tools = tool_format_for(policy.tokenizer, cfg.tool_format)
    fmt = ChatFormat.for_tokenizer(policy.tokenizer, cfg.chat_format, cfg.thinking)
    return {
        t.id: cap_tokens(
            distill(
                trajs[i * n : (i + 1) * n],
                tools,
                read_only=t.read_only_tools(),
                **RULE_FORMATS[memory],
            ),
            max_tokens,
            fmt,
            "lines",
        )[0]
        for i, t in enumerate(tasks)
    }


__all__ = [
    "LESSONS_HEADER",
    "REAL_SOURCES",
    "RULE_FORMATS",
    "cap_tokens",
    "clip",
    "in_tool_format",
    "distill",
    "rehearsal_lessons",
]
