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

- **Who writes the memory** is the suite option ``writer`` (``bfcl:memory_kv?writer=model``, :data:`WRITER_NOTES`;
  an unknown value is an error listing the valid ones). The default stays ``gold``: it needs no model before the
  questions, works with training and rehearsal, and its score is the questions' alone; ``model`` is BFCL's protocol
  and the one to compare with BFCL's leaderboard.
- **writer=model: BFCL's protocol.** A question is loaded not ready (``env_config["unprepared"]``, no memory);
  before the trials, evaluation (``envace.evaluation.trials.evaluate``, and before the private attempts of test-time
  rehearsal) calls :meth:`BFCLMemoryEnv.prepare`, which plays, per (category, scenario) of its questions, the
  scenario's prerequisite sessions in BFCL's order (the questions' ``depends_on``) with the model under test in
  the real memory environment (real mode, the evaluation's rollout settings; the step bound scaled to the turns,
  ``envace.evaluation.trials.player``): each session is a task (:func:`session_task`: its user turns, one after each
  text reply, as BFCL's multi-turn tasks; BFCL's memory prompt showing the memory it starts from; a fresh context),
  session i of every scenario in one batch. The backend's memory when a session ends (:func:`memory_after`: the
  outcome the rollout records in the environment its calls ran in) is the next session's initial memory, and the
  last one is every question's of the scenario (:func:`with_memory`: its prompt shows it). The sessions are never
  scored nor counted (``EvalResult.prepared`` keeps them; ``prepare/...`` metrics); a wrong call in them is an
  error observation; the step and context bounds are envace's (``max_steps_per_turn`` per user turn, where BFCL
  allows 20; ``max_context_tokens``), and a session cut by one leaves what it wrote, as BFCL flushes the memory
  of a session it force-quits (counted: ``prepare/truncated_rate``). The summary says the memory was the model's
  (:data:`MODEL_NOTE`). **Training and rehearsal** do not play them: a ``writer=model`` question outside an evaluation
  (``envace train``, a rehearsal or shadow rollout, a replay, SFT's gold trajectories) is refused with the reason
  (``envace.envs.require_prepared``, checked by every rollout and by ``make_env``); train with ``writer=gold``.
- **writer=gold (the default): not BFCL's score.** A scripted *gold writer* plays the prerequisite phase instead:
  per prerequisite session, in order, it stores the facts of that session that the dataset's possible answers
  cite (their ``source`` excerpts, each put in the session whose text matches it best: :func:`session_facts`)
  through the backend's own tools (kv: one ``archival_memory_add`` per session, keyed by the session's topic;
  rec_sum: one ``memory_append``), on a fresh backend, within BFCL's size limits. The resulting memory (what
  BFCL's snapshot file holds) is the scenario's initial memory for every question of it. So the score measures
  *using* a memory that holds the needed facts (retrieval, reading, the answer format), not writing it: it is
  **not comparable to BFCL's leaderboard memory score** (the summary says so: :data:`NOTE`).
- **Tools** are the category's function docs as BFCL shows them (``load_dataset_entry``), the backend is BFCL's
  class (``MemoryAPI_kv`` with its BM25 key search, ``MemoryAPI_rec_sum``), loaded with the snapshot by its own
  ``_load_scenario`` (its snapshot-file read swapped for the snapshot in ``env_config["memory"]``); a call runs
  as in the multi-turn adapter (:func:`envace.envs.bfcl.multi_turn.execute`: a bound method with keyword
  arguments; nothing is ``eval``-ed), so a wrong name or wrong arguments are error observations.
- **The system prompt** is the one BFCL's handler builds (its ``add_memory_instruction_system_prompt``, code
  unchanged, compiled from its source: its module imports ``tree_sitter``, which envace does not install) after
  the single-turn adapter's BFCL persona.
- **Scoring** (:func:`score_reply`): the last Act step without calls (a text reply, or output that did not parse:
  BFCL also takes the last message that does not decode) goes to BFCL's ``agentic_checker`` with the possible
  answers. No such step (the episode ended on calls or was cut): ``agentic:no_last_message``, as in BFCL; no
  generation at all: ``agentic:inference_error``.
- **Gold** (``gold_actions`` / ``gold_replies``): one read of the memory where the gold writer put the question's
  fact (kv: ``archival_memory_retrieve`` of its entry; rec_sum: ``memory_retrieve``), then BFCL's answer format
  with the first possible answer (with ``writer=model`` too: the read then names the gold memory's entry, so the
  call F1 against it says little). :func:`replay_gold` also says whether the read's result holds a possible answer
  (``agentic_checker`` on it): not every answer is written verbatim in the cited source.
- **Split**: ``test`` when a hash of the question (its index and scenario, shared by the two categories) falls in
  the lowest :data:`TEST_FRACTION`. All questions of a scenario share its memory, on either side.
- **memory_vector** is not offered: its backend loads a sentence-transformers model from the Hugging Face Hub
  when imported (:mod:`envace.envs.bfcl.v4` gives the reason).
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import re
import types
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import multi_turn
from . import single_turn

import bfcl_eval  # noqa: E402
from bfcl_eval.constants import default_prompts  # noqa: E402
from bfcl_eval.constants.eval_config import MEMORY_PREREQ_CONVERSATION_PATH  # noqa: E402
from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING  # noqa: E402
from bfcl_eval.eval_checker.agentic_eval.agentic_checker import agentic_checker  # noqa: E402
from bfcl_eval.utils import is_memory_prereq, load_dataset_entry, load_file, load_ground_truth_entry  # noqa: E402

from ...core.registry import Registry  # noqa: E402
from ...core.types import Step, Task, ToolCall, Trajectory, is_error_obs  # noqa: E402
from ..base import UNPREPARED, Environment, Play, Score  # noqa: E402
from ..references import digest  # noqa: E402
from ..suites import hash_split  # noqa: E402

CATEGORIES: tuple[str, ...] = ("memory_kv", "memory_rec_sum")
TEST_FRACTION = 0.3
SPLITS: tuple[str, ...] = ("train", "test", "all")
CHECKER = "bfcl.agentic_checker"
NOTE = (
    "the prerequisite conversations are not played by the model: the memory starts as envace's gold writer "
    "left it (the facts the possible answers cite), so the score is not BFCL's memory score"
)
"""What the summary says next to an evaluated memory category with the gold writer."""
MODEL_NOTE = (
    "writer=model: the model under test played the prerequisite conversations, each session starting from the "
    "memory the one before left, and the questions start from the last one's memory, as in BFCL"
)
"""What the summary says next to an evaluated memory category with the model writer."""
WRITER_NOTES: dict[str, str] = {"gold": NOTE, "model": MODEL_NOTE}
"""Who writes a scenario's memory (the suite option ``writer``; the first: the default) -> the summary's note."""
DEFAULT_WRITER = next(iter(WRITER_NOTES))


def check_writer(writer: str) -> str:
    """``writer`` if it is one of :data:`WRITER_NOTES`, else a ``ValueError`` listing the valid ones."""
    if writer not in WRITER_NOTES:
        raise ValueError(f"unknown BFCL memory writer {writer!r}; valid: {', '.join(WRITER_NOTES)}")
    return writer


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
        multi_turn._backend_class(backend_of(category))
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
    inst = multi_turn._backend_class(class_name)()
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
        obs = multi_turn.execute(instances, call)
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
    """One BFCL memory question, or one prerequisite session (``env_config["prerequisite"]``): BFCL's memory backend,
    loaded with the memory it starts from (``env_config["memory"]``; None: empty). A question's final reply is
    scored by BFCL's agentic checker (:func:`score_reply`); a session is not scored, its outcome is the memory it
    leaves (:func:`memory_after`). :meth:`prepare` plays the sessions of ``writer=model`` questions."""

    def __init__(self, task: Task):
        super().__init__(task)
        cfg = task.env_config
        self.instances = {cfg["backend"]: load_backend(cfg["backend"], cfg["memory"])}

    @classmethod
    def prepare(cls, tasks: list[Task], play: Play) -> list[Task]:
        """``writer=model`` questions with the memory the model under test wrote: per (category, scenario) of
        them, its prerequisite sessions (:func:`session_ids`) are played in order, session i of every scenario
        in one batch, each starting from the memory the one before left (the first: empty); each question
        starts from its scenario's last memory (:func:`with_memory`). Other tasks are returned as they are."""
        waiting = [(t.env_config["category"], t.env_config["scenario"]) for t in tasks if t.env_config.get(UNPREPARED)]
        chains = {key: session_ids(*key) for key in dict.fromkeys(waiting)}
        memory: dict[tuple[str, str], dict[str, Any] | None] = dict.fromkeys(chains)
        for i in range(max(map(len, chains.values()), default=0)):
            keys = [key for key, ids in chains.items() if i < len(ids)]
            played = play([session_task(key[0], chains[key][i], memory[key]) for key in keys])
            if len(played) != len(keys):
                raise ValueError(f"play returned {len(played)} trajectories for {len(keys)} sessions")
            for key, traj in zip(keys, played):
                memory[key] = memory_after(traj)
        return [
            with_memory(t, memory[(t.env_config["category"], t.env_config["scenario"])])
            if t.env_config.get(UNPREPARED)
            else t
            for t in tasks
        ]

    @staticmethod
    def initial_state_key(task: Task) -> str:
        return digest(
            {"env": "bfcl-memory", "backend": task.env_config["backend"], "memory": task.env_config["memory"]}
        )

    def _execute(self, call: ToolCall) -> Any:
        return multi_turn.execute(self.instances, call)

    def state(self) -> dict[str, Any]:
        return multi_turn.instances_state(self.instances)

    def score(self, traj: Trajectory) -> Score:
        cfg = self.task.env_config
        if cfg.get("prerequisite"):
            memory = snapshot_of(self.instances[cfg["backend"]])
            return Score(
                False, 0.0, {"prerequisite": "not scored: its outcome is the memory it leaves", "memory": memory}
            )
        return score_reply(cfg["possible_answer"], traj)


def memory_after(traj: Trajectory) -> dict[str, Any]:
    """The memory a prerequisite session left (what BFCL's snapshot file holds after it), from the outcome the
    rollout recorded in the environment its calls ran in (``Trajectory.env_outcome``)."""
    out = traj.env_outcome or {}
    memory = (out.get("details") or {}).get("memory")
    if memory is None:
        why = out.get("error") or "no real environment ran it"
        raise ValueError(f"{traj.task_id}: the prerequisite session left no memory snapshot ({why})")
    return memory


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
    return hash_split(f"bfcl-memory-{question_key(bfcl_id)}", TEST_FRACTION)


@functools.lru_cache(maxsize=None)
def _entries(category: str) -> list[dict]:
    """The category's entries as BFCL's loader gives them: the prerequisite sessions and the questions."""
    backend_of(category)
    return load_dataset_entry(category)


@functools.lru_cache(maxsize=None)
def _questions(category: str) -> list[dict]:
    """The category's questions (prerequisite sessions left out)."""
    return [e for e in _entries(category) if not is_memory_prereq(e["id"])]


@functools.lru_cache(maxsize=None)
def _sessions(category: str) -> dict[str, dict]:
    """The category's prerequisite sessions by id."""
    return {e["id"]: e for e in _entries(category) if is_memory_prereq(e["id"])}


@functools.lru_cache(maxsize=None)
def session_ids(category: str, scenario: str) -> tuple[str, ...]:
    """The ids of a scenario's prerequisite sessions in BFCL's order (what its questions ``depends_on``)."""
    chains = {tuple(q["depends_on"]) for q in _questions(category) if q["scenario"] == scenario}
    if len(chains) != 1 or not all(i in _sessions(category) for i in next(iter(chains), ())):
        raise ValueError(f"{category}/{scenario}: the questions do not depend on one known chain of sessions")
    return next(iter(chains))


def session_task(category: str, session_id: str, memory: dict[str, Any] | None) -> Task:
    """One prerequisite session as a task starting from ``memory`` (None: the empty memory of the first one): its
    user turns, the memory tools, BFCL's memory system prompt showing that memory's in-context part; not scored."""
    entry, backend = _sessions(category)[session_id], backend_of(category)
    scenario = entry["scenario"]
    question = _memory_prompt()(copy.deepcopy(entry["question"]), category, scenario, load_backend(backend, memory))
    first, *turns = [m for turn in question for m in turn]
    if first["role"] != "system" or {m["role"] for m in turns} != {"user"} or len(turns) != len(question):
        raise ValueError(f"{session_id}: expected BFCL's system message, then one user message per turn")
    return Task(
        id=session_id,
        env=f"bfcl:{category}",
        system_prompt=f"{single_turn.SYSTEM_PROMPT}\n\n{first['content']}",
        user_turns=[m["content"] for m in turns],
        tools=[multi_turn.tool_spec(d) for d in entry["function"]],
        env_config={
            "bfcl_id": session_id,
            "category": category,
            "scenario": scenario,
            "backend": backend,
            "memory": copy.deepcopy(memory),
            "prerequisite": True,
        },
        split="all",  # shared by the scenario's questions on either side
        metadata={
            "source": "bfcl-eval",
            "category": category,
            "scenario": scenario,
            "topic": entry.get("topic", ""),
            "session": session_ids(category, scenario).index(session_id),
        },
    )


@functools.lru_cache(maxsize=None)
def _answers() -> list[dict]:
    """The possible answers, aligned with the questions by index (as BFCL's evaluator aligns them)."""
    answers = load_ground_truth_entry("memory_kv")
    if [question_key(a["id"]) for a in answers] != [question_key(q["id"]) for q in _questions("memory_kv")]:
        raise ValueError("BFCL's memory questions and possible answers are not aligned")
    return answers


def unprepared_reason(scenario: str) -> str:
    """Why a ``writer=model`` question cannot run before :meth:`BFCLMemoryEnv.prepare`
    (``env_config["unprepared"]``)."""
    return (
        f"its memory is written by the model under test in the {scenario} scenario's prerequisite sessions "
        "(BFCL memory, writer=model), which evaluation plays first (envace.evaluation.trials.evaluate, envace eval); "
        "training, rehearsal and replays outside an evaluation do not: use writer=gold (the default) there"
    )


def convert_entry(
    entry: dict[str, Any],
    answer: dict[str, Any],
    category: str,
    writer: str = DEFAULT_WRITER,
    memory: dict[str, Any] | None = None,
) -> Task:
    """One BFCL memory question (as its loader gives it) and its possible answer -> Task. ``writer`` ``gold``: it
    starts from the gold writer's memory. ``model``: from ``memory`` (what the model under test wrote in the
    prerequisite sessions); without it the task is not ready (``env_config["unprepared"]``, its prompt showing the
    empty memory) until :meth:`BFCLMemoryEnv.prepare` gives it one. The gold read is the gold memory's either way."""
    backend, scenario = backend_of(category), entry["scenario"]
    gold = gold_memory(category, scenario)
    if check_writer(writer) == "gold":
        memory = gold
    question = _memory_prompt()(copy.deepcopy(entry["question"]), category, scenario, load_backend(backend, memory))
    ((first, *rest),) = question  # one turn: BFCL's system message, then the question
    if first["role"] != "system" or [m["role"] for m in rest] != ["user"]:
        raise ValueError(f"{entry['id']}: expected a system message and one user message")
    fact = fact_text(answer["source"])
    return Task(
        id=entry["id"],
        env=f"bfcl:{category}",
        system_prompt=f"{single_turn.SYSTEM_PROMPT}\n\n{first['content']}",
        user_turns=[rest[0]["content"]],
        tools=[multi_turn.tool_spec(d) for d in entry["function"]],
        env_config={
            "bfcl_id": entry["id"],
            "category": category,
            "scenario": scenario,
            "backend": backend,
            "writer": writer,
            "memory": memory,
            "possible_answer": list(answer["ground_truth"]),
        }
        | ({UNPREPARED: unprepared_reason(scenario)} if memory is None else {}),
        gold_actions=[[WRITERS.get(backend).read(gold, fact)]],
        gold_replies=[gold_reply(answer["ground_truth"][0])],
        split=split_of(entry["id"]),
        metadata={
            "source": "bfcl-eval",
            "category": category,
            "scenario": scenario,
            "answer_source": answer["source"],
            "prerequisite": f"{writer} writer (envace.envs.bfcl_memory): " + WRITER_NOTES[writer],
        },
    )


def with_memory(task: Task, memory: dict[str, Any]) -> Task:
    """A ``writer=model`` question ready to run from ``memory`` (its prompt showing it), the rest as it was."""
    category, bfcl_id = task.env_config["category"], task.env_config["bfcl_id"]
    ((entry, answer),) = [(q, a) for q, a in zip(_questions(category), _answers()) if q["id"] == bfcl_id]
    return convert_entry(entry, answer, category, "model", memory)


def entry_ids(category: str, split: str) -> list[str]:
    """The ids of a category's questions in ``split`` (train / test / all), in dataset order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for BFCL; valid: {', '.join(SPLITS)}")
    return [e["id"] for e in _questions(category) if split == "all" or split_of(e["id"]) == split]


def load_category(category: str, ids: list[str] | None = None, writer: str = DEFAULT_WRITER) -> list[Task]:
    """The category's tasks (those of ``ids``, in dataset order; None: all), their memory written by ``writer``
    (:data:`WRITER_NOTES`; ``model``: not ready before :meth:`BFCLMemoryEnv.prepare`)."""
    check_writer(writer)
    keep = None if ids is None else set(ids)
    return [
        convert_entry(q, a, category, writer)
        for q, a in zip(_questions(category), _answers())
        if keep is None or q["id"] in keep
    ]
