"""Reference examples for Rehearse, drawn without answer leaks (METHOD.md section 6).

A task's references are recorded real call -> result pairs of the dataset's tools, taken from *other* tasks of
the *train* split, never from the task's own gold path. Each suite builds one :class:`ReferencePool` per domain
(or BFCL category) from the real recordings of a few dozen of its train tasks (built-ins: the first ones; BFCL
and tau2: an even :func:`spread`), built raw (without references, so pool building never recurses) and cached
per process by :func:`cached_pool`; :func:`choose_references` then picks 1-3 records for every task of every
split (train tasks too, so training and evaluation see the same kind of grounding). A record qualifies when

- its tool is one of the task's tools, and it comes from another task (``source != task.id``);
- its call is not one of the task's gold calls (:meth:`ToolCall.key`);
- neither its call nor its result mentions a *hidden value* of the task (:func:`hidden_values`): an expected
  output or a gold-call argument value that the task does not show the agent (system prompt, user turns, tool
  schemas), so a record never hands over the answer or an id the agent must look up itself;
- its text is at most :data:`MAX_RECORD_CHARS` characters (Rehearse's context stays small).

The choice is deterministic per task (its rng is seeded from the task id). Each record names its source task
(``ReferenceExample.source``) and, when it was made on a fresh environment, the key of that initial state
(``ReferenceExample.state``, :func:`initial_state_key`).

**Oracle references** (ablation only, off by default): the task's own gold calls with their real results, run
in order in a fresh environment (the old behaviour; it leaks the answer). Ask for them with the suite-spec suffix
``@oracle-references`` (``load_tasks("bank@oracle-references", "test")``, ``--suite bank@oracle-references``):
the suffix stays in the suite name that reports print, and the tasks carry ``metadata["references"] == "oracle"``.
Every report that uses them must say "oracle references" in its title.

**Reference cache** (``RolloutConfig.reference_cache``): a call identical to a record is answered from it only
when the record was made on a fresh environment whose initial state has the same key as this task's
(:func:`cache_lookup`); other records of the same call go to Rehearse, counted as ``rehearse/cache_other_state``.
A hit is then what this task's own world answers to that call as a first call (tau2 tasks share a database, so
hits happen there; built-in worlds differ per task, so they rarely do); as before, a hit ignores what earlier
calls of the trajectory changed.
"""

from __future__ import annotations

import copy
import hashlib
import random
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..core.registry import Registry
from ..core.types import ReferenceExample, Task, ToolCall, dumps, is_error_obs
from .base import make_env
from .registry import ENVS, ensure_registered

MAX_RECORD_CHARS = 1500  # a record longer than this (call and result as text) is not used as a reference
MIN_HIDDEN_CHARS = 3  # shorter values ("2", "no") are too common to tell a leak from a coincidence
MAX_REFERENCES = 3

EnvFactory = Callable[[Task], Any]


# ------------------------------------------------------------------------------------------ recording


def digest(obj: Any) -> str:
    """A short stable digest of a JSON value (state keys)."""
    return hashlib.sha256(dumps(obj).encode("utf-8")).hexdigest()[:16]


def initial_state_key(task: Task) -> str:
    """A key of the task's initial environment state: equal keys mean equal initial states. An environment
    class may define ``initial_state_key(task)`` (tau2: the domain and the task's initialisation); the default
    is a digest of ``task.env`` and ``task.env_config`` (exact for the built-ins, whose state is the config)."""
    ensure_registered(task.env)
    own = getattr(ENVS.get(task.env.split(":", 1)[0]), "initial_state_key", None)
    return own(task) if own is not None else digest({"env": task.env, "env_config": task.env_config})


def cache_lookup(task: Task, call: ToolCall) -> tuple[str, ReferenceExample | None]:
    """The reference cache's answer to ``call`` of ``task``: ``("hit", record)`` for a record of the same call
    made on a fresh environment in this task's initial state; ``("other_state", None)`` when the same call was
    only recorded on another state (answering it from the record could tell another task's world);
    ``("miss", None)`` otherwise."""
    same = [r for r in task.references if r.call.key() == call.key()]
    if not same:
        return "miss", None
    key = initial_state_key(task)
    ref = next((r for r in same if r.state == key), None)
    return ("hit", ref) if ref is not None else ("other_state", None)


def _record(call: ToolCall, obs: Any, source: str, state: str) -> ReferenceExample | None:
    if is_error_obs(obs) and obs["error"]["kind"] == "too_large":
        return None
    return ReferenceExample(
        call=ToolCall(call.name, copy.deepcopy(call.arguments)), result=obs, source=source, state=state
    )


def record_each(task: Task, calls: Iterable[ToolCall], factory: EnvFactory) -> list[ReferenceExample]:
    """Each call run as the first call of its own fresh environment of ``task`` (all on the initial state)."""
    key = initial_state_key(task)
    out = []
    for c in calls:
        env = factory(task)
        try:
            rec = _record(c, env.call(c), task.id, key)
        finally:
            env.close()
        if rec is not None:
            out.append(rec)
    return out


def record_sequence(task: Task, calls: Iterable[ToolCall], factory: EnvFactory) -> list[ReferenceExample]:
    """The calls in order in one fresh environment of ``task`` (later results see the earlier calls' effects);
    only the first record is known to be made on the initial state (``state`` set), the others have none."""
    env = factory(task)
    key = initial_state_key(task)
    out = []
    try:
        for i, c in enumerate(calls):
            rec = _record(c, env.call(c), task.id, key if i == 0 else "")
            if rec is not None:
                out.append(rec)
    finally:
        env.close()
    return out


def record_gold(task: Task) -> list[ReferenceExample]:
    """The task's own gold calls with their real results, in order in one fresh environment (oracle)."""
    return record_sequence(task, task.flat_gold(), make_env)


# ------------------------------------------------------------------------------------------ the pool


def spread(items: list[Any], n: int) -> list[Any]:
    """``n`` items evenly spaced over ``items``, in order (all of them when there are at most ``n``): a pool
    from a dataset sorted by scenario type still covers every type."""
    if len(items) <= n:
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


@dataclass
class ReferencePool:
    """Records of train tasks by tool name, each with its call key and its lower-cased text (for the checks)."""

    by_tool: dict[str, list[tuple[ReferenceExample, str, str]]] = field(default_factory=dict)
    sources: frozenset[str] = frozenset()

    @classmethod
    def from_records(cls, records: Iterable[ReferenceExample]) -> "ReferencePool":
        by_tool: dict[str, list[tuple[ReferenceExample, str, str]]] = {}
        seen: set[str] = set()
        for r in records:
            text = record_text(r)
            if len(text) > MAX_RECORD_CHARS or text in seen:
                continue
            seen.add(text)
            by_tool.setdefault(r.call.name, []).append((r, r.call.key(), text.lower()))
        return cls(by_tool, frozenset(r.source for recs in by_tool.values() for r, _, _ in recs))

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_tool.values())


def record_text(r: ReferenceExample) -> str:
    """A record as Rehearse's prompt shows it (``envace.chat.prompts.rehearse_system``)."""
    return f"{r.call.key()} -> {dumps(r.result)}"


_POOLS: dict[str, ReferencePool] = {}
_LOCK = threading.RLock()


def cached_pool(key: str, build: Callable[[], ReferencePool]) -> ReferencePool:
    """The pool named ``key`` (e.g. ``"bank"``, ``"bfcl:multi_turn_base"``), built once per process."""
    with _LOCK:
        if key not in _POOLS:
            _POOLS[key] = build()
        return _POOLS[key]


# ------------------------------------------------------------------------------------------ choosing


def json_leaves(x: Any) -> list[Any]:
    """The strings and numbers inside a JSON value (booleans and nulls are not values a call could carry)."""
    if isinstance(x, dict):
        return [v for item in x.values() for v in json_leaves(item)]
    if isinstance(x, list):
        return [v for item in x for v in json_leaves(item)]
    if isinstance(x, bool) or x is None:
        return []
    return [x] if isinstance(x, (str, int, float)) else []


def norm_value(value: str) -> str:
    """A value as texts are compared with it: stripped, lower-cased, without a leading ``$``."""
    return value.strip().lower().lstrip("$")


def mentions(text: str, value: str) -> bool:
    """Whether lower-cased ``text`` contains lower-cased ``value`` as a whole token (not inside a longer word
    or number: ``"42.50"`` is not in ``"142.50"``)."""
    return value in text and _token_re([value]).search(text) is not None


def _token_re(values: list[str]) -> re.Pattern[str]:
    return re.compile(r"(?<![0-9a-z])(?:" + "|".join(re.escape(v) for v in values) + r")(?![0-9a-z])")


def shown_text(task: Task) -> str:
    """Everything the task shows the agent before any observation: system prompt, user turns, tool schemas."""
    tools = dumps([[t.name, t.description, t.parameters] for t in task.tools])
    return "\n".join([task.system_prompt, *task.user_turns, tools]).lower()


def hidden_values(task: Task) -> list[str]:
    """Values only the answer holds: expected outputs and gold-call argument values (lower-cased, ``$``
    dropped, at least :data:`MIN_HIDDEN_CHARS` characters) that :func:`shown_text` does not contain."""
    shown = shown_text(task)
    values = list(task.expected_outputs) + [v for c in task.flat_gold() for v in map(str, json_leaves(c.arguments))]
    out: list[str] = []
    for v in values:
        s = norm_value(v)
        if len(s) >= MIN_HIDDEN_CHARS and s not in out and not mentions(shown, s):
            out.append(s)
    return out


def choose_references(task: Task, pool: ReferencePool, k: int | None = None) -> list[ReferenceExample]:
    """1-3 records of ``pool`` for ``task`` by the rules of the module docstring; deterministic per task id.
    Tools are visited in a seeded order, one record per tool per round, until ``k`` are chosen (fewer when
    too few records qualify)."""
    rng = random.Random(f"references/{task.id}")
    k = rng.randint(1, MAX_REFERENCES) if k is None else k
    gold = {c.key() for c in task.flat_gold()}
    hidden = hidden_values(task)
    leak = _token_re(hidden) if hidden else None
    tools = [name for name in dict.fromkeys(t.name for t in task.tools) if pool.by_tool.get(name)]
    rng.shuffle(tools)
    chosen: list[ReferenceExample] = []
    keys: set[str] = set()
    while len(chosen) < k and tools:
        for name in list(tools):
            recs = [
                (r, key)
                for r, key, text in pool.by_tool[name]
                if r.source != task.id and key not in gold and key not in keys and not (leak and leak.search(text))
            ]
            if not recs:
                tools.remove(name)
                continue
            r, key = rng.choice(recs)
            keys.add(key)
            chosen.append(copy.deepcopy(r))
            if len(chosen) == k:
                break
    return chosen


def assign(tasks: list[Task], pool_of: Callable[[Task], ReferencePool]) -> list[Task]:
    """Set every task's references from its pool (``pool_of(task)``); returns the tasks."""
    for t in tasks:
        t.references = choose_references(t, pool_of(t))
    return tasks


# ------------------------------------------------------------------------------------------ modes

# suite-spec suffix (after '@') -> what happens to the loaded tasks' references
REFERENCE_MODES: Registry[Callable[[list[Task]], list[Task]]] = Registry("reference mode")


@REFERENCE_MODES.register("oracle-references")
def _oracle(tasks: list[Task]) -> list[Task]:
    """Ablation only: each task's own gold calls with their real results (leaks the answer; say so)."""
    for t in tasks:
        t.references = record_gold(t)
        t.metadata = {**t.metadata, "references": "oracle"}
    return tasks


def split_spec(spec: str) -> tuple[str, str | None]:
    """``"bank@oracle-references"`` -> ``("bank", "oracle-references")``; a spec without a known ``@`` suffix
    is returned whole (an MCP command line may contain ``@``)."""
    base, at, option = spec.rpartition("@")
    if at and option in REFERENCE_MODES:
        return base, option
    return spec, None
