"""BFCL-v4 multi-turn (PyPI ``bfcl-eval``) as real environments.

The four multi-turn categories (``multi_turn_base``, ``multi_turn_miss_func``, ``multi_turn_miss_param``,
``multi_turn_long_context``; 200 tasks each) ship in the wheel with their tool docs, their executable Python
backends (file system, trading bot, travel booking, messaging, ...) and the official checker.

How this adapter departs from BFCL's own harness, and why:

- **No ``eval``.** BFCL executes a call by ``eval``-ing a Python call string. Here a call is always built
  from the parsed JSON name and arguments and run as ``getattr(instance, name)(**arguments)`` on the task's
  backend instances. The dataset's gold answers (Python call strings) are parsed with :mod:`ast`, literals
  only, and positional arguments are mapped to parameter names through the backend method's signature.
- **The official checker, with a safe executor.** :func:`score_turns` runs BFCL's own ``multi_turn_checker``
  code (turn loop, empty-turn check, ``state_checker``, ``response_checker``) with its call executor swapped
  for :class:`_SafeExecutor`, which executes :class:`ToolCall` objects as above, formats results exactly as
  BFCL does, and keeps its instances in a per-scoring store instead of BFCL's never-freed module globals.
- **Held-out tools** (``multi_turn_miss_func``): BFCL adds some tools at a later turn. ``task.tools`` holds all
  tools (the rollout shows one list); ``task.metadata["held_out_tools"]`` (``[{"turn": t, "tools": [...]}]``)
  and ``task.metadata["tools_by_turn"]`` say which are announced when. The turn that announces them carries
  BFCL's own message ("I have updated some more functions you can choose from. What about now?").
- **Errors as observations.** A backend result ``{"error": "..."}`` is returned as a ``tool_error``
  observation; the checker still sees BFCL's own result strings.
- **Split.** BFCL has no train/test split: a task is ``test`` when a hash of its scenario index falls in the
  lowest :data:`TEST_FRACTION` (about 30%), else ``train``. The index is shared by the four categories (they
  are variants of the same 200 scenarios), so a scenario is on the same side in every category.
- **Registration**: the suite name ``bfcl`` and the environment factory of every BFCL task are
  :mod:`envace.envs.bfcl.v4`'s, which also serves the single-turn categories; ``bfcl`` alone still means
  these four categories, loaded as :func:`load_bfcl_tasks` does.
- **References** (BFCL has none): the gold calls of :data:`POOL_TASKS` train tasks of the category (evenly
  spread over it), run in order in a fresh environment of their task, form the category's pool; every task
  draws 1-3 records of its tools from it, never one of its own gold calls (:mod:`envace.envs.references`).
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import inspect
import json
import os
import random
import types
from pathlib import Path
from typing import Any


def _default_project_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "envace", "bfcl")


# bfcl-eval creates result/score/lock folders under BFCL_PROJECT_ROOT when imported (default: next to
# site-packages); point it at a writable cache folder before the first import.
os.environ.setdefault("BFCL_PROJECT_ROOT", _default_project_root())
Path(os.environ["BFCL_PROJECT_ROOT"]).mkdir(parents=True, exist_ok=True)

from bfcl_eval.constants.default_prompts import (  # noqa: E402
    DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC,
    PROMPT_STYLE_TEMPLATES,
)
from bfcl_eval.constants.eval_config import POSSIBLE_ANSWER_PATH  # noqa: E402
from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES  # noqa: E402
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as _checker_module  # noqa: E402
from bfcl_eval.utils import load_dataset_entry, load_file  # noqa: E402

from ...core.types import Task, ToolCall, ToolSpec, Trajectory, error_obs  # noqa: E402
from ..base import Environment, Score  # noqa: E402
from ..references import ReferencePool, assign, cached_pool, digest, record_sequence, spread  # noqa: E402
from ..suites import hash_split  # noqa: E402

CATEGORIES: tuple[str, ...] = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
TEST_FRACTION = 0.3
POOL_TASKS = 64  # train tasks per category (spread over it) whose recorded gold calls are its reference pool
SPLITS: tuple[str, ...] = ("train", "test", "all")
# Method names BFCL's executor refuses to run (kept so that scoring matches the official harness).
_BLOCKED_METHODS = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})

_STYLE = PROMPT_STYLE_TEMPLATES["classic"]
SYSTEM_PROMPT = f"{_STYLE['persona']} {_STYLE['task']}\n\n{_STYLE['multiturn_behavior']}"


# ----------------------------------------------------------------------------------------------- schemas

# BFCL's doc types -> JSON-schema types. None means "any type": the "type" key is dropped.
_TYPE_MAP: dict[str, str | None] = {
    "dict": "object",
    "object": "object",
    "float": "number",
    "number": "number",
    "double": "number",
    "integer": "integer",
    "int": "integer",
    "long": "integer",
    "string": "string",
    "str": "string",
    "char": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "tuple": "array",
    "arraylist": "array",
    "null": "null",
    "none": "null",
    "any": None,
}


def normalize_schema(schema: Any) -> Any:
    """Turn a BFCL parameter doc into valid JSON schema (``dict`` -> ``object``, ``float`` -> ``number``,
    ``tuple`` -> ``array``, ``any`` -> no type constraint, ...), recursively."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            names = value if isinstance(value, list) else [value]
            mapped = [_TYPE_MAP.get(str(t).lower(), "string" if t is None else None) for t in names]
            if None in mapped:
                continue  # unknown or "any": leave the type open
            uniq = list(dict.fromkeys(mapped))
            out["type"] = uniq[0] if len(uniq) == 1 else uniq
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: normalize_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = normalize_schema(value)
        elif key in ("anyOf", "oneOf", "allOf") and isinstance(value, list):
            out[key] = [normalize_schema(sub) for sub in value]
        else:
            out[key] = value
    return out


def tool_spec(func_doc: dict[str, Any]) -> ToolSpec:
    params = normalize_schema(func_doc.get("parameters") or {})
    params["type"] = "object"
    params.setdefault("properties", {})
    return ToolSpec(name=func_doc["name"], description=func_doc.get("description", ""), parameters=params)


# -------------------------------------------------------------------------------------------- backends


def _backend_class(class_name: str) -> type:
    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)


def _public_methods(cls: type) -> list[str]:
    return [n for n, m in inspect.getmembers(cls, predicate=inspect.isfunction) if not n.startswith("_")]


def _method_owners(involved_classes: list[str]) -> dict[str, str]:
    """method name -> class name; a later class wins a shared name, as in BFCL's executor."""
    owners: dict[str, str] = {}
    for class_name in involved_classes:
        for name in _public_methods(_backend_class(class_name)):
            owners[name] = class_name
    return owners


def make_instances(env_config: dict[str, Any]) -> dict[str, Any]:
    """Fresh backend instances of one task, loaded with its initial state (as BFCL's executor does)."""
    instances = {}
    for class_name in env_config["involved_classes"]:
        inst = _backend_class(class_name)()
        if class_name not in STATELESS_CLASSES:
            inst._load_scenario(
                copy.deepcopy(env_config["initial_config"].get(class_name, {})),
                long_context=bool(env_config.get("long_context")),
            )
        instances[class_name] = inst
    return instances


class _UnknownMethod(Exception):
    pass


def invoke(instances: dict[str, Any], call: ToolCall) -> Any:
    """Run one call on the task's backend instances: a bound method called with keyword arguments
    (deep-copied, so the backend never aliases the caller's data). Nothing is evaluated."""
    owner = None
    if isinstance(call.name, str) and not call.name.startswith("_"):
        for class_name, inst in instances.items():  # last class wins, as in BFCL
            if callable(getattr(type(inst), call.name, None)) and inspect.isfunction(getattr(type(inst), call.name)):
                owner = class_name
    if owner is None:
        raise _UnknownMethod(f"name '{call.name}' is not defined")
    if call.name in _BLOCKED_METHODS:
        raise PermissionError(f"Function call {call.name} is not allowed.")
    if not isinstance(call.arguments, dict) or not all(isinstance(k, str) for k in call.arguments):
        raise TypeError("arguments must be a mapping of parameter names to values")
    return getattr(instances[owner], call.name)(**copy.deepcopy(call.arguments))


def format_result(value: Any) -> str:
    """An execution result as BFCL's executor records it (the form its response checker compares)."""
    if type(value) == str:  # noqa: E721 - BFCL tests the exact type
        return value
    if type(value) == dict:  # noqa: E721
        try:
            return json.dumps(value)
        except Exception:  # noqa: BLE001 - BFCL falls back to str() for anything json cannot write
            return str(value)
    return str(value)


def _jsonable(x: Any, path: tuple[int, ...] = (), depth: int = 0) -> Any:
    """A JSON snapshot of backend state: objects become dicts of their public attributes; back-references
    (a directory's parent) become ``"<cycle>"``; private attributes (``_random``, timestamps) are left out."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if id(x) in path or depth > 50:
        return "<cycle>"
    path = path + (id(x),)
    if isinstance(x, dict):
        return {str(k): _jsonable(v, path, depth + 1) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v, path, depth + 1) for v in x]
    if isinstance(x, (set, frozenset)):
        return sorted(
            (_jsonable(v, path, depth + 1) for v in x), key=lambda v: json.dumps(v, sort_keys=True, default=str)
        )
    if hasattr(x, "__dict__"):
        attrs = {k: v for k, v in vars(x).items() if not k.startswith("_") and k != "parent"}
        return {"__class__": type(x).__name__, **{k: _jsonable(v, path, depth + 1) for k, v in attrs.items()}}
    return str(x)


# -------------------------------------------------------------------------------------------- gold calls


def parse_gold_call(text: str, owners: dict[str, str]) -> ToolCall:
    """Parse one dataset gold answer (``"mv(source='a', destination='b')"`` or ``"sort('a.txt')"``) into a
    :class:`ToolCall`: :mod:`ast` parsing, ``ast.literal_eval`` on each argument node (literals only), positional
    arguments named through the backend method's signature."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"gold answer is not a plain function call: {text!r}")
    name = node.func.id
    args: dict[str, Any] = {}
    if node.args:
        if name not in owners:
            raise ValueError(f"gold answer calls unknown function {name!r}: {text!r}")
        params = [
            p
            for p in inspect.signature(getattr(_backend_class(owners[name]), name)).parameters.values()
            if p.name != "self"
        ]
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(node.args) > len(positional):
            raise ValueError(f"too many positional arguments in gold answer {text!r}")
        for p, a in zip(positional, node.args):
            args[p.name] = _json_literal(ast.literal_eval(a))
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError(f"gold answer uses **kwargs: {text!r}")
        args[kw.arg] = _json_literal(ast.literal_eval(kw.value))
    return ToolCall(name=name, arguments=args)


def _json_literal(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_json_literal(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_literal(x) for k, x in v.items()}
    if isinstance(v, (set, frozenset, bytes, complex)):
        raise ValueError(f"gold argument {v!r} has no JSON form")
    return v


# -------------------------------------------------------------------------------------------- scoring


class _SafeExecutor:
    """Drop-in for BFCL's ``execute_multi_turn_func_call`` that takes :class:`ToolCall` objects instead of
    strings, runs them through :func:`invoke`, and keeps its instances per ``model_name`` in its own store
    (one executor per scoring run, so nothing leaks into module globals)."""

    def __init__(self) -> None:
        self.store: dict[str, dict[str, Any]] = {}

    def __call__(
        self,
        func_call_list: list[ToolCall],
        initial_config: dict,
        involved_classes: list,
        model_name: str,
        test_entry_id: str,
        long_context: bool = False,
        is_evaL_run: bool = False,
    ) -> tuple[list[str], dict]:
        key = model_name + ("_eval" if is_evaL_run else "")
        if key not in self.store:
            self.store[key] = make_instances(
                {"initial_config": initial_config, "involved_classes": involved_classes, "long_context": long_context}
            )
        instances = self.store[key]
        results = []
        for call in func_call_list:
            try:
                results.append(format_result(invoke(instances, call)))
            except Exception as e:  # noqa: BLE001 - BFCL records every failure as a result string
                results.append(f"Error during execution: {str(e)}")
        return results, dict(instances)


def _official_checker(executor: _SafeExecutor) -> Any:
    """BFCL's ``multi_turn_checker`` function, its code unchanged, with the call executor swapped."""
    fn = _checker_module.multi_turn_checker
    glb = dict(fn.__globals__)
    glb["execute_multi_turn_func_call"] = executor
    return types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, fn.__closure__)


def score_turns(task: Task, turns: list[list[list[ToolCall]]], force_terminated: bool = False) -> Score:
    """Score the calls of a trajectory, ``turns[i][j]`` = the calls of step j of turn i, with the official
    checker against the task's ground truth (re-executed in fresh backends)."""
    cfg = task.env_config
    gold = task.gold_actions
    if force_terminated or len(turns) != len(gold):
        return Score(
            False,
            0.0,
            {
                "checker": "bfcl.multi_turn_checker",
                "error_type": "multi_turn:force_terminated",
                "error_message": f"the trajectory covered {len(turns)} of {len(gold)} turns or was cut",
            },
        )
    entry = {"id": cfg["bfcl_id"], "initial_config": cfg["initial_config"], "involved_classes": cfg["involved_classes"]}
    checker = _official_checker(_SafeExecutor())
    try:
        result = checker(turns, gold, entry, cfg["category"], "envace")
    except Exception as e:  # noqa: BLE001 - visible in the details, not a crash of the rollout
        return Score(
            False,
            0.0,
            {
                "checker": "bfcl.multi_turn_checker",
                "error_type": "checker_exception",
                "error_message": f"{type(e).__name__}: {str(e)[:300]}",
            },
        )
    valid = bool(result.get("valid"))
    details = {"checker": "bfcl.multi_turn_checker", "valid": valid}
    if not valid:
        details["error_type"] = result.get("error_type", "")
        details["error_message"] = str(result.get("error_message", ""))[:500]
    return Score(valid, 1.0 if valid else 0.0, details)


def trajectory_turns(task: Task, traj: Trajectory) -> tuple[list[list[list[ToolCall]]], bool]:
    """Group a trajectory's calls by user turn and step (BFCL's decoded-result layout); the flag says whether
    the episode was cut before its last turn (BFCL's "force terminated")."""
    n = len(task.user_turns)
    turns: list[list[list[ToolCall]]] = [[] for _ in range(n)]
    reached = -1
    for step in traj.steps:
        if 0 <= step.user_turn < n:
            reached = max(reached, step.user_turn)
            if step.calls:
                turns[step.user_turn].append(list(step.calls))
    return turns, traj.truncated is not None or reached < n - 1


# -------------------------------------------------------------------------------------------- environment


def execute(instances: dict[str, Any], call: ToolCall) -> Any:
    """One call on backend instances as an observation: wrong names, blocked methods and wrong arguments become
    error observations; a backend's own ``{"error": "..."}`` result a ``tool_error``."""
    try:
        result = invoke(instances, call)
    except _UnknownMethod as e:
        return error_obs("unknown_tool", str(e))
    except PermissionError as e:
        return error_obs("tool_error", str(e))
    except TypeError as e:  # wrong / missing keyword arguments
        return error_obs("bad_arguments", str(e)[:300])
    if isinstance(result, dict) and set(result) == {"error"} and isinstance(result["error"], str):
        return error_obs("tool_error", result["error"])
    return result


def instances_state(instances: dict[str, Any]) -> dict[str, Any]:
    """A JSON snapshot of backend instances: each one's public attributes (BFCL's state log shows the same)."""
    return {
        name: _jsonable({k: v for k, v in vars(inst).items() if not k.startswith("_")})
        for name, inst in instances.items()
    }


class BFCLEnv(Environment):
    """One BFCL multi-turn task: its backend instances, loaded with the task's initial state."""

    def __init__(self, task: Task):
        super().__init__(task)
        self.instances = make_instances(task.env_config)

    @staticmethod
    def initial_state_key(task: Task) -> str:
        """What the backends are loaded from (see :func:`make_instances`)."""
        cfg = task.env_config
        return digest(
            {
                "env": "bfcl",
                "initial_config": cfg["initial_config"],
                "involved_classes": cfg["involved_classes"],
                "long_context": bool(cfg.get("long_context")),
            }
        )

    def _execute(self, call: ToolCall) -> Any:
        return execute(self.instances, call)

    def state(self) -> dict[str, Any]:
        return instances_state(self.instances)

    def score(self, traj: Trajectory) -> Score:
        turns, cut = trajectory_turns(self.task, traj)
        return score_turns(self.task, turns, force_terminated=cut)


# -------------------------------------------------------------------------------------------- tasks


def split_of(bfcl_id: str) -> str:
    """``test`` for about :data:`TEST_FRACTION` of the scenarios (hash of the scenario index), else ``train``."""
    index = bfcl_id.rsplit("_", 1)[1]
    return hash_split(f"bfcl-multi-turn-{index}", TEST_FRACTION)


@functools.lru_cache(maxsize=None)
def _raw_entries(category: str) -> tuple[list[dict], dict[str, list[list[str]]]]:
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; valid: {', '.join(CATEGORIES)}")
    entries = load_dataset_entry(category)  # official loader: tool docs attached, held-out tools split off
    answers = {d["id"]: d["ground_truth"] for d in load_file(POSSIBLE_ANSWER_PATH / f"BFCL_v4_{category}.json")}
    return entries, answers


def _user_turn_text(messages: list[dict[str, str]], held_out: bool) -> str:
    texts = [m["content"] for m in messages if m.get("role") == "user"]
    if held_out and not texts:
        return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
    if not texts:
        raise ValueError("BFCL turn without a user message")
    return "\n\n".join(texts)


def convert_entry(entry: dict[str, Any], ground_truth: list[list[str]], category: str) -> Task:
    """One BFCL test entry (as the official loader returns it) and its ground truth -> :class:`Task`
    (without references; see :func:`reference_pool`)."""
    entry = copy.deepcopy(entry)
    held = {int(t): docs for t, docs in (entry.get("missed_function") or {}).items()}
    docs = list(entry["function"]) + [d for t in sorted(held) for d in held[t]]
    tools = [tool_spec(d) for d in docs]
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ValueError(f"{entry['id']}: duplicate tool names")
    n_turns = len(entry["question"])
    available = [d["name"] for d in entry["function"]]
    tools_by_turn = []
    for t in range(n_turns):
        available = available + [d["name"] for d in held.get(t, [])]
        tools_by_turn.append(list(available))
    owners = _method_owners(entry["involved_classes"])
    gold = [[parse_gold_call(s, owners) for s in turn] for turn in ground_truth]
    if len(gold) != n_turns:
        raise ValueError(f"{entry['id']}: {len(gold)} ground-truth turns for {n_turns} turns")
    return Task(
        id=entry["id"],
        env=f"bfcl:{category}",
        system_prompt=SYSTEM_PROMPT,
        user_turns=[_user_turn_text(msgs, t in held) for t, msgs in enumerate(entry["question"])],
        tools=tools,
        env_config={
            "bfcl_id": entry["id"],
            "category": category,
            "initial_config": entry.get("initial_config", {}),
            "involved_classes": list(entry["involved_classes"]),
            "long_context": "long_context" in category,
            "ground_truth": ground_truth,
        },
        gold_actions=gold,
        split=split_of(entry["id"]),
        metadata={
            "source": "bfcl-eval",
            "category": category,
            "held_out_tools": [{"turn": t, "tools": [d["name"] for d in held[t]]} for t in sorted(held)],
            "tools_by_turn": tools_by_turn,
            "excluded_function": list(entry.get("excluded_function", [])),
        },
    )


def reference_pool(category: str) -> ReferencePool:
    """The recorded gold calls of :data:`POOL_TASKS` train tasks of the category (built once per process)."""

    def build() -> ReferencePool:
        entries, answers = _raw_entries(category)
        train = spread([e for e in entries if split_of(e["id"]) == "train"], POOL_TASKS)
        records = []
        for e in train:
            task = convert_entry(e, answers[e["id"]], category)
            records += record_sequence(task, task.flat_gold(), BFCLEnv)
        return ReferencePool.from_records(records)

    return cached_pool(f"bfcl:{category}", build)


def _categories(spec: str) -> list[str]:
    rest = spec.split(":", 1)[1] if ":" in spec else ""
    if rest in ("", "all", "multi_turn"):
        return list(CATEGORIES)
    return [c.strip() for c in rest.split(",") if c.strip()]


def load_bfcl_tasks(spec: str, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
    """``bfcl`` (all four categories), ``bfcl:multi_turn_base`` or ``bfcl:multi_turn_base,multi_turn_miss_func``.
    ``split`` is ``train``, ``test`` or ``all``; with ``n`` a seeded sample of n tasks is returned, in dataset order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for BFCL; valid: {', '.join(SPLITS)}")
    chosen: list[tuple[dict, list[list[str]], str]] = []
    for category in _categories(spec):
        entries, answers = _raw_entries(category)
        for e in entries:
            if split == "all" or split_of(e["id"]) == split:
                chosen.append((e, answers[e["id"]], category))
    if n is not None and n < len(chosen):
        keep = sorted(random.Random(seed).sample(range(len(chosen)), n))
        chosen = [chosen[i] for i in keep]
    return assign(
        [convert_entry(e, gt, cat) for e, gt, cat in chosen], lambda t: reference_pool(t.env_config["category"])
    )
