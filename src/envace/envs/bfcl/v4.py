"""BFCL-v4 as its leaderboard reports it: every scoring category under the suite name ``bfcl``, and BFCL's own
summary table (non-live, live, multi-turn, agentic, overall) after an evaluation.

**Suite specs** (``load_tasks``, ``envace eval --suite``):

- ``bfcl``: the four multi-turn categories, as before (training configs name it).
- ``bfcl:<selection>[,<selection>...]``: a selection is a category (``simple_python``, ``multi_turn_base``, ...)
  or one of BFCL's collections (``TEST_COLLECTION_MAPPING``): ``all`` (BFCL's ``all_scoring``; the non-scoring
  ``format_sensitivity`` is not offered), ``single_turn``, ``non_live``, ``live``, ``multi_turn``, ``agentic``,
  ``memory``, ``web_search``, ``python``, ``non_python``. An unknown name is an error listing the valid ones.
- ``bfcl:<selection>?<option>=<value>[&...]``: suite options (:data:`OPTIONS`), each taken by the kinds of
  category that name it (:attr:`Kind.options`): ``writer`` = ``gold`` (default) | ``model``, who writes the memory
  categories' memory (``bfcl:memory?writer=model``: the model under test plays BFCL's prerequisite sessions,
  :mod:`envace.envs.bfcl.memory`). An unknown option or value, or an option no selected category takes, is an
  error listing the valid ones.

**Categories** (:data:`CATEGORIES`): the single-turn ones are :mod:`envace.envs.bfcl.single_turn`'s, the multi-turn ones
:mod:`envace.envs.bfcl.multi_turn`'s (unchanged), ``memory_kv`` and ``memory_rec_sum`` :mod:`envace.envs.bfcl.memory`'s
(by default their prerequisite conversations are not played by the model: a gold writer fills the memory, so their
scores are not BFCL's memory scores, and the summary says so; with ``?writer=model`` the model under test plays them
before the questions, as in BFCL: :meth:`BFCLEnvs.prepare`, called by evaluation). The other agentic ones are
**unavailable** here, each with its reason (:func:`unavailable`): web search needs the internet; ``memory_vector`` loads
a sentence-transformers embedding model from the Hugging Face Hub when imported (it is never imported here); a memory
backend that does not import (the bfcl extra's ``overrides`` / ``rank-bm25`` missing) makes its category unavailable,
the reason being the actual import error (checked when asked). A selection skips its unavailable categories (the summary
names them); a selection with no available category is an error that says why.

**Loading**: the (category, entry) pairs of the selection and split, in selection order then dataset order; with
``n`` a seeded sample of them, converted in that order (the same rule as
:func:`envace.envs.bfcl.multi_turn.load_bfcl_tasks`, so ``bfcl:multi_turn_base`` gives the same tasks as before).

**The summary** (:func:`summary`, in :data:`envace.envs.registry.SUMMARIES`; ``envace eval`` prints it after the
metrics): a category's accuracy is the mean success over its evaluated tasks and trials; BFCL's own
``generate_leaderboard_csv`` (a private copy, code unchanged: its CSV writer swapped for a collector, no print, no
W&B upload) combines the categories with BFCL's weighting. In bfcl_eval 2026.3.23: non-live = mean of simple
(itself the mean of Python, Java, JavaScript), multiple, parallel, parallel-multiple; live = the four live AST
categories weighted by size; irrelevance = mean of irrelevance and live_irrelevance; multi-turn = mean of the
four; agentic = mean of web search (mean of two) and memory (mean of three); overall = 10% non-live, 10% live,
10% irrelevance, 30% multi-turn, 40% agentic (relevance is shown, not weighted). A category's weight
(``total_count``) is its full size, as in a full BFCL run, also when a split or a sample was evaluated (then
its accuracy is the sample's). A category not evaluated counts 0 in the overall and shows "N/A", as in BFCL; the
table says why (unavailable, with the reason, or not in this evaluation). An evaluated category with a note (memory:
who wrote the memory, from the suite spec's ``writer``; with the gold writer, that the score is not BFCL's) has
it printed under the table (``categories[c]["note"]``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import random
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from . import multi_turn
from . import memory
from . import single_turn

from bfcl_eval.constants.category_mapping import (  # noqa: E402
    ALL_SCORING_CATEGORIES,
    MEMORY_CATEGORY,
    MULTI_TURN_CATEGORY,
    SINGLE_TURN_CATEGORY,
    TEST_COLLECTION_MAPPING,
    WEB_SEARCH_CATEGORY,
)

from ...core.registry import Registry  # noqa: E402
from ...core.types import Task  # noqa: E402
from ..base import Environment, Play, prepare_groups  # noqa: E402
from ..registry import ENVS, SUITES, SUMMARIES  # noqa: E402
from ..references import assign  # noqa: E402

# ------------------------------------------------------------------------------------------- categories


@dataclass(frozen=True)
class Kind:
    """How the categories of one kind become tasks and environments."""

    ids: Callable[[str, str], list[str]]
    """(category, split) -> the ids of its entries in that split, in dataset order."""
    tasks: Callable[[str, list[str]], list[Task]]
    """(category, ids) -> their tasks, in dataset order."""
    env: type[Environment]
    """The environment class of its tasks."""
    options: tuple[str, ...] = ()
    """The suite options (:data:`OPTIONS`) its ``tasks`` takes as keyword arguments."""


def _multi_turn_ids(category: str, split: str) -> list[str]:
    if split not in multi_turn.SPLITS:
        raise ValueError(f"unknown split {split!r} for BFCL; valid: {', '.join(multi_turn.SPLITS)}")
    return [
        e["id"] for e in multi_turn._raw_entries(category)[0] if split == "all" or multi_turn.split_of(e["id"]) == split
    ]


def _multi_turn_tasks(category: str, ids: list[str]) -> list[Task]:
    entries, answers = multi_turn._raw_entries(category)
    keep = set(ids)
    tasks = [multi_turn.convert_entry(e, answers[e["id"]], category) for e in entries if e["id"] in keep]
    return assign(tasks, lambda t: multi_turn.reference_pool(category))


KINDS: Registry[Kind] = Registry("BFCL category kind")
KINDS.add("single_turn", Kind(single_turn.entry_ids, single_turn.load_category, single_turn.BFCLSingleEnv))
KINDS.add("multi_turn", Kind(_multi_turn_ids, _multi_turn_tasks, multi_turn.BFCLEnv))
KINDS.add("memory", Kind(memory.entry_ids, memory.load_category, memory.BFCLMemoryEnv, options=("writer",)))

OPTIONS: dict[str, tuple[str, ...]] = {"writer": tuple(memory.WRITER_NOTES)}
"""The suite options (``bfcl:<selection>?name=value[&name=value]``) -> their valid values, the default first:
``writer``, who writes the memory categories' memory (:mod:`envace.envs.bfcl.memory`)."""


def _web_search_reason() -> str:
    return (
        "unavailable offline: BFCL's web-search backend queries the internet "
        "(SerpAPI's DuckDuckGo engine) and fetches the pages it finds"
    )


def _memory_reason(category: str) -> str | None:
    error = memory.backend_import_error(category)
    if error is None:
        return None
    return (
        f"unavailable: the installed bfcl_eval's {category} backend does not import here ({error}; "
        "install the bfcl extra: bash requirements/install-bench-envs.sh <python>)"
    )


def _memory_vector_reason() -> str:
    missing = [m for m in ("overrides", "sentence_transformers", "faiss") if importlib.util.find_spec(m) is None]
    why = (
        "unavailable offline: BFCL's memory_vector backend loads the sentence-transformers embedding model "
        "all-MiniLM-L6-v2 from the Hugging Face Hub when it is imported, and needs faiss"
    )
    return why + (f" (not installed here: {', '.join(missing)})" if missing else "")


@dataclass(frozen=True)
class Category:
    """One BFCL scoring category: its kind in :data:`KINDS`, or why it is unavailable."""

    name: str
    kind: str | None = None
    why: Callable[[], str | None] | None = field(default=None, compare=False)
    """Why it cannot run here, asked when needed (an import probe; its None: it can); needed without a ``kind``."""
    note: Callable[[dict[str, str]], str] | None = field(default=None, compare=False)
    """The suite options (:func:`options_of`) -> what the summary says next to the category's score: where envace's
    run departs from BFCL's, or how it was run (memory: who wrote the memory)."""


CATEGORIES: Registry[Category] = Registry("BFCL category")
for _name in ALL_SCORING_CATEGORIES:
    if _name in SINGLE_TURN_CATEGORY:
        CATEGORIES.add(_name, Category(_name, kind="single_turn"))
    elif _name in MULTI_TURN_CATEGORY:
        CATEGORIES.add(_name, Category(_name, kind="multi_turn"))
    elif _name in WEB_SEARCH_CATEGORY:
        CATEGORIES.add(_name, Category(_name, why=_web_search_reason))
    elif _name == "memory_vector":
        CATEGORIES.add(_name, Category(_name, why=_memory_vector_reason))
    elif _name in memory.CATEGORIES:
        why = functools.partial(_memory_reason, _name)
        note = lambda options: memory.WRITER_NOTES[options["writer"]]  # noqa: E731
        CATEGORIES.add(_name, Category(_name, kind="memory", why=why, note=note))
    else:  # a category a later bfcl_eval adds
        CATEGORIES.add(_name, Category(_name, why=lambda: "not supported by envace's BFCL adapter yet"))
assert tuple(MULTI_TURN_CATEGORY) == multi_turn.CATEGORIES and tuple(SINGLE_TURN_CATEGORY) == single_turn.CATEGORIES
assert set(MEMORY_CATEGORY) == {*memory.CATEGORIES, "memory_vector"}

COLLECTIONS: dict[str, list[str]] = {
    name: [c for c in cats if c in CATEGORIES]
    for name, cats in TEST_COLLECTION_MAPPING.items()
    if name not in ("all", "all_scoring")
}
COLLECTIONS["all"] = list(ALL_SCORING_CATEGORIES)


def unavailable(category: str) -> str | None:
    """Why ``category`` cannot be run here, or None when it can."""
    cat = CATEGORIES.get(category)
    why = cat.why() if cat.why else None
    return why if cat.kind is not None else (why or "unavailable")


def _parts(spec: str) -> tuple[str, str]:
    """(selection, options) of a suite spec: ``bfcl:memory?writer=model`` -> ``("memory", "writer=model")``."""
    selection, _, options = (spec.split(":", 1)[1] if ":" in spec else "").partition("?")
    return selection, options


def given_options(spec: str) -> dict[str, str]:
    """The suite options (:data:`OPTIONS`) a spec sets; an unknown name or value is an error listing the valid ones."""
    out: dict[str, str] = {}
    for item in (x.strip() for x in _parts(spec)[1].split("&") if x.strip()):
        name, _, value = (x.strip() for x in item.partition("="))
        if name not in OPTIONS:
            raise ValueError(f"unknown BFCL suite option {name!r} in {spec!r}; valid options: {', '.join(OPTIONS)}")
        if value not in OPTIONS[name]:
            raise ValueError(f"unknown BFCL {name} {value!r} in {spec!r}; valid: {', '.join(OPTIONS[name])}")
        out[name] = value
    return out


def options_of(spec: str) -> dict[str, str]:
    """Every suite option of a spec, the defaults filled in (:func:`given_options`)."""
    return {name: values[0] for name, values in OPTIONS.items()} | given_options(spec)


def categories_of(spec: str) -> list[str]:
    """The categories a suite spec selects, in order (see the module docstring); ``bfcl`` is the multi-turn four."""
    rest = _parts(spec)[0]
    if not rest.strip():
        return list(multi_turn.CATEGORIES)
    out: list[str] = []
    for name in (s.strip() for s in rest.split(",") if s.strip()):
        if name in COLLECTIONS:
            out += COLLECTIONS[name]
        elif name in CATEGORIES:
            out.append(name)
        else:
            raise ValueError(
                f"unknown BFCL category or collection {name!r}; valid collections: {', '.join(sorted(COLLECTIONS))}; "
                f"valid categories: {', '.join(CATEGORIES.names())}"
            )
    return list(dict.fromkeys(out))


def load_bfcl_v4_tasks(spec: str, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
    """The tasks of the categories ``spec`` selects (unavailable ones skipped) and ``split`` (train / test / all);
    with ``n`` a seeded sample of them, in selection then dataset order. An option (``?writer=model``) that none of
    the selected categories takes is an error."""
    cats, options, given = categories_of(spec), options_of(spec), set(given_options(spec))
    taken = {o for c in cats if CATEGORIES.get(c).kind for o in KINDS.get(CATEGORIES.get(c).kind).options}
    if given - taken:
        raise ValueError(f"{spec}: no selected BFCL category takes the option {', '.join(sorted(given - taken))}")
    runnable = [c for c in cats if unavailable(c) is None]
    if not runnable:
        raise ValueError(
            f"{spec}: no selected BFCL category can run here: " + "; ".join(f"{c}: {unavailable(c)}" for c in cats)
        )
    chosen = [(c, i) for c in runnable for i in KINDS.get(CATEGORIES.get(c).kind).ids(c, split)]
    if n is not None and n < len(chosen):
        chosen = [chosen[i] for i in sorted(random.Random(seed).sample(range(len(chosen)), n))]
    by_category: dict[str, list[str]] = {}
    for c, i in chosen:
        by_category.setdefault(c, []).append(i)
    out: list[Task] = []
    for c in (c for c in runnable if c in by_category):
        kind = KINDS.get(CATEGORIES.get(c).kind)
        out += kind.tasks(c, by_category[c], **{o: options[o] for o in kind.options})
    return out


def category_of(task: Task) -> str:
    return str(task.env_config.get("category") or task.env.split(":", 1)[-1])


class BFCLEnvs:
    """The environment factory of every BFCL task (``ENVS["bfcl"]``): the task's category picks the class."""

    replay_safe = True

    def __call__(self, task: Task) -> Environment:
        return self.env_class(task)(task)

    @staticmethod
    def env_class(task: Task) -> type[Environment]:
        cat = CATEGORIES.get(category_of(task))
        why = unavailable(cat.name)
        if cat.kind is None or why is not None:
            raise ValueError(f"BFCL category {cat.name!r} has no environment here: {why}")
        return KINDS.get(cat.kind).env

    def initial_state_key(self, task: Task) -> str:
        return self.env_class(task).initial_state_key(task)  # type: ignore[attr-defined]

    def prepare(self, tasks: list[Task], play: Play) -> list[Task]:
        """Each task's environment class prepares its tasks (:meth:`Environment.prepare`; memory: writer=model)."""
        return prepare_groups(tasks, play, lambda t: self.env_class(t).prepare)


# -------------------------------------------------------------------------------------------- summary

# BFCL's leaf columns (its column_headers) -> the category each shows, per score file
LEAF_COLUMNS: dict[str, dict[str, str]] = {
    "data_non_live": {
        "Python Simple AST": "simple_python",
        "Java Simple AST": "simple_java",
        "JavaScript Simple AST": "simple_javascript",
        "Multiple AST": "multiple",
        "Parallel AST": "parallel",
        "Parallel Multiple AST": "parallel_multiple",
        "Irrelevance Detection": "irrelevance",
    },
    "data_live": {
        "Python Simple AST": "live_simple",
        "Python Multiple AST": "live_multiple",
        "Python Parallel AST": "live_parallel",
        "Python Parallel Multiple AST": "live_parallel_multiple",
        "Irrelevance Detection": "live_irrelevance",
        "Relevance Detection": "live_relevance",
    },
    "data_multi_turn": {
        "Base": "multi_turn_base",
        "Miss Func": "multi_turn_miss_func",
        "Miss Param": "multi_turn_miss_param",
        "Long Context": "multi_turn_long_context",
    },
    "data_agentic": {
        "Web Search Base": "web_search_base",
        "Web Search No Snippet": "web_search_no_snippet",
        "Memory KV": "memory_kv",
        "Memory Vector": "memory_vector",
        "Memory Recursive Summarization": "memory_rec_sum",
    },
}
SECTIONS = ("data_non_live", "data_live", "data_multi_turn", "data_agentic")
TOTAL_COLUMNS = ("Irrelevance Detection", "Relevance Detection")  # data_overall's totals over non-live and live


@functools.lru_cache(maxsize=None)
def _helper() -> types.ModuleType:
    """BFCL's eval_runner_helper, privately (:func:`envace.envs.bfcl.single_turn.load_private`); its dataset loader,
    which it uses only to count the entries of a category not evaluated, is memoized in this copy."""
    module = single_turn.load_private("bfcl_eval.eval_checker.eval_runner_helper")
    load_entry = module.load_dataset_entry
    module.load_dataset_entry = functools.lru_cache(maxsize=None)(load_entry)  # type: ignore[attr-defined]
    return module


def category_size(category: str) -> int:
    """The number of entries of a category (BFCL's weight of it in a full run)."""
    return len(_helper().load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False))


def leaderboard(accuracy: dict[str, float]) -> dict[str, dict[str, Any]]:
    """BFCL's score files for one model whose category accuracies are ``accuracy`` (the others not evaluated):
    ``{"data_overall": {column: value}, "data_non_live": ..., ...}``, each value a fraction or ``"N/A"``, computed
    by BFCL's ``generate_leaderboard_csv`` (its code unchanged) with each category weighted by its full size."""
    table = {
        single_turn.MODEL_NAME: {
            c: {"accuracy": float(a), "total_count": category_size(c)} for c, a in accuracy.items()
        }
    }
    files: dict[str, dict[str, Any]] = {}

    def collect(
        data: list[list[Any]],
        file_path: Path,
        header: list[str],
        sort_column_index: int,
        no_conversion_numeric_column_index: list[int] = [],
    ) -> None:  # noqa: B006 - BFCL's signature
        (row,) = data
        files[Path(file_path).stem] = dict(zip(header, row))

    fn = _helper().generate_leaderboard_csv
    glb = dict(fn.__globals__)
    glb.update(
        write_score_csv_file=collect,
        print=lambda *a, **k: None,
        os=types.SimpleNamespace(getenv=lambda key, default=None: None),
    )
    types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, fn.__closure__)(table, Path("."))
    return files


def category_results(per_task: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{category: {"accuracy", "n_tasks", "n_trials"}}`` of the BFCL rows of an evaluation's per-task results."""
    out: dict[str, dict[str, Any]] = {}
    for row in per_task:
        domain = str(row.get("domain", ""))
        if not domain.startswith("bfcl:"):
            continue
        r = out.setdefault(domain.split(":", 1)[1], {"successes": 0, "n_tasks": 0, "n_trials": 0})
        r["successes"] += sum(bool(s) for s in row["successes"])
        r["n_tasks"] += 1
        r["n_trials"] += len(row["successes"])
    return {
        c: {"accuracy": r["successes"] / r["n_trials"], "n_tasks": r["n_tasks"], "n_trials": r["n_trials"]}
        for c, r in out.items()
        if r["n_trials"]
    }


def _pct(v: Any) -> str:
    return f"{100 * v:.2f}%" if isinstance(v, (int, float)) else str(v)


def summary(per_task: Sequence[dict[str, Any]], spec: str = "bfcl") -> dict[str, Any]:
    """BFCL's summary of an evaluation of suite ``spec``: ``{"title", "text", "scores", "categories", "not_evaluated",
    "unavailable"}`` (see the module docstring; a category's note follows the spec's options); ``text`` is the table
    ``envace eval`` prints."""
    options = options_of(spec)
    results = category_results(per_task)
    unknown = sorted(set(results) - set(CATEGORIES.names()))
    if unknown:
        raise ValueError(f"per-task rows name BFCL categories that do not exist: {', '.join(unknown)}")
    files = leaderboard({c: r["accuracy"] for c, r in results.items()})
    reasons = {c: unavailable(c) for c in CATEGORIES.names()}
    categories = {}
    for c in ALL_SCORING_CATEGORIES:
        info: dict[str, Any] = {
            "size": category_size(c),
            "n_tasks": results.get(c, {}).get("n_tasks", 0),
            "accuracy": results.get(c, {}).get("accuracy"),
        }
        info["status"] = "evaluated" if c in results else "unavailable" if reasons[c] else "not evaluated"
        if reasons[c]:
            info["reason"] = reasons[c]
        if CATEGORIES.get(c).note:
            info["note"] = CATEGORIES.get(c).note(options)
        categories[c] = info
    lines = [
        f"BFCL-v4 summary (bfcl_eval {importlib.metadata.version('bfcl_eval')}, "
        "its generate_leaderboard_csv): categories weighted by their full size, "
        "each scored on the tasks evaluated here; not evaluated = N/A, counted 0"
    ]
    overall = files["data_overall"]
    width = 34
    lines.append(f"{'Overall Acc':<{width}}{_pct(overall['Overall Acc']):>9}")
    for section in SECTIONS:
        head, *rest = [k for k in files[section] if k not in ("Rank", "Model")]
        lines.append(f"{head:<{width}}{_pct(files[section][head]):>9}")
        for col in rest:
            c = LEAF_COLUMNS[section].get(col)
            note = ""
            if c is not None:
                info = categories[c]
                note = f"  {c}: " + (
                    "unavailable" if info["status"] == "unavailable" else f"{info['n_tasks']}/{info['size']} tasks"
                )
                note += " (see the note below)" if info["status"] == "evaluated" and "note" in info else ""
            lines.append(f"  {col:<{width - 2}}{_pct(files[section][col]):>9}{note}")
    lines += [f"{'Total ' + col:<{width}}{_pct(overall[col]):>9}" for col in TOTAL_COLUMNS]
    not_evaluated = [c for c, i in categories.items() if i["status"] == "not evaluated"]
    unavail = {c: i["reason"] for c, i in categories.items() if i["status"] == "unavailable"}
    notes: dict[str, list[str]] = {}
    for c, i in categories.items():
        if i["status"] == "evaluated" and "note" in i:
            notes.setdefault(i["note"], []).append(c)
    lines += [f"note on {', '.join(cs)}: {note}" for note, cs in notes.items()]
    if not_evaluated:
        lines.append(f"not evaluated (N/A, counted 0): {', '.join(not_evaluated)}")
    if unavail:
        lines.append("unavailable here (N/A, counted 0):")
        lines += [f"  {c}: {why}" for c, why in unavail.items()]
    scores = {
        name: {k: v for k, v in row.items() if k not in ("Rank", "Model", "Model Link", "Organization", "License")}
        for name, row in files.items()
    }
    return {
        "title": "BFCL-v4 summary",
        "text": "\n".join(lines),
        "scores": scores,
        "categories": categories,
        "not_evaluated": not_evaluated,
        "unavailable": unavail,
    }


ENVS.add("bfcl", BFCLEnvs())
SUITES.add("bfcl", load_bfcl_v4_tasks)
SUMMARIES.add("bfcl", summary)
