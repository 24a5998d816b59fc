"""Shared machinery of the built-in environments: the ``@tool`` decorator, the :class:`ToolEnv` base class,
the :class:`TaskBuilder` that turns a scripted episode into a :class:`~envace.core.types.Task`, and the split logic.
Checklist rules (``called`` / ``not_called`` / ``reply_contains`` / ``max_calls``) are produced here and
checked by :func:`envace.rewards.functions.check_rule`.

A domain is a :class:`ToolEnv` subclass whose tools are methods decorated with ``@tool``; the ToolSpecs the
model sees are derived from those decorators, and ``_execute`` calls the bound method with the (already
schema-validated) arguments as keywords. Nothing is ever evaluated. The whole state is one JSON dict
(``self.s``), deep-copied from ``task.env_config``, so a fresh environment of a task always starts the same.

Task generation runs the gold calls on a live environment while the episode is scripted, so gold replies and
expected outputs quote real observations, and every gold call is known to behave as intended (succeed, or fail
where the template says it should). References come from other tasks: a domain's pool holds the gold and
``suggest()``ed calls of its first :data:`POOL_TASKS` train tasks, each run on a fresh environment of its task,
and every task draws 1-3 records from it (:mod:`envace.envs.references`).


Splits (:data:`SPLITS`); task ``i`` of a split is a pure function of (domain, split, i):

* ``train``, ``val`` and ``test``: the in-distribution templates and name pools. Each parameter combination
  (template + the user's words with dollar amounts blanked, see :func:`split_of`) belongs to exactly one of them:
  one in :data:`TEST_SHARE` to ``test``, one in ``TEST_SHARE * VAL_SHARE`` (1/15, a twelfth of what train had
  before ``val`` existed) to ``val``, the rest to ``train``. So ``test`` and ``val`` hold out requests, not
  templates, phrasings or names. ``val`` is part of train's distribution with keys disjoint from train and test:
  the split to choose settings (hyper-parameters, checkpoints) on, so that ``test`` is only reported.
  Carving ``val`` out of train left ``test`` exactly as it was; a train task changed only where its first
  accepted draw had a key that is now ``val`` (about 8% of train indices; the later sub-seeds decide instead).
* ``ood``: only the held-out templates (registered with ``ood=True``, never drawn for train, val or test), run on
  worlds drawn from the held-out name pools (``Domain.pools``: account / product / directory and file names,
  plus memos and file lines, that no train or test task uses). It measures generalisation to unseen task
  structures and unseen entities together.
* ``ood_customers`` (:data:`OOD_CUSTOMERS_SPLIT`, persistent suites only, not in :data:`SPLITS`): the in-distribution
  templates (train's task structures, any request) about the ``ood`` split's customers and their held-out records.
  It measures generalisation to unseen entities alone: the rules of the world are the ones trained on, the records
  are new (a model must read them, it cannot have memorised them).

Every task is labelled with a kind in ``metadata["kind"]`` (:func:`task_kind`, derived by replaying the gold
calls, one label, first match wins): ``recovery`` (a gold call fails with a tool error and the episode goes on
from it), ``chained`` (a gold call's argument value first appears in an earlier observation and nowhere in the
user turns), ``read_only_report`` (no state-changing gold call and the reply must report expected outputs),
else ``simple``.
"""

from __future__ import annotations

import copy
import posixpath
import random
import re
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

from ...core.registry import Registry
from ...core.types import (
    ChecklistItem,
    ReferenceExample,
    Task,
    ToolCall,
    ToolSpec,
    Trajectory,
    dumps,
    is_error_obs,
    states_fact,
)
from ..base import Environment, Score, ToolError
from ..references import ReferencePool, cached_pool, choose_references, json_leaves, record_each

SPLITS: tuple[str, ...] = ("train", "val", "test", "ood")
OOD_SPLIT = "ood"  # the split drawn from the held-out templates and name pools
OOD_CUSTOMERS_SPLIT = "ood_customers"  # persistent suites: train's templates about the ood customers
KINDS: tuple[str, ...] = ("recovery", "chained", "read_only_report", "simple")  # task_kind labels, in precedence order
DEFAULT_N = 2000  # tasks a suite returns when n is None
INDEX_SPACE = 1_000_000  # task indices of one split; seed > 0 samples n of them
TEST_SHARE = 5  # one in TEST_SHARE parameter combinations belongs to the test split
VAL_SHARE = 3  # of the combinations in the next crc32 % TEST_SHARE bucket, one in VAL_SHARE belongs to val
MONEY_RE = re.compile(r"\$\d+(?:\.\d+)?")
MAX_ATTEMPTS = 1000  # sub-seeds tried per task index before giving up (never reached: val keeps about 1 draw in 14)
POOL_TASKS = 64  # train tasks of a domain whose recorded calls are the reference pool of all its tasks


# ----------------------------------------------------------------------------------------------- tools


def tool(
    description: str,
    parameters: dict[str, dict[str, Any]] | None = None,
    optional: tuple[str, ...] = (),
    mutates: bool = False,
):
    """Mark a method as a tool. ``parameters`` maps argument names to JSON schemas; every argument not in
    ``optional`` is required, and no other argument is allowed. ``mutates`` says whether the tool can change
    the state (read-only tasks forbid these tools in their checklists)."""
    props = dict(parameters or {})
    unknown = set(optional) - set(props)
    if unknown:
        raise ValueError(f"optional names unknown parameters: {sorted(unknown)}")
    schema: dict[str, Any] = {
        "type": "object",
        "properties": props,
        "required": [k for k in props if k not in optional],
        "additionalProperties": False,
    }

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        spec = ToolSpec(name=fn.__name__, description=description, parameters=schema, read_only=not mutates)
        fn.__tool__ = (spec, mutates)  # type: ignore[attr-defined]
        return fn

    return deco


class ToolEnv(Environment):
    """An environment whose tools are ``@tool`` methods and whose state is the JSON dict ``self.s``."""

    domain: str = ""
    system_prompt: str = ""
    _specs: dict[str, ToolSpec] = {}
    _mutating: frozenset[str] = frozenset()

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        specs: dict[str, ToolSpec] = {}
        mutating = set()
        for klass in reversed(cls.__mro__):
            for name, fn in vars(klass).items():
                meta = getattr(fn, "__tool__", None)
                if meta is not None:
                    specs[name] = meta[0]
                    if meta[1]:
                        mutating.add(name)
        cls._specs, cls._mutating = specs, frozenset(mutating)

    def __init__(self, task: Task):
        super().__init__(task)
        self.s: dict[str, Any] = copy.deepcopy(task.env_config)

    @classmethod
    def tool_specs(cls) -> list[ToolSpec]:
        """The domain's tools in definition order (fresh copies: callers may not alter the class's specs)."""
        return [copy.deepcopy(s) for s in cls._specs.values()]

    @classmethod
    def mutating_tools(cls) -> list[str]:
        return [n for n in cls._specs if n in cls._mutating]

    def _execute(self, call: ToolCall) -> Any:
        if call.name not in self._specs:  # the task offered a tool this domain does not implement
            raise ToolError(f"tool {call.name!r} is not implemented here")
        return getattr(self, call.name)(**call.arguments)

    def state(self) -> dict[str, Any]:
        return copy.deepcopy(self.s)

    def outcome_state(self) -> dict[str, Any]:
        """The part of the state that decides success. Defaults to the whole state; domains drop generated ids
        and counters so that the same effects in another order (two transfers swapped) still count."""
        return self.state()

    def gold_run(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The outcome state of a fresh instance of this domain before and after the task's gold calls. A reference
        run, part of the check, not an execution of the task: it uses the domain class itself, never the registry's
        factory for ``task.env`` (which may wrap the environment, e.g. to count or forward its calls)."""
        gold_env = type(self)(self.task)
        start = gold_env.outcome_state()
        for call in self.task.flat_gold():
            gold_env.call(call)
        want = gold_env.outcome_state()
        gold_env.close()
        return start, want

    def score(self, traj: Trajectory) -> Score:
        """Success = this env's outcome state equals the one after running the gold actions in a fresh instance of
        this domain, and the text replies state every expected output (case-insensitively, as a whole value:
        :func:`~envace.core.types.states_fact`); the gold run is :meth:`gold_run`.

        A task whose gold run changes nothing and expects no fact in the reply (a request that turns out to need
        no action, e.g. cancelling the pending orders of a customer who has none) is passed by an agent that never
        looked; there, success also requires the trajectory to have called every tool the gold run called
        (:func:`unlooked_tools`), so that "nothing to do" is a decision read from the world, not a guess."""
        start, want = self.gold_run()
        got = self.outcome_state()
        diffs = json_diff(want, got)
        text = "\n".join(traj.replies()).lower()
        missing = [o for o in self.task.expected_outputs if not states_fact(text, o)]
        nothing = nothing_to_do(self.task, start, want)
        unlooked = unlooked_tools(self.task.flat_gold(), traj.calls()) if nothing else []
        success = not diffs and not missing and not unlooked
        details = {
            "state_match": not diffs,
            "state_diff": diffs[:10],
            "n_state_diff": len(diffs),
            "missing_outputs": missing,
            "unlooked_tools": unlooked,
        }
        return Score(success=success, reward=1.0 if success else 0.0, details=details)


def nothing_to_do(task: Task, start: dict[str, Any], want: dict[str, Any]) -> bool:
    """Whether the task needs no action: its gold run leaves the outcome state as it found it (``start`` ->
    ``want``, :meth:`ToolEnv.gold_run`) and its replies need state no fact."""
    return not task.expected_outputs and not json_diff(start, want)


def unlooked_tools(gold: list[ToolCall], calls: list[ToolCall]) -> list[str]:
    """The tools the gold run called that ``calls`` never did (by name, in gold order): on a task with nothing to
    do, what the agent skipped reading before it concluded so."""
    called = {c.name for c in calls}
    return list(dict.fromkeys(c.name for c in gold if c.name not in called))


def json_diff(want: Any, got: Any, path: str = "$") -> list[str]:
    """Human-readable differences between two JSON values: ``"$.accounts.rent.balance_cents: want 100, got 80"``."""
    if isinstance(want, dict) and isinstance(got, dict):
        out: list[str] = []
        for k in sorted(set(want) | set(got), key=str):
            if k not in got:
                out.append(f"{path}.{k}: missing (want {_short(want[k])})")
            elif k not in want:
                out.append(f"{path}.{k}: unexpected {_short(got[k])}")
            else:
                out.extend(json_diff(want[k], got[k], f"{path}.{k}"))
        return out
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [d for i, (a, b) in enumerate(zip(want, got)) for d in json_diff(a, b, f"{path}[{i}]")]
    if want != got:
        return [f"{path}: want {_short(want)}, got {_short(got)}"]
    return []


def _short(x: Any, n: int = 120) -> str:
    s = dumps(x)
    return s if len(s) <= n else s[: n - 3] + "..."


# ------------------------------------------------------------------------------------------ small helpers


def cents(amount: float) -> int:
    try:
        return int(round(float(amount) * 100))
    except (OverflowError, ValueError):  # 1e400 or a 400-digit integer: a model can write any JSON number
        raise ToolError(f"amount {amount!r:.40} is out of range") from None


def money(c: int) -> str:
    """Cents as the dollar string used in observations and replies: 14250 -> "142.50"."""
    sign = "-" if c < 0 else ""
    c = abs(c)
    return f"{sign}{c // 100}.{c % 100:02d}"


def norm_path(path: str) -> str:
    if not path.startswith("/"):
        raise ToolError(f"path must be absolute (start with /): {path!r}")
    p = posixpath.normpath(path)
    return "/" if p.startswith("//") else p


# ------------------------------------------------------------------------------------------ task building


class GenerationError(RuntimeError):
    """A template drew parameters it cannot use (the generator moves on to the next sub-seed)."""


class TaskBuilder:
    """Scripts one episode against a live environment and turns it into a Task.

    ``user(text)`` opens a turn; ``call(name, **args)`` runs a gold call and returns its observation (it must
    succeed unless ``fails=True``, and then it must fail); ``reply(text, expect=...)`` closes the turn with the
    gold reply and the facts the agent's replies must contain.
    """

    def __init__(self, env_cls: type[ToolEnv], config: dict[str, Any], rng: random.Random):
        self.env_cls = env_cls
        self.config = copy.deepcopy(config)
        self.rng = rng
        self.tools = env_cls.tool_specs()
        self.env = env_cls(self._task("draft", "train"))
        self.user_turns: list[str] = []
        self.gold: list[list[ToolCall]] = []
        self.replies: list[str] = []
        self.expected: list[str] = []
        # gold calls the checklist asks for, with the argument names that must match (None: all); failing
        # gold calls are not required (the agent may find out another way)
        self.required: list[tuple[ToolCall, tuple[str, ...] | None]] = []
        self.checks: list[ChecklistItem] = []
        self.extra_refs: list[ToolCall] = []  # plausible calls a template suggests as references
        self.split_by_customer = False  # a template whose request names no entity sets it (see split_key)

    def _task(self, task_id: str, split: str) -> Task:
        return Task(
            id=task_id,
            env=self.env_cls.domain,
            system_prompt=self.env_cls.system_prompt,
            user_turns=[],
            tools=self.tools,
            env_config=copy.deepcopy(self.config),
            split=split,
        )

    def user(self, text: str) -> None:
        if len(self.replies) != len(self.user_turns):
            raise RuntimeError("a turn must be closed with reply() before the next user() turn")
        self.user_turns.append(text)
        self.gold.append([])

    def call(self, name: str, fails: bool = False, check_keys: tuple[str, ...] | None = None, **args: Any) -> Any:
        c = ToolCall(name=name, arguments=args)
        obs = self.env.call(c)
        if is_error_obs(obs) != fails:
            raise GenerationError(f"gold call {c.key()} gave {obs!r} (fails={fails})")
        if fails and obs["error"]["kind"] != "tool_error":
            raise GenerationError(f"gold call {c.key()} should fail as a tool_error, gave {obs!r}")
        self.gold[-1].append(c)
        if not fails:
            self.required.append((c, check_keys))
        return obs

    def reply(self, text: str, expect: tuple[str, ...] | list[str] = ()) -> None:
        if len(self.replies) != len(self.user_turns) - 1:
            raise RuntimeError("reply() without an open user() turn")
        self.replies.append(text)
        for e in expect:
            if not states_fact(text, e):
                raise RuntimeError(f"gold reply {text!r} does not contain expected output {e!r}")
            if e not in self.expected:
                self.expected.append(e)

    def suggest(self, name: str, **args: Any) -> None:
        """Offer a plausible (non-gold) call as a reference candidate; it may fail (an error record)."""
        self.extra_refs.append(ToolCall(name=name, arguments=args))

    def check(self, description: str, rule: dict[str, Any] | None) -> None:
        self.checks.append(ChecklistItem(description, rule))

    def split_key(self, template: str) -> str:
        """The parameter combination that decides the split: the template and the user's words with dollar
        amounts blanked, so identical requests never land in both splits and an (accounts, phrasing) combo
        of the test split is never seen in training with another amount. With ``split_by_customer`` (a template
        whose words name no entity, e.g. "cancel all my pending orders") the customer is part of the key, so the
        request of one customer is held out while the same words from another are seen."""
        key = template + "|" + MONEY_RE.sub("$#", "\n".join(self.user_turns))
        return key + "|" + str(self.config.get("customer")) if self.split_by_customer else key

    def build(self, task_id: str, split: str, template: str) -> Task:
        if not self.user_turns or len(self.replies) != len(self.user_turns):
            raise RuntimeError("every user turn needs a gold reply")
        task = self._task(task_id, split)
        task.user_turns = list(self.user_turns)
        task.user_turns[0] = customer_intro(self.config) + task.user_turns[0]
        task.gold_actions = [list(t) for t in self.gold]
        task.gold_replies = list(self.replies)
        task.expected_outputs = list(self.expected)
        task.references = []  # set by Domain from other train tasks' records (see own_records)
        task.checklist = self._checklist()
        flat = task.flat_gold()
        read_only = not any(c.name in self.env_cls._mutating for c in flat)
        task.metadata = {
            "template": template,
            "n_turns": len(self.user_turns),
            "n_gold_calls": len(flat),
            "read_only": read_only,
        }
        task.metadata["kind"] = task_kind(task, self.env_cls)
        return task

    def own_records(self, task: Task) -> list[ReferenceExample]:
        """This task's real records for the reference pool of the domain (never shown for this task itself):
        its gold calls and the calls its template suggested, each run on a fresh env on the initial state."""
        seen: set[str] = set()
        calls = []
        for c in task.flat_gold() + self.extra_refs:
            if c.key() not in seen:
                seen.add(c.key())
                calls.append(c)
        return record_each(task, calls, self.env_cls)

    def _checklist(self) -> list[ChecklistItem]:
        items = []
        seen = set()
        for c, keys in self.required:
            want = {k: v for k, v in c.arguments.items() if keys is None or k in keys}
            key = ToolCall(c.name, want).key()
            if key in seen:
                continue
            seen.add(key)
            args = ", ".join(f"{k}={dumps(v)}" for k, v in want.items())
            items.append(
                ChecklistItem(f"Calls {c.name}({args})", {"type": "called", "tool": c.name, "arguments": want})
            )
        if not any(c.name in self.env_cls._mutating for t in self.gold for c in t):
            for name in self.env_cls.mutating_tools():
                items.append(
                    ChecklistItem(
                        f"Does not call {name} (the user only asked a question)", {"type": "not_called", "tool": name}
                    )
                )
        for e in self.expected:
            items.append(ChecklistItem(f"Tells the user {e!r}", {"type": "reply_contains", "text": e}))
        items.extend(self.checks)
        n = sum(len(t) for t in self.gold)
        items.append(ChecklistItem(f"Uses at most {2 * n + 2} tool calls", {"type": "max_calls", "n": 2 * n + 2}))
        return items


# ------------------------------------------------------------------------------------------ task kinds

NUMBER_RE = re.compile(r"\d+(?:\.\d+)?")
MIN_CHAINED_CHARS = 4  # shortest observed text that counts as carried into a longer argument


def _as_number(x: Any) -> float | None:
    """A number, or a string that is one ("-12.50"), as its magnitude; anything else None."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return abs(float(x))
    if isinstance(x, str) and re.fullmatch(r"-?" + NUMBER_RE.pattern, x.strip()):
        return abs(float(x))
    return None


def carried(value: Any, observed: list[Any], user_text: str) -> bool:
    """Whether an argument value comes from an earlier observation and not from the user: a number equal to an
    observed number (sign ignored: a payment of -12.50 refunded as 12.5) that the user never wrote, or a string
    the user never wrote that equals an observed string or contains one (of >= MIN_CHAINED_CHARS characters)
    that the user never wrote either (old file content plus a new line)."""
    num = _as_number(value) if not isinstance(value, str) else None
    if num is not None:
        said = {float(m) for m in NUMBER_RE.findall(user_text)}
        return num not in said and any(_as_number(o) == num for o in observed)
    if not isinstance(value, str) or not value or value in user_text:
        return False
    texts = [o for o in observed if isinstance(o, str)]
    return value in texts or any(len(o) >= MIN_CHAINED_CHARS and o in value and o not in user_text for o in texts)


def task_kind(task: Task, env_cls: type[ToolEnv]) -> str:
    """The task's kind (see the module docstring), from its gold calls replayed in a fresh environment."""
    env = env_cls(task)
    user_text = "\n".join(task.user_turns)
    observed: list[Any] = []
    failed = chained = False
    for c in task.flat_gold():
        chained = chained or any(carried(v, observed, user_text) for v in json_leaves(c.arguments))
        obs = env.call(c)
        failed = failed or is_error_obs(obs)
        observed.extend(json_leaves(obs))
    env.close()
    read_only = not any(c.name in env_cls._mutating for c in task.flat_gold())
    if failed:
        return "recovery"
    if chained:
        return "chained"
    return "read_only_report" if read_only and task.expected_outputs else "simple"


# ------------------------------------------------------------------------------------------ persistent worlds
# A world worth rehearsing (METHOD.md section 6): in a persistent suite every task of a split starts from the
# record of one customer of a small, fixed population, the same record every time that customer comes back, so a
# tool's result is a deterministic function of a world that persists across tasks plus the changes made earlier in
# the episode, as a real service's is. Per-task variation comes from which customer, which accounts or items, which
# request. The fresh suites (``bank``, ...) draw a new random world per task instead: nothing to internalise.

CUSTOMERS: tuple[str, ...] = (
    "Ana Ortiz",
    "Ben Carter",
    "Chloe Nguyen",
    "David Okafor",
    "Elena Rossi",
    "Farid Haddad",
    "Grace Kim",
    "Hugo Lambert",
)
OOD_CUSTOMERS: tuple[str, ...] = ("Ines Moreau", "Jonas Berg", "Keiko Sato", "Luis Romero")
"""The population of the persistent suites: train, val and test tasks are about :data:`CUSTOMERS` (whose records
a model can learn in training), ``ood`` tasks about :data:`OOD_CUSTOMERS`, whom no other split names."""


@dataclass
class Population:
    """The fixed customers of a persistent suite: member ``i`` is ``draw(rng_i, i)``, drawn once from a seed that
    depends only on (suite, i), with ``"customer"`` (the member's name) added to its record."""

    name: str
    customers: tuple[str, ...]
    draw: Callable[[random.Random, int], dict[str, Any]]
    _members: list[dict[str, Any]] = field(default_factory=list, init=False, repr=False, compare=False)

    def members(self) -> list[dict[str, Any]]:
        if not self._members:
            for i, who in enumerate(self.customers):
                w = self.draw(random.Random(f"{self.name}/customer/{i}"), i)
                w["customer"] = who
                self._members.append(w)
        return self._members

    def pick(self, rng: random.Random, fits: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """A copy of one member that ``fits`` (chosen with ``rng``); GenerationError when none does."""
        ok = [m for m in self.members() if fits(m)]
        if not ok:
            raise GenerationError(f"no customer of {self.name} fits this template")
        return copy.deepcopy(rng.choice(ok))


class WorldRandom(random.Random):
    """The random source a template draws from; in a persistent suite it carries the suite's population, which
    the domain's world function then picks the task's starting record from (:func:`persistent_world`)."""

    population: Population | None = None


def persistent_world(rng: random.Random, fits: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """The starting record of a task: a member of ``rng``'s population that ``fits``, or None in a fresh suite
    (the world function then draws a new world)."""
    population = getattr(rng, "population", None)
    return None if population is None else population.pick(rng, fits)


def customer_intro(config: dict[str, Any]) -> str:
    """How the user of a persistent suite's task says who they are (the first words of the first user turn), so
    that Act and Rehearse, which sees the conversation, both know whose record the tools read."""
    who = config.get("customer")
    return f"Hi, this is {who}. " if who else ""


# ------------------------------------------------------------------------------------------ domains and splits

Template = Callable[[random.Random], TaskBuilder]
Pool = tuple[str, ...]


@dataclass
class Domain:
    """A domain: its environment class, its task templates (name -> function of an rng), which of them are held
    out for the ``ood`` split, and its name pools split into an in-distribution and a held-out half."""

    env_cls: type[ToolEnv]
    templates: Registry[Template] = field(default_factory=lambda: Registry("task template"))
    held_out: set[str] = field(default_factory=set)
    """Names of the templates only the ``ood`` split draws (registered with ``template(name, ood=True)``)."""
    pools: dict[str, tuple[Pool, Pool]] = field(default_factory=dict)
    """Entity pools by kind: (names train and test worlds draw from, names only ``ood`` worlds draw from)."""
    entities: Callable[[dict[str, Any]], set[str]] | None = None
    """The entity names (accounts, products, path parts) of a task's initial state, for leak scans."""
    suite: str = ""
    """The suite's name when it is not the environment's (``bank-world`` runs ``bank``'s tools)."""
    populations: tuple[Population, Population] | None = None
    """A persistent suite's customers: (train / val / test, ``ood``); None: a fresh random world per task."""

    _pool_build: threading.local = field(default_factory=threading.local, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for kind, (seen, held) in self.pools.items():
            both = sorted(set(seen) & set(held))
            if both:
                raise ValueError(f"{self.name}: pool {kind!r} has names in both halves: {both}")
        self.pools = {k: (tuple(a), tuple(b)) for k, (a, b) in self.pools.items()}

    @property
    def name(self) -> str:
        return self.suite or self.env_cls.domain

    def persistent(
        self,
        draw: Callable[[random.Random, int], dict[str, Any]],
        ood_draw: Callable[[random.Random, int], dict[str, Any]],
        suite: str | None = None,
        world: str | None = None,
    ) -> "Domain":
        """The persistent twin of this domain, suite ``suite`` (default ``<name>-world``): the same tools and
        templates, whose tasks start from the records of :data:`CUSTOMERS` (``ood``: :data:`OOD_CUSTOMERS`), member
        ``i`` drawn by ``draw(rng, i)`` (``ood_draw``), instead of a fresh world each. ``world`` names the
        population (default: the suite's name): two suites with the same ``world`` and draws have the same
        customers, so what is learnt of them on one holds on the other."""
        name = suite or f"{self.name}-world"
        people = world or name
        return Domain(
            self.env_cls,
            templates=self.templates,
            held_out=self.held_out,
            pools=self.pools,
            entities=self.entities,
            suite=name,
            populations=(Population(people, CUSTOMERS, draw), Population(f"{people}/ood", OOD_CUSTOMERS, ood_draw)),
        )

    def template(self, name: str, ood: bool = False) -> Callable[[Template], Template]:
        """Register a template; ``ood=True`` holds it out: only the ``ood`` split draws it."""
        if ood:
            self.held_out.add(name)
        return self.templates.register(name)

    def splits(self) -> tuple[str, ...]:
        """The splits this domain draws: :data:`SPLITS`, and :data:`OOD_CUSTOMERS_SPLIT` where it is persistent."""
        return SPLITS + ((OOD_CUSTOMERS_SPLIT,) if self.populations is not None else ())

    def template_names(self, split: str) -> list[str]:
        """The templates a split draws from (sorted): the held-out ones for ``ood``, all others for train/val/test
        and ``ood_customers``."""
        if split not in self.splits():
            more = "" if self.populations else f" ({OOD_CUSTOMERS_SPLIT!r} exists only for the persistent suites)"
            raise ValueError(f"unknown split {split!r} for {self.name}; valid: {', '.join(self.splits())}{more}")
        return [n for n in self.templates.names() if (n in self.held_out) == (split == OOD_SPLIT)]

    def make_task(self, split: str, index: int) -> Task:
        """Task ``index`` of ``split``: a pure function of (domain, split, index). Sub-seeds are tried until a
        template yields a task (and, for train/val/test, one whose parameter combination belongs to the split)."""
        names = self.template_names(split)
        ood_people = split in (OOD_SPLIT, OOD_CUSTOMERS_SPLIT)  # held out whole: no request key decides them
        for attempt in range(MAX_ATTEMPTS):
            rng = WorldRandom(f"{self.name}/{split}/{index}/{attempt}")
            if self.populations is not None:
                rng.population = self.populations[ood_people]
            template = rng.choice(names)
            try:
                b = self.templates.get(template)(rng)
            except GenerationError:
                continue
            if not ood_people and split_of(b.split_key(template)) != split:
                continue
            return self._with_references(b, b.build(f"{self.name}-{split}-{index:06d}", split, template))
        raise RuntimeError(f"could not generate {self.name} task {split}/{index} in {MAX_ATTEMPTS} attempts")

    def load(self, spec: str, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        return [self.make_task(split, i) for i in split_indices(n, seed)]

    def _with_references(self, b: TaskBuilder, task: Task) -> Task:
        """A built task with references drawn from the domain's pool; while this thread builds the pool, the
        task stays raw and its own records go to the pool instead (so pool building never recurses)."""
        collecting = getattr(self._pool_build, "records", None)
        if collecting is not None:
            collecting.extend((task.env_config.get("customer"), r) for r in b.own_records(task))
        else:
            task.references = choose_references(task, self.reference_pool(task.env_config.get("customer")))
        return task

    def reference_pool(self, customer: str | None = None) -> ReferencePool:
        """The records of the domain's first :data:`POOL_TASKS` train tasks (built once per process). In a
        persistent suite, ``customer``'s records only (those of other customers describe another record); a
        customer no pool task is about (the ``ood`` ones) gets every customer's, which show the tools' formats."""
        tagged = cached_pool(f"{self.name}/tagged", self._build_pool)
        if customer is None:
            return tagged
        own = cached_pool(f"{self.name}/{customer}", lambda: ReferencePool.from_records(self._records_of(customer)))
        return own if len(own) else tagged

    def _records_of(self, customer: str) -> list[ReferenceExample]:
        return [r for who, r in self._pool_records() if who == customer]

    def _pool_records(self) -> list[tuple[str | None, ReferenceExample]]:
        """(customer, record) of the first :data:`POOL_TASKS` train tasks, in order (built once per process)."""
        records = getattr(self, "_tagged_records", None)
        if records is None:
            self._pool_build.records = []
            try:
                for i in range(POOL_TASKS):
                    self.make_task("train", i)
                records = self._tagged_records = list(self._pool_build.records)
            finally:
                self._pool_build.records = None
        return records

    def _build_pool(self) -> ReferencePool:
        return ReferencePool.from_records(r for _, r in self._pool_records())


def split_of(key: str) -> str:
    """The in-distribution split (train, val or test) a parameter combination belongs to (stable across runs and
    Python versions): with ``q, r = divmod(crc32(key), TEST_SHARE)``, ``test`` if r == 0 (as before ``val``
    existed), ``val`` if r == 1 and q % VAL_SHARE == 0, else ``train``. The ``ood`` split does not use it: its
    templates are held out as a whole."""
    q, r = divmod(zlib.crc32(key.encode("utf-8")), TEST_SHARE)
    if r == 0:
        return "test"
    return "val" if r == 1 and q % VAL_SHARE == 0 else "train"


def split_indices(n: int | None, seed: int) -> list[int]:
    """Which task indices a suite returns, the same for every split: 0..n-1 for seed 0, else n indices sampled
    with the seed (so ``n=None`` gives DEFAULT_N tasks of any split, ``ood`` included)."""
    n = DEFAULT_N if n is None else int(n)
    if n < 0 or n > INDEX_SPACE:
        raise ValueError(f"n must be in [0, {INDEX_SPACE}], got {n}")
    if seed == 0:
        return list(range(n))
    return random.Random(f"indices/{seed}").sample(range(INDEX_SPACE), n)
