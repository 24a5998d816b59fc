"""BFCL-v4 single-turn categories (PyPI ``bfcl-eval``) as one-step tasks, scored by BFCL's own AST checker.

The thirteen single-turn categories: non-live ``simple_python``, ``simple_java``, ``simple_javascript``,
``multiple``, ``parallel``, ``parallel_multiple``, ``irrelevance``; live ``live_simple``, ``live_multiple``,
``live_parallel``, ``live_parallel_multiple``, ``live_irrelevance``, ``live_relevance`` (3,641 entries).

How a task is built and scored, and where this departs from BFCL's own harness:

- **Tools** are the entry's function docs as BFCL shows them to a function-calling model (``load_dataset_entry``
  with its language hints: every Java / JavaScript parameter becomes a string, "This is Java long type parameter
  in string representation."), converted to JSON schema by :func:`envace.envs.bfcl.multi_turn.tool_spec`.
- **One response is scored.** BFCL asks once and checks the calls of that one answer. Here the episode is an
  ordinary trajectory, but only the calls of its **first Act generation** are scored; what Act does after it
  (it sees :data:`ACK` for each valid call: nothing is executed) is not. Several calls in that generation are
  BFCL's parallel calls.
- **The checker** is BFCL's ``ast_checker`` (its code unchanged) on those calls in BFCL's decoded form
  ``[{name: arguments}]``, with the entry's function docs as BFCL's evaluator loads them (no hints), the
  possible answers and the category's language: Java / JavaScript values are strings that BFCL's type converters
  read (``"5L"``, ``"new ArrayList<>(Arrays.asList(...))"``, ``"[1, 2]"``). **Relevance / irrelevance** follow
  BFCL's rule: ``irrelevance`` passes when the response makes no call (a text reply or output that does not
  parse), ``relevance`` when it makes at least one. Nothing the model wrote is executed or ``eval``-ed.
- **Failures are scores, never crashes.** A call with wrong argument types fails with BFCL's error type
  (``type_error:simple``, ``type_error:java``, ...) in ``Score.details``; output that does not parse fails with
  ``ast_decoder:decoder_failed`` (BFCL's type for undecodable output); an exception inside BFCL's checker (its
  Java collection parsers raise on some strings) fails with ``checker_exception``.
- **No response** (a trajectory cut before its first Act generation) fails in every category
  (``inference_error``), irrelevance included, where BFCL would count an inference failure as "no call".
- **The checker's model table.** ``ast_checker`` imports BFCL's model table, and that import pulls every
  vendor SDK (anthropic, ...), which envace's pinned set does not install. :func:`load_private` loads a private
  copy of a BFCL module (code unchanged) that sees a one-row table instead; the row (:data:`MODEL_NAME`) keeps
  dots in function names, as our tool names do.
- **Gold calls** (``task.gold_actions``): per parameter of the possible answer, an optional one that may be left
  out (an option ``""``) is left out, else its first option other than ``""`` is sent (:func:`choose_option`;
  the keys of a dict value likewise); Java / JavaScript values are written as the literals BFCL's converters
  read (:data:`LITERALS`). Irrelevance: no call. Relevance: BFCL
  has no answer (any call passes), so the gold is empty and gold replay does not apply.
- **Conversation**: an entry's system messages follow the system prompt; the few ``live_irrelevance`` entries
  with earlier assistant turns show the conversation as a transcript in one user turn.
- **Split**: ``test`` when a hash of the entry id falls in the lowest :data:`TEST_FRACTION`, as
  :func:`envace.envs.bfcl.multi_turn.split_of` does for multi-turn scenarios.
- **References**: none (nothing is executed, so there is no recorded result to show Rehearse).
- **Rehearsal and test-time rehearsal** run as on any task: an attempt's call is answered by Rehearse with an
  imagined result and Act goes on; reflections and the memory see those attempts. The real run is scored on its
  first Act generation, which the rehearsal memory (in Act's system prompt) can change; an imagined result
  comes only after the scored response.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable

from . import multi_turn  # noqa: F401 - sets BFCL_PROJECT_ROOT before bfcl_eval is first imported

from bfcl_eval.constants.category_mapping import SINGLE_TURN_CATEGORY  # noqa: E402
from bfcl_eval.constants.default_prompts import PROMPT_STYLE_TEMPLATES  # noqa: E402
from bfcl_eval.constants.enums import Language  # noqa: E402
from bfcl_eval.utils import (  # noqa: E402
    is_empty_output,
    is_java,
    is_js,
    is_relevance_or_irrelevance,
    load_dataset_entry,
    load_ground_truth_entry,
)

from ...chat.parsing import render_act
from ...core.types import Step, Task, ToolCall, Trajectory  # noqa: E402
from ..base import Environment, Score  # noqa: E402
from ..references import digest  # noqa: E402
from ..suites import hash_split  # noqa: E402

CATEGORIES: tuple[str, ...] = tuple(SINGLE_TURN_CATEGORY)
TEST_FRACTION = 0.3
SPLITS: tuple[str, ...] = ("train", "test", "all")
ACK = {"status": "recorded", "note": "single-turn task: the calls of the first response are scored, not executed"}
MODEL_NAME = "envace"
"""The one row of the model table that :func:`load_private` gives BFCL's checker and leaderboard code."""

_STYLE = PROMPT_STYLE_TEMPLATES["classic"]
SYSTEM_PROMPT = f"{_STYLE['persona']} {_STYLE['task']}"


# ------------------------------------------------------------------------------- BFCL's code, privately


@dataclass(frozen=True)
class ModelRow:
    """The fields of BFCL's ``ModelConfig`` that its checker and leaderboard code read, for :data:`MODEL_NAME`."""

    model_name: str = MODEL_NAME
    display_name: str = MODEL_NAME
    url: str = ""
    org: str = ""
    license: str = ""
    model_handler: Any = None
    input_price: float | None = None
    output_price: float | None = None
    is_fc_model: bool = True
    underscore_to_dot: bool = False  # tool names keep their dots (``math.factorial``), as in our tool specs


_MODEL_TABLE = "bfcl_eval.constants.model_config"


def load_private(module_name: str) -> types.ModuleType:
    """A private copy of the bfcl_eval module ``module_name``, its code unchanged, whose import of BFCL's model
    table (``MODEL_CONFIG_MAPPING``, which pulls every vendor SDK) gets ``{MODEL_NAME: ModelRow()}`` instead.
    The copy is not entered in ``sys.modules``; BFCL's own module, if anyone imports it, is untouched."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        raise ImportError(f"bfcl_eval has no module {module_name!r}")
    private = importlib.util.spec_from_file_location(f"envace._bfcl_private.{module_name}", spec.origin)
    assert private is not None and private.loader is not None
    module = importlib.util.module_from_spec(private)
    table = types.ModuleType(_MODEL_TABLE)
    table.MODEL_CONFIG_MAPPING = {MODEL_NAME: ModelRow()}  # type: ignore[attr-defined]
    saved = sys.modules.get(_MODEL_TABLE)
    sys.modules[_MODEL_TABLE] = table
    try:
        private.loader.exec_module(module)
    finally:
        if saved is None:
            sys.modules.pop(_MODEL_TABLE, None)
        else:
            sys.modules[_MODEL_TABLE] = saved
    return module


@functools.lru_cache(maxsize=None)
def _ast() -> types.ModuleType:
    return load_private("bfcl_eval.eval_checker.ast_eval.ast_checker")


def language_of(category: str) -> Language:
    """The language BFCL's checker reads a category's values in (as its ``ast_file_runner`` picks it)."""
    return Language.JAVA if is_java(category) else Language.JAVASCRIPT if is_js(category) else Language.PYTHON


# ------------------------------------------------------------------------------------------- scoring


def model_output(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Calls in BFCL's decoded form, ``[{name: arguments}, ...]`` (what its FC handlers' ``decode_ast`` returns)."""
    return [{c.name: copy.deepcopy(c.arguments)} for c in calls]


def _failed(checker: str, error_type: str, error: Any, **extra: Any) -> Score:
    return Score(
        False, 0.0, {"checker": checker, "valid": False, "error_type": error_type, "error": _text(error), **extra}
    )


def _text(x: Any, limit: int = 500) -> str:
    s = x if isinstance(x, str) else json.dumps(x, default=str, ensure_ascii=False)
    return s[:limit]


def score_response(
    category: str,
    functions: list[dict],
    ground_truth: Any,
    calls: list[ToolCall] | None,
    parse_error: str | None = None,
) -> Score:
    """Score one response of a single-turn task: ``calls`` its parsed calls (None: there was no response at
    all), ``parse_error`` why its text did not parse (then ``calls`` is empty). Relevance categories use BFCL's
    rule, the others BFCL's ``ast_checker`` with ``functions`` (BFCL's docs, no hints) and ``ground_truth``."""
    relevance = is_relevance_or_irrelevance(category)
    checker = "bfcl.relevance" if relevance else "bfcl.ast_checker"
    if calls is None:
        return _failed(checker, "inference_error", "no Act generation: the trajectory ended before its first response")
    output = model_output(calls)
    if relevance:
        made_call = parse_error is None and not is_empty_output(output)
        if "irrelevance" in category:
            ok, error_type, error = (
                not made_call,
                "irrelevance_error:decoder_success",
                "Valid syntax. Successfully decode AST when it should not.",
            )
        else:
            ok, error_type, error = (
                made_call,
                "relevance_error:decoder_failed",
                f"Invalid syntax. Failed to decode AST when it should have. {parse_error or ''}".strip(),
            )
        return Score(True, 1.0, {"checker": checker, "valid": True}) if ok else _failed(checker, error_type, error)
    if parse_error is not None:
        return _failed(checker, "ast_decoder:decoder_failed", f"Invalid syntax. Failed to decode AST. {parse_error}")
    try:
        result = _ast().ast_checker(
            copy.deepcopy(functions), output, copy.deepcopy(ground_truth), language_of(category), category, MODEL_NAME
        )
    except Exception as e:  # noqa: BLE001 - BFCL's converters raise on some model strings: a failed check, not a crash
        return _failed(checker, "checker_exception", f"{type(e).__name__}: {str(e)[:300]}")
    if result.get("valid"):
        return Score(True, 1.0, {"checker": checker, "valid": True})
    return _failed(checker, str(result.get("error_type", "")), result.get("error", ""))


def first_response(traj: Trajectory) -> tuple[list[ToolCall] | None, str | None]:
    """The calls of a trajectory's first Act generation and, if it did not parse, why (None, None: no generation)."""
    if not traj.steps:
        return None, None
    step = traj.steps[0]
    if step.parse_error is not None:
        err = step.parse_error.get("error", {}) if isinstance(step.parse_error, dict) else {}
        return [], str(err.get("message", step.parse_error))
    return list(step.calls), None


class BFCLSingleEnv(Environment):
    """One BFCL single-turn task: calls are validated and acknowledged (:data:`ACK`), never executed; the
    trajectory's first response is scored (:func:`score_response`)."""

    def _execute(self, call: ToolCall) -> Any:
        return dict(ACK)

    def state(self) -> dict[str, Any]:
        return {}

    @staticmethod
    def initial_state_key(task: Task) -> str:
        return digest({"env": "bfcl-single-turn"})  # no state: every task starts from the same (empty) one

    def score(self, traj: Trajectory) -> Score:
        cfg = self.task.env_config
        calls, parse_error = first_response(traj)
        return score_response(cfg["category"], cfg["function"], cfg.get("ground_truth"), calls, parse_error)


def replay_gold(task: Task) -> Score | None:
    """The task's gold as its first response (its calls in one generation, or a text reply when the gold makes
    none), run through a fresh environment and scored; None for a relevance task (BFCL has no answer)."""
    if not task.gold_actions:
        return None
    env = BFCLSingleEnv(task)
    calls = list(task.gold_actions[0])
    if calls:
        step = Step(
            user_turn=0,
            action_text=render_act(calls),
            calls=calls,
            observations=[env.call(c) for c in calls],
            sources=["real"] * len(calls),
        )
    else:
        step = Step(user_turn=0, action_text=NO_CALL_REPLY, reply=NO_CALL_REPLY)
    return env.score(Trajectory(id=f"{task.id}/gold", task_id=task.id, group_id="gold", mode="real", steps=[step]))


NO_CALL_REPLY = "None of the functions can be used for this request."


# ------------------------------------------------------------------------------------- gold literals


def _java_element(value: Any, items: str | None, container: str) -> str:
    """An element as BFCL's Java collection parsers read it: an ArrayList strips the quotes of String / char
    elements; other typed elements go through ``java_type_converter`` (raw); untyped ones (HashMap values too)
    through ``parse_java_value`` (strings quoted)."""
    if isinstance(value, str):
        if items is None or (container == "ArrayList" and items in ("String", "char")):
            return f"'{value}'" if items == "char" else f'"{value}"'
        return value
    return java_literal(value, items or "")


_JAVA_ELEMENT_TYPES = {
    "integer": "int",
    "long": "long",
    "float": "float",
    "double": "double",
    "boolean": "boolean",
    "char": "char",
    "byte": "byte",
    "short": "short",
    "String": "String",
}


def java_literal(value: Any, type_name: str, items: str | None = None) -> str:
    """A value as the Java literal string BFCL's ``java_type_converter`` reads back (a string stays as it is)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if type_name == "long" and isinstance(value, int):
        return f"{value}L"
    if type_name == "float" and isinstance(value, (int, float)):
        return f"{float(value)!r}f"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list) and type_name == "ArrayList":
        inner = ", ".join(_java_element(v, items, "ArrayList") for v in value)
        return f"new ArrayList<>(Arrays.asList({inner}))" if value else "new ArrayList<>()"
    if isinstance(value, list):
        inner = ", ".join(_java_element(v, items, "Array") for v in value)
        return f"new {_JAVA_ELEMENT_TYPES.get(items or '', 'Object')}[]{{{inner}}}"
    if isinstance(value, dict):
        puts = " ".join(f'put("{k}", {_java_element(v, None, "HashMap")});' for k, v in value.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
    return str(value)


def _js_number(value: int | float) -> str:
    s = repr(value)
    return format(value, "f") if "e" in s.lower() else s


def _js_element(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    return js_literal(value, "")


def js_literal(value: Any, type_name: str, items: str | None = None) -> str:
    """A value as the JavaScript literal string BFCL's ``js_type_converter`` reads back (a string stays as it is)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if type_name == "Bigint" and isinstance(value, int):
        return f"{value}n"
    if isinstance(value, (int, float)):
        return _js_number(value)
    if isinstance(value, list):
        return "[" + ", ".join(_js_element(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f'"{k}": {_js_element(v)}' for k, v in value.items()) + "}"
    return str(value)


def _python_literal(value: Any, type_name: str, items: str | None = None) -> Any:
    return value


# language -> (value, BFCL type, BFCL item type) -> the argument value a model should send
LITERALS: dict[Language, Callable[[Any, str, str | None], Any]] = {
    Language.PYTHON: _python_literal,
    Language.JAVA: java_literal,
    Language.JAVASCRIPT: js_literal,
}
_DICT_TYPES = ("dict", "HashMap", "Hashtable")


def choose_option(options: Any, required: bool) -> tuple[bool, Any]:
    """(send it, value) for one parameter's possible values: an optional parameter that may be left out (an option
    ``""``) is left out; otherwise the first option that is not ``""`` (``""`` itself when there is none)."""
    if not isinstance(options, list):
        return True, options  # not BFCL's list form (a data quirk): sent as it stands
    if not options or ("" in options and not required):
        return False, None
    return True, next((o for o in options if o != ""), "")


def _first_options(options: dict[str, Any]) -> dict[str, Any]:
    """A possible answer's dict value (key -> options) as one dict, each key chosen by :func:`choose_option`
    (BFCL's dict checker lets a key with an option ``""`` be left out)."""
    chosen = {k: choose_option(opts, required=False) for k, opts in options.items()}
    return {k: v for k, (send, v) in chosen.items() if send}


def gold_value(option: Any, schema: dict[str, Any], language: Language) -> Any:
    """One possible value of a parameter (BFCL's possible-answer form) as the value a model sends."""
    type_name = str(schema.get("type", ""))
    items = (schema.get("items") or {}).get("type") if isinstance(schema.get("items"), dict) else None
    if isinstance(option, dict) and type_name in _DICT_TYPES:
        option = _first_options(option)
    elif isinstance(option, list) and items in _DICT_TYPES and all(isinstance(x, dict) for x in option):
        option = [_first_options(x) for x in option]
    return LITERALS[language](option, type_name, items)


def gold_calls(
    ground_truth: list[dict[str, dict[str, list]]], functions: list[dict], language: Language
) -> list[ToolCall]:
    """BFCL's possible answer of one entry (``[{name: {param: [options]}}]``) as calls, each parameter chosen by
    :func:`choose_option` and written for ``language``."""
    docs = {f["name"]: f for f in functions}
    calls = []
    for item in ground_truth:
        ((name, params),) = item.items()
        schema = (docs.get(name) or {}).get("parameters", {})
        props, required = schema.get("properties", {}), set(schema.get("required", []))
        args = {}
        for p, opts in params.items():
            send, option = choose_option(opts, p in required)
            if send:
                args[p] = gold_value(option, props.get(p, {}), language)
        calls.append(ToolCall(name=name, arguments=args))
    return calls


# -------------------------------------------------------------------------------------------- tasks


def split_of(bfcl_id: str) -> str:
    """``test`` for about :data:`TEST_FRACTION` of the entries (hash of the entry id), else ``train``."""
    return hash_split(f"bfcl-single-turn-{bfcl_id}", TEST_FRACTION)


@functools.lru_cache(maxsize=None)
def _raw(category: str) -> tuple[list[dict], list[dict], list[Any] | None]:
    """(entries as shown to the model, entries as BFCL's evaluator loads them, possible answers or None)."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL single-turn category {category!r}; valid: {', '.join(CATEGORIES)}")
    shown = load_dataset_entry(category)
    checked = load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)
    answers = None
    if not is_relevance_or_irrelevance(category):
        answers = [g["ground_truth"] for g in load_ground_truth_entry(category)]  # aligned by index, as BFCL does
        if len(answers) != len(shown):
            raise ValueError(f"{category}: {len(answers)} possible answers for {len(shown)} entries")
    if [e["id"] for e in shown] != [e["id"] for e in checked]:
        raise ValueError(f"{category}: the two loads of the dataset disagree")
    return shown, checked, answers


def _conversation(messages: list[dict[str, str]]) -> tuple[str, str]:
    """(system text, the one user turn) of an entry's messages: system messages apart; user messages joined, or
    a transcript when the conversation already has assistant turns."""
    system = "\n\n".join(m["content"] for m in messages if m.get("role") == "system")
    rest = [m for m in messages if m.get("role") != "system"]
    if all(m.get("role") == "user" for m in rest):
        return system, "\n\n".join(m["content"] for m in rest)
    return system, "\n".join(f"{m.get('role')}: {m['content']}" for m in rest)


def convert_entry(shown: dict[str, Any], checked: dict[str, Any], ground_truth: Any, category: str) -> Task:
    """One BFCL single-turn entry (shown to the model / as BFCL checks it) and its possible answer -> Task."""
    language = language_of(category)
    (messages,) = shown["question"]  # single-turn: one turn
    system, user = _conversation(messages)
    if "relevance" in category and "irrelevance" not in category:
        gold, note = [], "none: BFCL has no answer for relevance entries (any call passes)"
    elif "irrelevance" in category:
        gold, note = [[]], "no call"
    else:
        gold, note = (
            [gold_calls(ground_truth, checked["function"], language)],
            "the possible answer, one option per parameter (choose_option)",
        )
    return Task(
        id=shown["id"],
        env=f"bfcl:{category}",
        system_prompt=SYSTEM_PROMPT + (f"\n\n{system}" if system else ""),
        user_turns=[user],
        tools=[multi_turn.tool_spec(d) for d in shown["function"]],
        env_config={
            "bfcl_id": shown["id"],
            "category": category,
            "function": copy.deepcopy(checked["function"]),
            "ground_truth": copy.deepcopy(ground_truth),
        },
        gold_actions=gold,
        split=split_of(shown["id"]),
        metadata={
            "source": "bfcl-eval",
            "category": category,
            "single_turn": True,
            "max_steps": 1,
            "language": language.value,
            "gold": note,
        },
    )


def entry_ids(category: str, split: str) -> list[str]:
    """The ids of a category's entries in ``split`` (train / test / all), in dataset order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for BFCL; valid: {', '.join(SPLITS)}")
    return [e["id"] for e in _raw(category)[0] if split == "all" or split_of(e["id"]) == split]


def load_category(category: str, ids: list[str] | None = None) -> list[Task]:
    """The category's tasks (those of ``ids``, in dataset order; None: all)."""
    shown, checked, answers = _raw(category)
    keep = None if ids is None else set(ids)
    return [
        convert_entry(s, c, None if answers is None else answers[i], category)
        for i, (s, c) in enumerate(zip(shown, checked))
        if keep is None or s["id"] in keep
    ]
