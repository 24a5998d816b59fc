"""What the built-in environments' "nothing to do needs a look" check changes in results written before it.

Since 2026-12-06 a task whose gold run changes nothing and whose reply needs state no fact (``shop-world-decide``'s
``cancel_pending`` for a customer with no pending order) succeeds only if the agent called the tools the gold run
read (``envace.envs.builtin.common.ToolEnv.score``, ``unlooked_tools``); before, a reply without any tool call passed
it. A stored per-task row has the evidence: with one trial per task, its ``tool_recall`` (recall of the gold's tool
names) is 1 exactly when every tool the gold called was called. So each stored success on such a task with
``tool_recall < 1`` is one the check now fails, and nothing else changes.

    python bench/rescore_looked.py docs/results/experiment-shop-world-decide-notes/results.json [more.json ...]
    python bench/rescore_looked.py results.json --write     # rescore in place (rates and intervals again)

Reads an experiment's ``results.json`` (every arm, seed, evaluation and split) or a saved evaluation (``envace eval
--out``: ``per_task`` at the top); prints a markdown table of the evaluations it changes (nothing when none).
``--write`` sets those successes to false, recomputes the success metrics from the rows
(``envace.evaluation.trials.success_metrics``) and marks the evaluation (``rescored``); it refuses a row of several
trials (``tool_recall`` is then a mean and does not say which trial looked)."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from envace.core.atomic import write_json  # noqa: E402
from envace.envs import ENVS  # noqa: E402
from envace.envs.builtin import task_from_id  # noqa: E402
from envace.envs.builtin.common import ToolEnv, nothing_to_do  # noqa: E402
from envace.evaluation.trials import success_metrics  # noqa: E402

RESCORED = "looked: a no-action task succeeds only after the gold's reads (bench/rescore_looked.py)"


@functools.cache
def needs_a_look(task_id: str) -> bool:
    """Whether the task needs no action (so the check asks for the gold's reads); False for a task of no built-in
    suite (its id does not rebuild) or of an environment that is not a built-in :class:`ToolEnv`."""
    try:
        task = task_from_id(task_id)
    except (KeyError, ValueError):
        return False
    env = ENVS.get(task.env)(task)
    return isinstance(env, ToolEnv) and nothing_to_do(task, *env.gold_run())


def evaluations(results: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(label, evaluation) of every evaluation in an experiment's results, or the one saved evaluation."""
    if "per_task" in results:
        yield results.get("split", "eval"), results
        return
    for arm, seeds in results.get("runs", {}).items():
        for seed, run in seeds.items():
            for ev in run.get("evals", []):
                yield f"{arm} seed {seed} {results['config'].get('eval_split', 'test')} N={ev['n']} {ev['mode']}", ev
            for split, evs in (run.get("splits") or {}).items():
                for ev in evs:
                    yield f"{arm} seed {seed} {split} N={ev['n']} {ev['mode']}", ev


def unlooked_successes(ev: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of ``ev`` the check now fails: a success on a no-action task whose trial missed a gold read."""
    return [p for p in ev["per_task"] if any(p["successes"]) and p["tool_recall"] < 1 and needs_a_look(p["task_id"])]


def rescore(ev: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Fail ``rows`` (one trial each) and recompute ``ev``'s success metrics from its rows (every row of such an
    evaluation has one trial)."""
    for p in rows:
        if len(p["successes"]) != 1:
            raise ValueError(f"{p['task_id']}: {len(p['successes'])} trials; which one looked is not recorded")
        p["successes"] = [False]
    if "metrics" in ev:  # a pooled file (``pooled_from``) keeps only its rows
        ev["metrics"] |= success_metrics(ev["per_task"], 1)
    ev["rescored"] = RESCORED


def indent_of(text: str) -> int | None:
    """The indent a JSON file was written with (None: on one line), so that a rewrite changes only what it must."""
    second = text.split("\n", 2)[1] if text.count("\n") else None
    return None if second is None else len(second) - len(second.lstrip(" "))


def rate(ev: dict[str, Any]) -> float:
    return success_metrics(ev["per_task"], 1)["success_rate"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--write", action="store_true", help="rescore the files in place")
    args = ap.parse_args(argv)
    print("| file | evaluation | no-action tasks | successes without the read | success before | after |")
    print("|---|---|---:|---:|---:|---:|")
    for path in args.results:
        text = path.read_text()
        results = json.loads(text)
        changed = False
        for label, ev in evaluations(results):
            rows = unlooked_successes(ev)
            if not rows:
                continue
            before = rate(ev)
            n_no_action = sum(needs_a_look(p["task_id"]) for p in ev["per_task"])
            rescore(ev, rows)
            changed = True
            after = rate(ev)
            print(f"| {path} | {label} | {n_no_action} | {len(rows)} | {before:.3f} | {after:.3f} |")
        if changed and args.write:
            write_json(str(path), results, indent=indent_of(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
