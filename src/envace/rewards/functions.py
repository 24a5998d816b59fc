"""Rewards: registered, composable functions over a finished trajectory (METHOD.md section 2).

Every reward in :data:`REWARDS` is ``fn(task, traj, ctx) -> RewardResult``. ``RewardResult.value`` is a float,
or ``None`` for UNSCORED: the reward could not be computed (the judge failed, the task has no gold label,
...). An unscored trajectory is masked out of the update and counted; it is never silently a reward of 0.

Built-in rewards:

- ``"gold_exact"``: the flattened, ordered calls equal the task's gold calls (name + canonical arguments).
- ``"gold_f1"``: multiset F1 of called vs gold calls (see :func:`call_prf`).
- ``"checklist"``: fraction of the task's rule-checked checklist items that hold (rules in :data:`RULES`).
- ``"reply_facts"``: fraction of the task's expected outputs (the facts its replies must state, e.g. a balance
  read from an observation) that the replies contain; 1 for a task with none. On a rehearsed trajectory a fact
  is only stated correctly if Rehearse imagined the observation correctly (or Act guessed it), so this is the
  part of a reward that couples Rehearse to the outcome; the gold-call rewards ignore observations and replies.
- ``"outcome_checklist"``: fraction of :func:`outcome_rules` that hold: the task's rule-checked checklist, plus a
  ``reply_contains`` item for each expected output it does not already check, plus, for a task without any
  rule-checked item (BFCL, tau2), one ``called`` item per distinct gold call. On the built-in suites (whose
  checklists already check every expected output) it equals ``"checklist"``.
- ``"consistent_f1"`` / ``"consistent_facts"``: ``gold_f1`` / ``reply_facts`` read in the trajectory's own world:
  a value the task does not state (a looked-up amount, a balance to report) must come from the trajectory's
  observations rather than equal the real world's. On a rehearsed trajectory this scores Act against the world
  Rehearse imagined, where the gold rewards score it against a world it never saw.
- ``"checklist_judge"``: fraction of checklist items that an LLM judge (``ctx.judge``) says hold.
- ``"grounded"``: **uses the real environment**: the environment's own success check. A trajectory that ran in
  a real environment (real mode, shadow copy) is scored from that run (``traj.env_outcome``, recorded by the
  rollout), so no call is executed twice; only a rehearsed trajectory is replayed, in a fresh real environment
  of the task, and that is refused for environments whose tools have real side effects (MCP) unless the task
  opts in (``env_config["allow_replay"]``, envace.envs.replay). It is the only reward here that runs the world;
  use it for evaluation or for the real-env GRPO baseline, not when training must be env-free.
- ``"verifiers_rubric"``: the rubric of a task adapted from a verifiers taskset (``envace.envs.verifiers_env``):
  its reward functions on the trajectory as it stands, real or rehearsed, without running a tool (env-free, so a
  training reward); the weighted sum over the positive weights, in [0, 1]. Unscored for tasks of other suites.

:func:`make_reward` builds a weighted sum of rewards from a spec (``"gold_f1"``, ``["gold_exact", ...]`` or
``{"gold_exact": 0.5, "checklist": 0.5}``); a term may be a product of registered rewards written with ``*``
(``"gold_f1*reply_facts"``: right calls *and* right facts; ``{"gold_f1*reply_facts": 0.8, "checklist": 0.2}``).
A term, and the whole reward, is unscored (None) when any reward in it is. :func:`score_trajectories` writes
``traj.reward`` / ``traj.reward_info`` for a group and counts the unscored ones. :func:`call_prf` and
:func:`tool_name_prf` are the pure metrics the evaluation harness reuses.

Argument comparisons are canonical: two values match when their canonical JSON (:func:`envace.core.types.dumps`,
sorted keys) is equal, the same rule as :meth:`envace.core.types.ToolCall.key`. So ``1`` and ``1.0`` differ.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..backends.base import Backend, SamplingParams
from ..core.registry import Registry
from ..core.types import Task, ToolCall, Trajectory, dumps, is_error_obs, states_fact


@dataclass
class RewardResult:
    value: float | None
    """The reward, or None = unscored (masked out of the update and counted)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Details for logs and inspection (JSON-able)."""


@dataclass
class RewardContext:
    """What a reward may need besides the task and the trajectory."""

    judge: Backend | None = None
    """The frozen model that answers ``"checklist_judge"`` (None: that reward cannot be used)."""
    judge_params: SamplingParams | None = None
    """Sampling settings of the judge; None: greedy, up to :data:`JUDGE_MAX_NEW_TOKENS` tokens."""


RewardFn = Callable[[Task, Trajectory, RewardContext], RewardResult]
REWARDS: Registry[RewardFn] = Registry("reward")


# --------------------------------------------------------------------------------------------------------
# Pure metrics (shared with evaluation)
# --------------------------------------------------------------------------------------------------------


def _prf(tp: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    """Precision, recall, F1 from counts. Both empty -> (1, 1, 1); exactly one empty -> (0, 0, 0)."""
    if n_pred == 0 and n_gold == 0:
        return 1.0, 1.0, 1.0
    if n_pred == 0 or n_gold == 0:
        return 0.0, 0.0, 0.0
    p, r = tp / n_pred, tp / n_gold
    f1 = 0.0 if tp == 0 else 2 * p * r / (p + r)
    return p, r, f1


def call_prf(pred_calls: Sequence[ToolCall], gold_calls: Sequence[ToolCall]) -> tuple[float, float, float]:
    """Precision, recall and F1 of predicted vs gold calls as *multisets* of (name, canonical arguments).

    Order is ignored; a call repeated twice counts twice on either side (true positives are the multiset
    intersection). Edge cases: both empty -> (1, 1, 1); exactly one side empty -> (0, 0, 0).
    """
    pred, gold = Counter(c.key() for c in pred_calls), Counter(c.key() for c in gold_calls)
    tp = sum((pred & gold).values())
    return _prf(tp, sum(pred.values()), sum(gold.values()))


def tool_name_prf(pred_calls: Sequence[ToolCall], gold_calls: Sequence[ToolCall]) -> tuple[float, float, float]:
    """Precision, recall and F1 over the *set* of called tool names vs the set of gold tool names
    (FinMCP-Bench's per-task tool F1, "TF1"). Same edge cases as :func:`call_prf`."""
    pred, gold = {c.name for c in pred_calls}, {c.name for c in gold_calls}
    return _prf(len(pred & gold), len(pred), len(gold))


# --------------------------------------------------------------------------------------------------------
# Gold-call rewards
# --------------------------------------------------------------------------------------------------------


def _no_gold(task: Task) -> RewardResult | None:
    # ``gold_actions == []`` means "not annotated"; a task whose answer is "make no call" has ``[[]]``.
    if not task.gold_actions:
        return RewardResult(None, {"unscored": f"task {task.id!r} has no gold actions"})
    return None


@REWARDS.register("gold_exact")
def gold_exact(task: Task, traj: Trajectory, ctx: RewardContext) -> RewardResult:
    """1 if the trajectory's calls, flattened in order, equal the task's gold calls (name + canonical
    arguments), else 0. Unscored when the task has no gold actions."""
    if (missing := _no_gold(task)) is not None:
        return missing
    pred, gold = [c.key() for c in traj.calls()], [c.key() for c in task.flat_gold()]
    first = next((i for i, (a, b) in enumerate(zip(pred, gold)) if a != b), min(len(pred), len(gold)))
    ok = pred == gold
    return RewardResult(
        1.0 if ok else 0.0, {"n_calls": len(pred), "n_gold": len(gold), "first_mismatch": None if ok else first}
    )


@REWARDS.register("gold_f1")
def gold_f1(task: Task, traj: Trajectory, ctx: RewardContext) -> RewardResult:
    """Multiset F1 of (name, arguments) of the trajectory's calls vs the gold calls (:func:`call_prf`)."""
    if (missing := _no_gold(task)) is not None:
        return missing
    p, r, f1 = call_prf(traj.calls(), task.flat_gold())
    return RewardResult(f1, {"precision": p, "recall": r, "f1": f1})


# --------------------------------------------------------------------------------------------------------
# Rule-checked checklist
# --------------------------------------------------------------------------------------------------------

# rule type -> check(rule, traj) -> bool. A rule is a dict ``{"type": TYPE, ...fields}``.
RULES: Registry[Callable[[dict[str, Any], Trajectory], bool]] = Registry("checklist rule type")


def _args_match(subset: Mapping[str, Any], arguments: Mapping[str, Any]) -> bool:
    return all(k in arguments and dumps(arguments[k]) == dumps(v) for k, v in subset.items())


@RULES.register("called")
def _rule_called(rule: dict[str, Any], traj: Trajectory) -> bool:
    """Some call names ``rule["tool"]`` and has every argument of ``rule.get("arguments", {})`` (a subset)."""
    tool, subset = rule["tool"], rule.get("arguments") or {}
    return any(c.name == tool and _args_match(subset, c.arguments) for c in traj.calls())


@RULES.register("not_called")
def _rule_not_called(rule: dict[str, Any], traj: Trajectory) -> bool:
    """No call names ``rule["tool"]``."""
    return all(c.name != rule["tool"] for c in traj.calls())


@RULES.register("reply_contains")
def _rule_reply_contains(rule: dict[str, Any], traj: Trajectory) -> bool:
    """Some text reply states ``rule["text"]`` (case-insensitive, as a whole value: :func:`states_fact`)."""
    return any(states_fact(r, rule["text"]) for r in traj.replies())


@RULES.register("max_calls")
def _rule_max_calls(rule: dict[str, Any], traj: Trajectory) -> bool:
    """At most ``rule["n"]`` calls in the whole trajectory."""
    return len(traj.calls()) <= int(rule["n"])


def check_rule(rule: dict[str, Any], traj: Trajectory) -> bool:
    """Apply one checklist rule; an unknown type or a missing field raises a ValueError that says which."""
    if not isinstance(rule, dict) or "type" not in rule:
        raise ValueError(
            f"a checklist rule must be a dict with a 'type' (one of {', '.join(RULES.names())}); got {rule!r}"
        )
    check = RULES.get(rule["type"])  # UnknownNameError lists the valid types
    try:
        return bool(check(rule, traj))
    except KeyError as e:
        raise ValueError(f"checklist rule {rule!r} lacks the field {e.args[0]!r}") from None


@REWARDS.register("checklist")
def checklist(task: Task, traj: Trajectory, ctx: RewardContext) -> RewardResult:
    """Fraction of the task's checklist items with a rule that the trajectory satisfies. Items without a rule
    (judge-only) are skipped and listed in ``info["skipped"]``; no checkable item -> unscored."""
    items, skipped = [], []
    for i, item in enumerate(task.checklist):
        if item.rule is None:
            skipped.append(i)
            continue
        items.append({"index": i, "satisfied": check_rule(item.rule, traj)})
    info: dict[str, Any] = {"items": items, "skipped": skipped}
    if not items:
        info["unscored"] = f"task {task.id!r} has no rule-checked checklist item"
        return RewardResult(None, info)
    return RewardResult(sum(it["satisfied"] for it in items) / len(items), info)


def facts_found(task: Task, traj: Trajectory) -> list[bool]:
    """For each of the task's expected outputs, whether the text replies state it (:func:`states_fact`: the rule
    the environments' success checks use, envace.envs.builtin / mcp)."""
    text = "\n".join(traj.replies())
    return [states_fact(text, fact) for fact in task.expected_outputs]


@REWARDS.register("reply_facts")
def reply_facts(task: Task, traj: Trajectory, ctx: RewardContext) -> RewardResult:
    """Fraction of the task's expected outputs that the replies state (:func:`facts_found`). A task with no
    expected output scores 1 (nothing to state: a factor ``gold_f1*reply_facts`` is then plain ``gold_f1``)."""
    found = facts_found(task, traj)
    info = {"n_facts": len(found), "missing": [f for f, ok in zip(task.expected_outputs, found) if not ok]}
    return RewardResult(sum(found) / len(found) if found else 1.0, info)


def outcome_rules(task: Task) -> list[dict[str, Any]]:
    """The rules that :func:`outcome_checklist` checks: the task's own rule-checked checklist items; a
    ``reply_contains`` rule for each expected output that no ``reply_contains`` rule already checks (same text,
    case-insensitive); and, when the task has no rule-checked item at all (BFCL, tau2), a ``called`` rule with the
    full arguments for each distinct gold call. Gold calls of the built-in suites that are meant to fail are not
    in their checklists; derived ``called`` rules cannot tell them apart and ask for every gold call."""
    rules = [dict(item.rule) for item in task.checklist if item.rule is not None]
    if not rules:
        seen: set[str] = set()
        for c in task.flat_gold():
            if c.key() not in seen:
                seen.add(c.key())
                rules.append({"type": "called", "tool": c.name, "arguments": dict(c.arguments)})
    stated = {str(r.get("text", "")).lower() for r in rules if r.get("type") == "reply_contains"}
    for fact in task.expected_outputs:
        if str(fact).lower() not in stated:
            stated.add(str(fact).lower())
            rules.append({"type": "reply_contains", "text": fact})
    return rules


@REWARDS.register("outcome_checklist")
def outcome_checklist(task: Task, traj: Trajectory, ctx: RewardContext) -> RewardResult:
    """Fraction of :func:`outcome_rules` that the trajectory satisfies; unscored when the task yields no rule (no
    checklist, no gold calls, no expected outputs). ``info["failed"]`` lists the rules that do not hold."""
    rules = outcome_rules(task)
    if not rules:
        return RewardResult(None, {"unscored": f"task {task.id!r} has no checklist rule, gold call or expected output"})
    held = [check_rule(r, traj) for r in rules]
    return RewardResult(
        sum(held) / len(held), {"n_rules": len(rules), "failed": [r for r, ok in zip(rules, held) if not ok]}
    )


# --------------------------------------------------------------------------------------------------------
# World-consistent rewards: the gold, read in the trajectory's own (maybe imagined) world
# --------------------------------------------------------------------------------------------------------
# On a rehearsed trajectory the observations are Rehearse's, so a value that only the world supplies (a
# balance, an id, the newest payment) is right when Act takes it from *its* observations, not when it equals
# the real world's value that the gold holds. The gold-call rewards punish exactly that (measured: after four
# RL steps with gold_f1 the bank tasks that move a looked-up amount went from 9/9 to 0/9 on val, docs/rewards.md).

_NUMBER = re.compile(r"(?<![0-9.])\d+(?:\.\d+)?")


def numbers_in(text: str) -> set[float]:
    """The numbers written in ``text`` (thousands commas dropped): ``"$1,210.50 and 3"`` -> {1210.5, 3.0}."""
    return {float(m) for m in _NUMBER.findall(text.replace(",", ""))}


def _text(obs: Any) -> str:
    return obs if isinstance(obs, str) else dumps(obs)


def _values_text(obs: Any) -> str:
    """The values of an observation (not its JSON keys), lower-cased; a text observation whole."""
    from ..envs.references import json_leaves

    if isinstance(obs, str):
        try:
            obs = json.loads(obs)
        except ValueError:
            return obs.lower()
    return " ".join(str(v) for v in json_leaves(obs)).lower()


def _as_number(v: str) -> float | None:
    """A normalised value that is a plain number ("511.00") as a float, else None."""
    return float(v) if _NUMBER.fullmatch(v) else None


def is_shown(value: Any, shown: str, shown_numbers: set[float]) -> bool:
    """Whether the task states ``value`` before any observation (``shown``: lower-cased
    :func:`envace.envs.references.shown_text`, ``shown_numbers``: :func:`numbers_in` of it); a number in any of
    its written forms (511, 511.0, 511.00)."""
    from ..envs.references import mentions, norm_value

    if isinstance(value, bool) or value is None:
        return True  # a flag or a null is a choice, not a value the world supplies
    if isinstance(value, (int, float)):
        return float(value) in shown_numbers
    v = norm_value(str(value))
    return not v or mentions(shown, v) or _as_number(v) in shown_numbers


def _seen(value: Any, obs_text: str, obs_numbers: set[float]) -> bool:
    """Whether ``value`` appears in the observations so far (their text lower-cased, their numbers)."""
    from ..envs.references import norm_value

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) in obs_numbers
    v = norm_value(str(value))
    return bool(v) and (v in obs_text or _as_number(v) in obs_numbers)


_NO_RESULT = object()  # a call that got no observation (a cut trajectory); an observation may itself be None


def _call_results(traj: Trajectory) -> list[tuple[ToolCall, Any]]:
    """Each call of ``traj`` in order with the observation fed back for it (:data:`_NO_RESULT` where none was)."""
    return [
        (call, step.observations[i] if i < len(step.observations) else _NO_RESULT)
        for step in traj.steps
        for i, call in enumerate(step.calls)
    ]


def _calls_with_context(traj: Trajectory) -> list[tuple[ToolCall, str, set[float]]]:
    """Each call of ``traj`` with the text and numbers of the observations before it."""
    out, text, numbers = [], "", set()
    for call, obs in _call_results(traj):
        out.append((call, text, numbers))
        if obs is not _NO_RESULT:
            t = _text(obs).lower()
            text, numbers = text + "\n" + t, numbers | numbers_in(t)
    return out


def stated_arguments(gold: ToolCall, shown: str, shown_numbers: set[float]) -> frozenset[str]:
    """The arguments of ``gold`` whose values the task states (:func:`is_shown`); a structured value counts as
    stated (it is compared whole). The others are the world's: an amount looked up, an id."""
    return frozenset(
        k for k, g in gold.arguments.items() if isinstance(g, (dict, list)) or is_shown(g, shown, shown_numbers)
    )


def consistent_match(
    gold: ToolCall, stated: frozenset[str], call: ToolCall, obs_text: str, obs_numbers: set[float]
) -> bool:
    """``call`` does what ``gold`` does in the call's own world: same name and argument names; each argument in
    ``stated`` (:func:`stated_arguments`) equal to gold's (canonical JSON); each other one a value that an earlier
    observation of the trajectory holds."""
    if call.name != gold.name or set(call.arguments) != set(gold.arguments):
        return False
    for k, g in gold.arguments.items():
        v = call.arguments[k]
        if (dumps(v) != dumps(g)) if k in stated else not _seen(v, obs_text, obs_numbers):
            return False
    return True


@REWARDS.register("consistent_f1")
def consistent_f1(task: Task, traj: Trajectory, ctx: RewardContext) -> RewardResult:
    """F1 of the trajectory's calls vs the gold calls as :func:`call_prf`, but matching by
    :func:`consistent_match`: values the world supplies are checked against the trajectory's own earlier
    observations, so a rehearsed trajectory is scored in the world Rehearse imagined. On a real trajectory it is
    looser than ``gold_f1`` (any observed value counts, not only the right one); unscored without gold."""
    from ..envs.references import shown_text

    if (missing := _no_gold(task)) is not None:
        return missing
    shown = shown_text(task)
    shown_numbers = numbers_in(shown)
    free = _calls_with_context(traj)
    tp = 0
    for g in task.flat_gold():  # greedy one-to-one matching in gold order
        stated = stated_arguments(g, shown, shown_numbers)
        j = next((j for j, (c, t, n) in enumerate(free) if consistent_match(g, stated, c, t, n)), None)
        if j is not None:
            tp += 1
            free.pop(j)
    p, r, f1 = _prf(tp, len(traj.calls()), len(task.flat_gold()))
    return RewardResult(f1, {"precision": p, "recall": r, "f1": f1})


def grounded_numbers(traj: Trajectory, shown: set[float]) -> set[float]:
    """The numbers that ``shown`` (the task's own) and the observations hold, in order; an observation's echo of
    a number its call made up (not shown, not observed before) does not ground it."""
    grounded = set(shown)
    for call, obs in _call_results(traj):
        if obs is not _NO_RESULT:
            made_up = numbers_in(dumps(call.arguments)) - grounded
            grounded |= numbers_in(_text(obs)) - made_up
    return grounded


@REWARDS.register("consistent_facts")
def consistent_facts(task: Task, traj: Trajectory, ctx: RewardContext) -> RewardResult:
    """Fraction of the task's expected outputs that the replies state in the trajectory's own world: a fact the
    task states must appear as written (as ``reply_facts``); a fact only the world holds (a balance, a payee)
    counts when the replies state a value of its kind (a number, a word) taken from the observations, and no
    number the replies write is made up (every one is in the task's text or an observation). 1 for a task with
    no expected output."""
    from ..envs.references import shown_text

    facts = list(task.expected_outputs)
    if not facts:
        return RewardResult(1.0, {"n_facts": 0})
    shown = shown_text(task)
    shown_numbers = numbers_in(shown)
    reply = "\n".join(traj.replies()).lower()
    obs_numbers, reply_numbers = grounded_numbers(traj, shown_numbers), numbers_in(reply)
    made_up = sorted(reply_numbers - obs_numbers)
    words = set(
        re.findall(r"[a-z][a-z_-]{2,}", " ".join(_values_text(o) for s in traj.steps for o in s.observations))
    ) - set(re.findall(r"[a-z][a-z_-]{2,}", shown))
    held = []
    for f in facts:
        fs = str(f).lower()
        if is_shown(f, shown, shown_numbers):
            held.append(fs in reply)
        elif _NUMBER.fullmatch(fs.lstrip("$").replace(",", "")):
            held.append(not made_up and bool(reply_numbers & obs_numbers))
        else:
            held.append(any(re.search(rf"(?<![a-z]){re.escape(w)}(?![a-z])", reply) for w in words))
    return RewardResult(
        sum(held) / len(held),
        {"n_facts": len(facts), "missing": [f for f, ok in zip(facts, held) if not ok], "made_up_numbers": made_up[:5]},
    )


# --------------------------------------------------------------------------------------------------------
# LLM checklist judge
# --------------------------------------------------------------------------------------------------------

JUDGE_MAX_NEW_TOKENS = 1024
JUDGE_OBS_CHARS = 2000  # each observation / message is cut to this many characters in the judge prompt

JUDGE_SYSTEM = (
    "You are a strict evaluator of a tool-using assistant. You are given a task, a checklist of numbered "
    "items and the assistant's trajectory (its tool calls, the tool results it saw and its replies). For each "
    "checklist item decide whether the trajectory satisfies it. Judge only from the trajectory; when in doubt, "
    "answer false.\n"
    "Answer with a single JSON object and nothing else, exactly of this form:\n"
    '{"items": [{"index": 0, "satisfied": true}, {"index": 1, "satisfied": false}, ...]}\n'
    "with one entry for every checklist item, its index as shown, and satisfied a JSON boolean."
)


class JudgeError(ValueError):
    """The judge's verdict could not be used (malformed, incomplete, ...)."""


def _cut(text: str, n: int = JUDGE_OBS_CHARS) -> str:
    return text if len(text) <= n else text[:n] + f" ...[{len(text) - n} more characters]"


def serialize_trajectory(task: Task, traj: Trajectory) -> str:
    """A readable transcript of the trajectory for a judge: user turns, calls, observations, replies.
    Uses the Act chat (``traj.messages``, system prompt left out) when present, else the steps and the
    task's scripted user turns. Long texts are cut to :data:`JUDGE_OBS_CHARS` characters."""
    lines: list[str] = []
    if traj.messages:
        for m in traj.messages:
            if m.role == "system":
                continue
            if m.role == "assistant":
                for c in m.tool_calls:
                    lines.append(f"[assistant calls] {c.name}({_cut(dumps(c.arguments))})")
                if m.content and not m.tool_calls:
                    lines.append(f"[assistant] {_cut(m.content)}")
            else:
                lines.append(f"[{m.role}] {_cut(m.content)}")
        return "\n".join(lines)
    turn = -1
    for s in traj.steps:
        if s.user_turn != turn and 0 <= s.user_turn < len(task.user_turns):
            turn = s.user_turn
            lines.append(f"[user] {_cut(task.user_turns[turn])}")
        for i, c in enumerate(s.calls):
            lines.append(f"[assistant calls] {c.name}({_cut(dumps(c.arguments))})")
            if i < len(s.observations):
                lines.append(f"[tool] {_cut(dumps(s.observations[i]))}")
        if s.reply is not None:
            lines.append(f"[assistant] {_cut(s.reply)}")
        if s.parse_error is not None:
            lines.append(f"[assistant, unparseable output] {_cut(s.action_text)}")
    return "\n".join(lines)


def judge_prompt(task: Task, traj: Trajectory) -> list[dict[str, str]]:
    """The judge conversation for one trajectory: the checklist (0-based indices) and the transcript."""
    checklist_text = "\n".join(f"{i}. {item.description}" for i, item in enumerate(task.checklist))
    user = (
        "Task (the user's requests):\n" + "\n".join(f"- {_cut(t)}" for t in task.user_turns) + "\n\n"
        f"Checklist:\n{checklist_text}\n\n"
        f"Trajectory:\n{serialize_trajectory(task, traj)}\n\n"
        f"Give the JSON verdict for all {len(task.checklist)} items (indices 0 to {len(task.checklist) - 1})."
    )
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)


def parse_verdict(text: str, n_items: int) -> list[bool]:
    """Parse a judge verdict strictly: the first ``{...}`` JSON object of the text (after removing
    ``<think>...</think>`` blocks) is read with ``json`` (never evaluated) and must be
    ``{"items": [{"index": i, "satisfied": bool}, ...]}`` answering each index 0..n_items-1 exactly once.
    Raises :class:`JudgeError` otherwise."""
    if not isinstance(text, str):
        raise JudgeError(f"judge output is not text: {type(text).__name__}")
    body = _THINK_RE.sub("", text)
    start = body.find("{")
    if start < 0:
        raise JudgeError("no JSON object in the judge output")
    try:
        obj, _ = json.JSONDecoder().raw_decode(body, start)
    except json.JSONDecodeError as e:
        raise JudgeError(f"the first {{...}} block is not valid JSON: {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("items"), list):
        raise JudgeError('verdict must be an object with an "items" list')
    out: list[bool | None] = [None] * n_items
    for it in obj["items"]:
        if not isinstance(it, dict):
            raise JudgeError(f"verdict item is not an object: {it!r:.100}")
        idx, sat = it.get("index"), it.get("satisfied")
        if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < n_items:
            raise JudgeError(f"verdict index {idx!r:.50} is not an integer in [0, {n_items})")
        if not isinstance(sat, bool):
            raise JudgeError(f"verdict for item {idx} is not a boolean: {sat!r:.50}")
        if out[idx] is not None:
            raise JudgeError(f"item {idx} is answered twice")
        out[idx] = sat
    missing = [i for i, v in enumerate(out) if v is None]
    if missing:
        raise JudgeError(f"items {missing} are not answered")
    return [bool(v) for v in out]


@REWARDS.register("checklist_judge")
def checklist_judge(task: Task, traj: Trajectory, ctx: RewardContext) -> RewardResult:
    """Fraction of the task's checklist items (all of them, with or without a rule) that an LLM judge says the
    trajectory satisfies. One ``ctx.judge.chat`` call per trajectory. Any failure (backend exception,
    malformed or incomplete verdict) -> unscored with ``info["judge_error"]``."""
    if ctx.judge is None:
        raise ValueError("the 'checklist_judge' reward needs a judge backend: set RewardContext(judge=...)")
    n = len(task.checklist)
    if n == 0:
        return RewardResult(None, {"unscored": f"task {task.id!r} has no checklist"})
    params = ctx.judge_params or SamplingParams(temperature=0.0, max_new_tokens=JUDGE_MAX_NEW_TOKENS)
    conversation = judge_prompt(task, traj)
    text: Any = None
    try:
        replies = ctx.judge.chat([conversation], params)
        if len(replies) != 1:
            raise JudgeError(f"judge returned {len(replies)} replies for 1 conversation")
        text = replies[0]
        verdict = parse_verdict(text, n)
    except Exception as e:  # noqa: BLE001 - a judge failure is an unscored trajectory, counted, never a crash
        raw = _cut(text, 500) if isinstance(text, str) else None
        return RewardResult(None, {"judge_error": f"{type(e).__name__}: {str(e)[:300]}", "judge_raw": raw})
    return RewardResult(sum(verdict) / n, {"items": [{"index": i, "satisfied": v} for i, v in enumerate(verdict)]})


# --------------------------------------------------------------------------------------------------------
# Grounded reward (runs the REAL environment)
# --------------------------------------------------------------------------------------------------------


def _real_observations(traj: Trajectory) -> list[Any]:
    """The observations a real environment gave during the rollout (real mode, or shadow copies)."""
    real = [o for s in traj.steps for o, src in zip(s.observations, s.sources) if src == "real"]
    return real + [x for s in traj.steps for x in s.shadow if x is not None]


@REWARDS.register("grounded")
def grounded(task: Task, traj: Trajectory, ctx: RewardContext) -> RewardResult:
    """USES THE REAL ENVIRONMENT. The environment's own success check (``score(traj)``): 1 on success, else 0.

    A trajectory that ran in a real environment is scored from that run (``traj.env_outcome``; ``info["scored_in"]``
    = ``"rollout"``, ``n_replayed`` = 0): its calls are never executed twice. A rehearsed trajectory
    (``env_outcome`` None) has its calls replayed, in order, in a fresh real environment of the task
    (:func:`envace.envs.replay`; ``scored_in`` = ``"replay"``); the policy chose later calls after *rehearsed*
    observations and the replay executes them as they were, so a call that only made sense after a hallucinated
    observation fails here, as it would in the world. A replay on an environment with real side effects (MCP)
    without the task's opt-in raises :class:`envace.envs.ReplayNotAllowedError`, as does an environment that
    cannot be built; a crash of the success check -> unscored with ``info["grounded_error"]``."""
    from ..envs import final_outcome, replay

    calls = traj.calls()
    if traj.env_outcome is not None:
        out, scored_in, n_replayed, observations = traj.env_outcome, "rollout", 0, _real_observations(traj)
    else:
        env, observations = replay(task, calls)  # refused for side effects without opt-in; unknown env: raises
        try:
            out = final_outcome(env, traj)
        finally:
            env.close()
        scored_in, n_replayed = "replay", len(calls)
    if "error" in out:  # counted as unscored, with the reason
        return RewardResult(None, {"grounded_error": out["error"], "scored_in": scored_in})
    info = {
        "success": bool(out["success"]),
        "env_reward": float(out["reward"]),
        "details": out["details"],
        "scored_in": scored_in,
        "n_replayed": n_replayed,
        "n_error_obs": sum(is_error_obs(o) for o in observations),
    }
    return RewardResult(1.0 if out["success"] else 0.0, info)


@REWARDS.register("verifiers_rubric")
def verifiers_rubric(task: Task, traj: Trajectory, ctx: RewardContext) -> RewardResult:
    """The task's verifiers rubric (``envace.envs.verifiers_env.rubric_score``) on the trajectory as it stands: its
    ``@vf.reward`` functions (async ones awaited) over the trajectory's messages and observations, real or
    rehearsed; nothing runs in the world. Unscored (None) for a task that is not from a verifiers taskset, or when
    a reward function raised (``info["rubric_error"]``)."""
    if task.env.split(":", 1)[0] != "verifiers":
        return RewardResult(None, {"note": f"task {task.id!r} of environment {task.env!r} has no verifiers rubric"})
    from ..envs.verifiers_env import rubric_score

    try:
        s = rubric_score(task, traj)
    except Exception as e:  # noqa: BLE001 - a failing reward function is an unscored trajectory, counted
        return RewardResult(None, {"rubric_error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"})
    return RewardResult(float(s.reward), {"success": bool(s.success), **s.details})


# --------------------------------------------------------------------------------------------------------
# Composition
# --------------------------------------------------------------------------------------------------------

RewardSpec = str | Sequence[str | Mapping[str, float]] | Mapping[str, float]
DEFAULT_REWARD: dict[str, float] = {"grounded": 0.5, "gold_f1*reply_facts": 0.5}
"""The training default: half the real outcome of the trajectory's calls replayed at the end (``grounded``), half
the gold calls times the real facts stated (partial credit). Full reward only on real success."""
TRAINING_REWARDS: tuple[RewardSpec, ...] = (DEFAULT_REWARD, "grounded")
"""Rewards that give less than full reward to every trajectory the real environment's check fails, on the
adversarial cases and the >= 100 test tasks per built-in suite of tests/test_reward_adversarial.py. Others
(``gold_f1*reply_facts``: the same calls in an order that fails; ``consistent_*``: an evasive reply) can be
maximised without doing the task."""
PRODUCT = "*"  # joins registered reward names into one product term: "gold_f1*reply_facts"


def term_factors(term: str) -> list[str]:
    """The registered rewards a spec term multiplies: ``"gold_f1*reply_facts"`` -> ``["gold_f1", "reply_facts"]``
    (spaces around ``*`` allowed). An unknown name raises, listing the valid ones; a factor twice is an error."""
    factors = [f.strip() for f in term.split(PRODUCT)]
    for f in factors:
        if not f:
            raise ValueError(
                f"reward term {term!r} has an empty factor (write names joined by '*', e.g. 'gold_f1*reply_facts')"
            )
        REWARDS.get(f)  # raises, listing the valid names
    if len(set(factors)) != len(factors):
        raise ValueError(f"reward term {term!r} names a reward twice")
    return factors


def reward_names(spec: RewardSpec) -> set[str]:
    """Every registered reward a spec uses, inside product terms too (e.g. to see whether it needs a judge)."""
    return {f for term in parse_reward_spec(spec) for f in term_factors(term)}


ANCHOR = "grounded"
"""The reward that reads the real outcome: a spec with a positive-weight term that has it as a factor pays full reward
only where the real environment's check passes."""


def unanchored_note(spec: RewardSpec) -> str | None:
    """One line saying that ``spec`` has no component anchored to the real outcome (:data:`ANCHOR`), so that a
    trajectory that fails can earn full reward (``bench/results/reward_audit.md`` counts how often); None when it
    has one. Training with such a spec is allowed (the paper's comparisons and older runs use them) and warned."""
    terms = parse_reward_spec(spec)
    if any(ANCHOR in term_factors(t) and w > 0 for t, w in terms.items()):
        return None
    names = ", ".join(sorted(terms))
    return (
        f"envace: reward {names} has no component anchored to the real outcome ({ANCHOR}): a trajectory that fails can"
        " earn full reward (bench/results/reward_audit.md); the default anchors it"
    )


def parse_reward_spec(spec: RewardSpec) -> dict[str, float]:
    """``"name"`` | ``["a", "b"]`` (weight 1 each) | ``[{"a": 0.5}, {"b": 0.5}]`` | ``{"a": 0.5, "b": 0.5}``
    -> ``{term: weight}``. A term is a registered name or a product ``"a*b"`` of them (:func:`term_factors`);
    names are checked against :data:`REWARDS`; weights must be finite numbers."""
    weights: dict[str, float] = {}

    def add(name: Any, w: Any) -> None:
        if not isinstance(name, str):
            raise ValueError(f"reward name must be a string, got {name!r}")
        name = PRODUCT.join(term_factors(name))  # canonical spelling: "a * b" -> "a*b"
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise ValueError(f"weight of reward {name!r} must be a finite number, got {w!r}")
        if name in weights:
            raise ValueError(f"reward {name!r} appears twice in the spec")
        weights[name] = float(w)

    if isinstance(spec, str):
        add(spec, 1.0)
    elif isinstance(spec, Mapping):
        for k, w in spec.items():
            add(k, w)
    elif isinstance(spec, Sequence):
        for entry in spec:
            if isinstance(entry, str):
                add(entry, 1.0)
            elif isinstance(entry, Mapping):
                for k, w in entry.items():
                    add(k, w)
            else:
                raise ValueError(f"reward spec entries must be names or {{name: weight}}, got {entry!r}")
    else:
        raise ValueError(f"reward spec must be a name, a list or a {{name: weight}} mapping, got {spec!r}")
    if not weights:
        raise ValueError("empty reward spec")
    return weights


def product_reward(factors: Sequence[str]) -> RewardFn:
    """The product of registered rewards: None (unscored) when any factor is None, every factor is computed
    (so each one's info is there). ``info[factor]`` holds each factor's info, ``info["factors"]`` their values,
    ``info["unscored_by"]`` the None ones."""
    fns = {name: REWARDS.get(name) for name in factors}

    def reward(task: Task, traj: Trajectory, ctx: RewardContext) -> RewardResult:
        info: dict[str, Any] = {"factors": {}, "unscored_by": []}
        value: float | None = 1.0
        for name, fn in fns.items():
            res = fn(task, traj, ctx)
            info["factors"][name], info[name] = res.value, res.info
            if res.value is None:
                info["unscored_by"].append(name)
                value = None
            elif value is not None:
                value *= float(res.value)
        return RewardResult(value, info)

    reward.__name__ = PRODUCT.join(factors)
    return reward


def _term_fn(term: str) -> RewardFn:
    factors = term_factors(term)
    return REWARDS.get(factors[0]) if len(factors) == 1 else product_reward(factors)


def make_reward(spec: RewardSpec) -> RewardFn:
    """A reward that is the weighted sum of the terms of ``spec`` (see :func:`parse_reward_spec`); a term is one
    registered reward or a product of them (:func:`product_reward`).

    The value is None (unscored) if any term is None. ``info["components"]`` maps each term to its
    value, ``info["weights"]`` to its weight, ``info["unscored_by"]`` lists the None terms, and
    ``info[term]`` holds each term's own info.
    """
    weights = parse_reward_spec(spec)
    fns = {name: _term_fn(name) for name in weights}

    def reward(task: Task, traj: Trajectory, ctx: RewardContext) -> RewardResult:
        info: dict[str, Any] = {"components": {}, "weights": dict(weights), "unscored_by": []}
        total: float | None = 0.0
        for name, fn in fns.items():
            res = fn(task, traj, ctx)
            info["components"][name] = res.value
            info[name] = res.info
            if res.value is None:
                info["unscored_by"].append(name)
                total = None
            elif total is not None:
                total += weights[name] * float(res.value)
        return RewardResult(total, info)

    reward.__name__ = "reward[" + "+".join(f"{w:g}*{n}" for n, w in weights.items()) + "]"
    return reward


def score_trajectories(
    tasks: Task | Mapping[str, Task], trajs: Sequence[Trajectory], reward_fn: RewardFn, ctx: RewardContext | None = None
) -> dict[str, float]:
    """Score every trajectory: set ``traj.reward`` (None = unscored) and ``traj.reward_info``. ``tasks`` is the task
    of them all (a group), or task id -> task (a batch: training, evaluation). The one scoring loop of envace.

    Returns metrics: ``reward/n``, ``reward/unscored`` (the count of None rewards) and ``reward/mean`` (over
    the scored trajectories; 0 when none is scored).
    """
    ctx = ctx or RewardContext()
    scored: list[float] = []
    for traj in trajs:
        res = reward_fn(tasks if isinstance(tasks, Task) else tasks[traj.task_id], traj, ctx)
        traj.reward = None if res.value is None else float(res.value)
        traj.reward_info = res.info
        if traj.reward is not None:
            scored.append(traj.reward)
    return {
        "reward/n": float(len(trajs)),
        "reward/unscored": float(len(trajs) - len(scored)),
        "reward/mean": sum(scored) / len(scored) if scored else 0.0,
    }
