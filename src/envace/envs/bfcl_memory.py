"""BFCL-v4's agentic memory categories ``memory_kv`` and ``memory_rec_sum`` (155 questions each) as envace tasks,
scored by BFCL's own ``agentic_checker`` on the final reply.

**How BFCL runs them.** Per scenario (customer, student, finance, healthcare, notetaker) the model under test
first plays 5-10 *prerequisite conversations* (``data/memory_prereq_conversation``: user turns only, each
session a fresh context) with the memory backend's tools; after each, BFCL flushes the backend's memory to a
snapshot file and the next session (and finally every question of the scenario) starts from it. A question is
one user turn, answered in several steps; the system prompt (``add_memory_instruction_system_prompt``) sets the
scenario and shows the memory's in-context part (kv: the core memory; rec_sum: the whole memory); BFCL's
agentic response format is asked for. The checker looks for one of the possible answers in the last message that
is not a call (``agentic_checker``: normalised, word-bounded containment).

**What envace does, and where it departs.**

- **The prerequisite phase is not played by the model.** BFCL needs the model under test to write the memory,
  and envace runs one independent episode per task, with no chained sessions. Here a scripted *gold writer*
  plays it instead: per prerequisite session, in order, it stores the facts of that session that the dataset's
  possible answers cite (their ``source`` excerpts, each put in the session whose text matches it best:
  :func:`session_facts`) through the backend's own tools (kv: one ``archival_memory_add`` per session, keyed by
  the session's topic; rec_sum: one ``memory_append``), on a fresh backend, within BFCL's size limits. The
  resulting memory (what BFCL's snapshot file holds) is the scenario's initial memory for every question of it.
  So the score measures *using* a memory that holds the needed facts (retrieval, reading, the answer format),
  not writing it: it is **not comparable to BFCL's leaderboard memory score** (the summary says so).
- **Tools** are the category's function docs as BFCL shows them (``load_dataset_entry``), the backend is BFCL's
  class (``MemoryAPI_kv`` with its BM25 key search, ``MemoryAPI_rec_sum``), loaded with the snapshot by its own
  ``_load_scenario`` (its snapshot-file read swapped for the snapshot in ``env_config["memory"]``); a call runs
  as in the multi-turn adapter (:func:`envace.envs.bfcl.execute`: a bound method with keyword arguments; nothing
  is ``eval``-ed), so a wrong name or wrong arguments are error observations.
- **The system prompt** is the one BFCL's handler builds (its ``add_memory_instruction_system_prompt``, code
  unchanged, compiled from its source: its module imports ``tree_sitter``, which envace does not install) after
  the single-turn adapter's BFCL persona.
- **Scoring** (:func:`score_reply`): the last Act step without calls (a text reply, or output that did not parse:
  BFCL also takes the last message that does not decode) goes to BFCL's ``agentic_checker`` with the possible
  answers. No such step (the episode ended on calls or was cut): ``agentic:no_last_message``, as in BFCL; no
  generation at all: ``agentic:inference_error``.
- **Gold** (``gold_actions`` / ``gold_replies``): one read of the memory where the writer put the question's fact
  (kv: ``archival_memory_retrieve`` of its entry; rec_sum: ``memory_retrieve``), then BFCL's answer format with
  the first possible answer. :func:`replay_gold` also says whether the read's result holds a possible answer
  (``agentic_checker`` on it): not every answer is written verbatim in the cited source.
- **Split**: ``test`` when a hash of the question (its index and scenario, shared by the two categories) falls in
  the lowest :data:`TEST_FRACTION`. All questions of a scenario share its memory, on either side.
- **memory_vector** is not offered: its backend loads a sentence-transformers model from the Hugging Face Hub
  when imported (:mod:`envace.envs.bfcl_v4` gives the reason).
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import importlib
import re
import types
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import bfcl, bfcl_single

import bfcl_eval  # noqa: E402
from bfcl_eval.constants import default_prompts  # noqa: E402
from bfcl_eval.constants.eval_config import MEMORY_PREREQ_CONVERSATION_PATH  # noqa: E402
from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING  # noqa: E402
from bfcl_eval.eval_checker.agentic_eval.agentic_checker import agentic_checker  # noqa: E402
from bfcl_eval.utils import is_memory_prereq, load_dataset_entry, load_file, load_ground_truth_entry  # noqa: E402

from ..registry import Registry  # noqa: E402
from ..types import Step, Task, ToolCall, Trajectory, is_error_obs  # noqa: E402
from .base import Environment, Score  # noqa: E402
from .references import digest  # noqa: E402

CATEGORIES: tuple[str, ...] = ("memory_kv", "memory_rec_sum")
TEST_FRACTION = 0.3
SPLITS: tuple[str, ...] = ("train", "test", "all")
CHECKER = "bfcl.agentic_checker"
NOTE = (
    "the prerequisite conversations are not played by the model: the memory starts as envace's gold writer "
    "left it (the facts the possible answers cite), so the score is not BFCL's memory score"
)
"""What the summary says next to an evaluated memory category."""


# ------------------------------------------------------------------------------- BFCL's code, privately


def bfcl_function(path: Path, name: str, namespace: dict[str, Any]) -> types.FunctionType:
    """BFCL's top-level function ``name`` of the source file ``path``, its code unchanged, compiled alone into
    ``namespace`` (for a module whose top-level imports are not installed)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    glb = dict(namespace)
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), glb)  # BFCL's source, not model output
    return glb[name]


@functools.lru_cache(maxsize=None)
def _memory_prompt() -> Callable[..., list[list[dict]]]:
    """BFCL's ``add_memory_instruction_system_prompt`` (``bfcl_eval.model_handler.utils``)."""
    path = Path(bfcl_eval.__file__).parent / "model_handler" / "utils.py"
    return bfcl_function(path, "add_memory_instruction_system_prompt", vars(default_prompts))


def backend_import_error(category: str) -> str | None:
    """Why the category's backend does not import here (a missing package), or None when it does."""
    try:
        bfcl._backend_class(backend_of(category))
    except ImportError as e:
        return f"{type(e).__name__}: {e}"
    return None


def backend_of(category: str) -> str:
    """The category's backend class, as BFCL's loader names it (``memory_kv`` -> ``MemoryAPI_kv``)."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL memory category {category!r}; valid: {', '.join(CATEGORIES)}")
    return f"MemoryAPI_{category[len('memory_') :]}"


def load_backend(class_name: str, snapshot: dict[str, Any] | None) -> Any:
    """A fresh BFCL memory backend loaded by its own ``_load_scenario`` from ``snapshot`` (what BFCL's snapshot
    file holds; None: a clean start, as BFCL's first prerequisite session has)."""
    inst = bfcl._backend_class(class_name)()
    inst._prepare_snapshot = lambda initial_config: copy.deepcopy(snapshot)  # BFCL reads the snapshot file here
    inst._load_scenario({})
    del inst._prepare_snapshot
    return inst


def snapshot_of(inst: Any) -> dict[str, Any]:
    """The memory of a backend as BFCL's ``_flush_memory_to_local_file`` writes it (its public data fields)."""
    return copy.deepcopy({k: v for k, v in vars(inst).items() if not k.startswith("_") and k != "snapshot_folder"})


# ------------------------------------------------------------------------------------------- the writer


def _norm(text: str) -> str:
    """Lower-case words and digits only, curly quotes and dashes folded (to match excerpts to sessions)."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = text.translate(str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"'}))
    return " ".join(re.findall(r"[a-z0-9]+", text.replace("'", "")))


def fact_text(source: str) -> str:
    """A cited source as it is stored: stripped of its outer quotes (its ``...`` elisions kept)."""
    return source.strip().strip("\"'\u201c\u201d").strip()


def _match(source: str, session_text: str) -> tuple[int, float]:
    """(excerpt parts found verbatim, share of the excerpt's words found) of a source in a session's text."""
    parts = [_norm(p) for p in re.split(r"\.\.\.|\u2026", fact_text(source))]
    parts = [p for p in parts if p]
    words = {w for p in parts for w in p.split()}
    have = set(session_text.split())
    found = sum(f" {p} " in f" {session_text} " for p in parts)
    return found, (len(words & have) / len(words) if words else 0.0)


@dataclass(frozen=True)
class Session:
    """One prerequisite conversation of a scenario and the facts the gold writer stores from it."""

    id: str
    topic: str
    facts: tuple[str, ...]


@functools.lru_cache(maxsize=None)
def session_facts(scenario: str) -> tuple[Session, ...]:
    """The scenario's prerequisite sessions in order, each with the cited sources of the scenario's questions
    that match it best (:func:`_match`: most excerpt parts verbatim, then most words; ties: the earlier session),
    in dataset order, without repeats."""
    sessions = load_file(MEMORY_PREREQ_CONVERSATION_PATH / f"memory_{scenario}.json")
    texts = [_norm(" ".join(m["content"] for turn in s["question"] for m in turn)) for s in sessions]
    facts: list[list[str]] = [[] for _ in sessions]
    for q, a in zip(_questions("memory_kv"), _answers()):
        if q["scenario"] != scenario:
            continue
        scores = [_match(a["source"], t) for t in texts]
        best = max(range(len(texts)), key=lambda i: (scores[i], -i))
        fact = fact_text(a["source"])
        if fact and fact not in facts[best]:
            facts[best].append(fact)
    return tuple(Session(s["id"], s.get("topic", ""), tuple(f)) for s, f in zip(sessions, facts))


def topic_key(topic: str, taken: set[str]) -> str:
    """A snake_case key for a session topic that BFCL's kv backend accepts (``^[a-z]+(_[a-z0-9]+)*$``), unique
    among ``taken``."""
    words = _norm(topic).split() or ["session"]
    if not words[0].isalpha():
        words = ["session", *words]
    key, n = "_".join(words), 2
    while key in taken:
        key, n = f"{'_'.join(words)}_{n}", n + 1
    return key


def _chunks(lines: list[str], limit: int) -> list[str]:
    """Lines joined by newlines into pieces of at most ``limit`` characters (a longer line is cut)."""
    out: list[str] = []
    for line in (x[:limit] for x in lines):
        if out and len(out[-1]) + 1 + len(line) <= limit:
            out[-1] += "\n" + line
        else:
            out.append(line)
    return out


def kv_writes(sessions: tuple[Session, ...]) -> list[ToolCall]:
    """kv: per session with facts, one archival entry keyed by its topic (more when over BFCL's entry limit)."""
    limit = importlib.import_module(CLASS_FILE_PATH_MAPPING["MemoryAPI_kv"]).MAX_ARCHIVAL_MEMORY_ENTRY_LENGTH
    calls, taken = [], set()
    for s in sessions:
        for piece in _chunks([f"- {f}" for f in s.facts], limit):
            key = topic_key(s.topic, taken)
            taken.add(key)
            calls.append(ToolCall(name="archival_memory_add", arguments={"key": key, "value": piece}))
    return calls


def rec_sum_writes(sessions: tuple[Session, ...]) -> list[ToolCall]:
    """rec_sum: per session with facts, one append of its topic and facts."""
    return [
        ToolCall(
            name="memory_append", arguments={"text": f"{s.topic}:\n" + "".join(f"- {f}\n" for f in s.facts) + "\n"}
        )
        for s in sessions
        if s.facts
    ]


def kv_read(snapshot: dict[str, Any], fact: str) -> ToolCall:
    key = next((k for k, v in snapshot["archival_memory"].items() if fact in v), None)
    if key is None:
        raise ValueError(f"the gold memory has no entry with the fact {fact[:80]!r}")
    return ToolCall(name="archival_memory_retrieve", arguments={"key": key})


def rec_sum_read(snapshot: dict[str, Any], fact: str) -> ToolCall:
    return ToolCall(name="memory_retrieve", arguments={})


@dataclass(frozen=True)
class Writer:
    """The gold path of one memory backend."""

    writes: Callable[[tuple[Session, ...]], list[ToolCall]]
    """The prerequisite sessions -> the calls that store their facts."""
    read: Callable[[dict[str, Any], str], ToolCall]
    """(the written memory, a question's fact) -> the call that reads that fact back."""


WRITERS: Registry[Writer] = Registry("BFCL memory writer")
WRITERS.add("MemoryAPI_kv", Writer(kv_writes, kv_read))
WRITERS.add("MemoryAPI_rec_sum", Writer(rec_sum_writes, rec_sum_read))


@functools.lru_cache(maxsize=None)
def _gold_memory(category: str, scenario: str) -> dict[str, Any]:
    backend = backend_of(category)
    instances = {backend: load_backend(backend, None)}
    for call in WRITERS.get(backend).writes(session_facts(scenario)):
        obs = bfcl.execute(instances, call)
        if is_error_obs(obs):
            raise ValueError(f"{category}/{scenario}: the gold writer's {call.name} failed: {obs['error']['message']}")
    return snapshot_of(instances[backend])


def gold_memory(category: str, scenario: str) -> dict[str, Any]:
    """The memory the gold writer leaves for a scenario (built once per process; a copy)."""
    return copy.deepcopy(_gold_memory(category, scenario))


# ------------------------------------------------------------------------------------------- scoring


def final_message(traj: Trajectory) -> str | None:
    """The text of the trajectory's last Act step without calls (a reply, or output that did not parse), or None."""
    for step in reversed(traj.steps):
        if not step.calls:
            return step.reply if step.reply is not None else step.action_text
    return None


def score_reply(possible_answers: list[str], traj: Trajectory) -> Score:
    """BFCL's agentic check of a trajectory's final message against the possible answers (see the docstring)."""

    def failed(error_type: str, message: str) -> Score:
        return Score(
            False, 0.0, {"checker": CHECKER, "valid": False, "error_type": error_type, "error_message": message}
        )

    if not traj.steps:
        return failed("agentic:inference_error", "no Act generation: the trajectory ended before its first response")
    message = final_message(traj)
    if message is None:
        return failed("agentic:no_last_message", "Cannot find the last chat message that is not a function call.")
    try:
        result = agentic_checker(message, list(possible_answers))
    except Exception as e:  # noqa: BLE001 - a failed check, never a crash of the rollout
        return failed("checker_exception", f"{type(e).__name__}: {str(e)[:300]}")
    if result.get("valid"):
        return Score(True, 1.0, {"checker": CHECKER, "valid": True})
    return failed(str(result.get("error_type", "")), str(result.get("error_message", ""))[:500])


class BFCLMemoryEnv(Environment):
    """One BFCL memory question: BFCL's memory backend, loaded with the scenario's memory (``env_config["memory"]``);
    the final reply is scored by BFCL's agentic checker (:func:`score_reply`)."""

    def __init__(self, task: Task):
        super().__init__(task)
        cfg = task.env_config
        self.instances = {cfg["backend"]: load_backend(cfg["backend"], cfg["memory"])}

    @staticmethod
    def initial_state_key(task: Task) -> str:
        return digest(
            {"env": "bfcl-memory", "backend": task.env_config["backend"], "memory": task.env_config["memory"]}
        )

    def _execute(self, call: ToolCall) -> Any:
        return bfcl.execute(self.instances, call)

    def state(self) -> dict[str, Any]:
        return bfcl.instances_state(self.instances)

    def score(self, traj: Trajectory) -> Score:
        return score_reply(self.task.env_config["possible_answer"], traj)


def gold_reply(answer: str) -> str:
    """A final answer in BFCL's agentic response format."""
    return str({"answer": answer, "context": "Retrieved from my memory of our earlier conversations."})


@dataclass(frozen=True)
class GoldReplay:
    score: Score
    """BFCL's check of the gold path's final reply."""
    answer_in_memory: bool
    """Whether the gold read's result holds a possible answer (``agentic_checker`` on its text)."""


def replay_gold(task: Task) -> GoldReplay:
    """The task's gold path (its read, then its reply) in a fresh environment, scored as a model's would be."""
    env = BFCLMemoryEnv(task)
    calls = task.flat_gold()
    obs = [env.call(c) for c in calls]
    reply = task.gold_replies[0]
    steps = [Step(user_turn=0, action_text="", calls=calls, observations=obs, sources=["real"] * len(calls))]
    steps.append(Step(user_turn=0, action_text=reply, reply=reply))
    traj = Trajectory(id=f"{task.id}/gold", task_id=task.id, group_id="gold", mode="real", steps=steps)
    held = agentic_checker(" ".join(_strings(obs)), list(task.env_config["possible_answer"]))
    return GoldReplay(env.score(traj), bool(held.get("valid")) and not any(is_error_obs(o) for o in obs))


def _strings(x: Any) -> list[str]:
    """The string leaves of a JSON value, in order."""
    if isinstance(x, str):
        return [x]
    if isinstance(x, dict):
        return [s for v in x.values() for s in _strings(v)]
    if isinstance(x, list):
        return [s for v in x for s in _strings(v)]
    return []


# -------------------------------------------------------------------------------------------- tasks


def question_key(bfcl_id: str) -> str:
    """The part of a memory question's id the two categories share (``memory_kv_0-customer-0`` -> ``0-customer-0``)."""
    return bfcl_id.rsplit("_", 1)[1]


def split_of(bfcl_id: str) -> str:
    """``test`` for about :data:`TEST_FRACTION` of the questions (hash of :func:`question_key`), else ``train``."""
    h = int(hashlib.sha256(f"bfcl-memory-{question_key(bfcl_id)}".encode()).hexdigest()[:8], 16)
    return "test" if h / 2**32 < TEST_FRACTION else "train"


@functools.lru_cache(maxsize=None)
def _questions(category: str) -> list[dict]:
    """The category's questions as BFCL's loader gives them (prerequisite sessions left out)."""
    backend_of(category)
    return [e for e in load_dataset_entry(category) if not is_memory_prereq(e["id"])]


@functools.lru_cache(maxsize=None)
def _answers() -> list[dict]:
    """The possible answers, aligned with the questions by index (as BFCL's evaluator aligns them)."""
    answers = load_ground_truth_entry("memory_kv")
    if [question_key(a["id"]) for a in answers] != [question_key(q["id"]) for q in _questions("memory_kv")]:
        raise ValueError("BFCL's memory questions and possible answers are not aligned")
    return answers


def convert_entry(entry: dict[str, Any], answer: dict[str, Any], category: str) -> Task:
    """One BFCL memory question (as its loader gives it) and its possible answer -> Task."""
    backend, scenario = backend_of(category), entry["scenario"]
    memory = gold_memory(category, scenario)
    question = _memory_prompt()(copy.deepcopy(entry["question"]), category, scenario, load_backend(backend, memory))
    ((first, *rest),) = question  # one turn: BFCL's system message, then the question
    if first["role"] != "system" or [m["role"] for m in rest] != ["user"]:
        raise ValueError(f"{entry['id']}: expected a system message and one user message")
    fact = fact_text(answer["source"])
    return Task(
        id=entry["id"],
        env=f"bfcl:{category}",
        system_prompt=f"{bfcl_single.SYSTEM_PROMPT}\n\n{first['content']}",
        user_turns=[rest[0]["content"]],
        tools=[bfcl.tool_spec(d) for d in entry["function"]],
        env_config={
            "bfcl_id": entry["id"],
            "category": category,
            "scenario": scenario,
            "backend": backend,
            "memory": memory,
            "possible_answer": list(answer["ground_truth"]),
        },
        gold_actions=[[WRITERS.get(backend).read(memory, fact)]],
        gold_replies=[gold_reply(answer["ground_truth"][0])],
        split=split_of(entry["id"]),
        metadata={
            "source": "bfcl-eval",
            "category": category,
            "scenario": scenario,
            "answer_source": answer["source"],
            "prerequisite": "gold writer (envace.envs.bfcl_memory): " + NOTE,
        },
    )


def entry_ids(category: str, split: str) -> list[str]:
    """The ids of a category's questions in ``split`` (train / test / all), in dataset order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for BFCL; valid: {', '.join(SPLITS)}")
    return [e["id"] for e in _questions(category) if split == "all" or split_of(e["id"]) == split]


def load_category(category: str, ids: list[str] | None = None) -> list[Task]:
    """The category's tasks (those of ``ids``, in dataset order; None: all)."""
    keep = None if ids is None else set(ids)
    return [
        convert_entry(q, a, category)
        for q, a in zip(_questions(category), _answers())
        if keep is None or q["id"] in keep
    ]
