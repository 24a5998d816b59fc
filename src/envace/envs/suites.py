"""Loading a suite's tasks by spec (``"bank"``, ``"bfcl:multi_turn_base"``, ``"bank@oracle-references"``), one task
of a suite by index, tasks of some kinds, a suite's own summary of an evaluation (the registries:
:mod:`envace.envs.registry`), and the hash split of the benchmark suites that have no split of their own."""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

from ..core.types import Task
from .references import REFERENCE_MODES, split_spec
from .registry import SUITES, SUMMARIES, TASK_AT, ensure_registered


def hash_split(key: str, test_fraction: float) -> str:
    """``test`` when the first 32 bits of the SHA-256 of ``key`` fall in the lowest ``test_fraction``, else ``train``:
    the split of the benchmark suites that ship none (BFCL's categories, tau2's mock domain), stable across runs,
    machines and Python versions. Each suite starts its keys with its own name, so the suites' splits are independent.
    """
    h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return "test" if h / 2**32 < test_fraction else "train"


def suite_summary(spec: str, per_task: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The suite's own summary of an evaluation's per-task rows (:data:`SUMMARIES`), or None when it has none. A
    summary that fails says so in its text (``{"title", "text", "error"}``): the evaluation's results stand."""
    spec, _ = split_spec(spec)
    ensure_registered(spec)
    prefix = spec.split(":", 1)[0]
    if prefix not in SUMMARIES:
        return None
    try:
        return SUMMARIES.get(prefix)(per_task, spec)
    except Exception as e:  # noqa: BLE001 - reported next to the metrics, never a lost evaluation
        error = f"{type(e).__name__}: {str(e)[:300]}"
        return {"title": f"{prefix} summary", "text": f"{prefix} summary failed: {error}", "error": error}


def load_tasks(spec: str, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
    """Load ``n`` tasks of a suite (``"builtin"``, ``"bank"``, ``"bfcl:multi_turn_base"``, ...) and split.
    Their references are records of other train tasks (``envace.envs.references``); the suffix
    ``@oracle-references`` (``"bank@oracle-references"``, ablations only: the answer leaks) gives each task its
    own gold calls with their real results instead, and every report using it says so in its title."""
    spec, mode = split_spec(spec)
    ensure_registered(spec)
    tasks = SUITES.get(spec.split(":", 1)[0])(spec, split=split, n=n, seed=seed)
    return REFERENCE_MODES.get(mode)(tasks) if mode else tasks


def task_at(spec: str, split: str, index: int) -> Task:
    """Task ``index`` (0-based) of a suite's split in the suite's own stable order, the order of
    ``load_tasks(spec, split)`` (a seeded sample of fewer tasks is another order). An index past the end (or below
    0) is a one-line error that says how many tasks there are; a generated built-in suite builds only that task."""
    base, mode = split_spec(spec)
    ensure_registered(base)
    name = base.split(":", 1)[0]
    if index < 0:
        raise ValueError(f"task index {index} of suite {spec!r} is negative; the first task is 0")
    if name in TASK_AT:
        task = TASK_AT.get(name)(base, split, index)
    else:
        tasks = SUITES.get(name)(base, split=split, n=None, seed=0)
        if index >= len(tasks):
            last = f" (0..{len(tasks) - 1})" if tasks else ""
            raise ValueError(
                f"task index {index} is past the end of suite {spec!r} split {split!r}: it has {len(tasks)} tasks{last}"
            )
        task = tasks[index]
    return REFERENCE_MODES.get(mode)([task])[0] if mode else task


KIND_GROWTH = 64  # load_tasks_of_kinds loads at most KIND_GROWTH * n tasks to find n of the asked kinds


def load_tasks_of_kinds(
    spec: str, split: str, n: int | None, seed: int, kinds: tuple[str, ...] | None, where: str = "task_kinds"
) -> list[Task]:
    """``n`` tasks of a suite and split whose ``metadata["kind"]`` is one of ``kinds`` (None: :func:`load_tasks`
    itself). They are the first ``n`` such tasks of ``load_tasks(spec, split, m, seed)`` for the smallest
    ``m = n * 2**j`` that has ``n`` of them (so with seed 0, the first ``n`` of the split's tasks of those kinds);
    fewer only where the suite runs out or ``m`` reaches ``KIND_GROWTH * n``. A filter that keeps no task is an
    error naming the kinds the suite's tasks do have (only the built-in suites label kinds)."""
    if kinds is None or n == 0:
        return load_tasks(spec, split, n=n, seed=seed)
    m = n
    while True:
        tasks = load_tasks(spec, split, n=m, seed=seed)
        kept = [t for t in tasks if t.metadata.get("kind") in kinds]
        if n is None or len(kept) >= n or len(tasks) < m or m >= KIND_GROWTH * n:
            break
        m *= 2
    if not kept:
        have: dict[str, int] = {}
        for t in tasks:
            k = str(t.metadata.get("kind", "<no kind label>"))
            have[k] = have.get(k, 0) + 1
        raise ValueError(f"{where}={list(kinds)} keeps none of {len(tasks)} {spec}/{split} tasks; their kinds: {have}")
    return kept[:n] if n is not None else kept
