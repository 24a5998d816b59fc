"""Success of every arm of an experiment by task template, and by whether the gold episode writes (an order placed
or cancelled) or only reads: on ``shop-world-decide`` the two halves of a template are the two branches of its
decision, so a policy that learnt the decision gains on both and one that shifted its prior gains on one only.

    python bench/by_template.py docs/results/decide-val/results.json [--split ood] [--budgets]
    python bench/by_template.py docs/results/tts-val/decide-sft100-seed2/{0,parallel-2-agreed}.json

Reads an experiment's per-task outcomes (its N=0 evaluations, pooled over seeds) or saved evaluation results (a
column each), and the tasks' metadata (rebuilt from their ids); prints a markdown table and writes
``by_template.md`` beside the first file."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from envace.envs import load_tasks  # noqa: E402
from envace.envs.builtin import task_from_id  # noqa: E402
from envace.evaluation.results import MODE_SHORT  # noqa: E402


def branch(task) -> str:
    return "reads only" if task.metadata.get("read_only") else "writes"


def columns_of_experiment(
    results: dict, split: str | None = None, budgets: bool = False
) -> tuple[str, str, dict[str, list[dict]]]:
    """(suite, split, arm -> per-task rows of its N=0 evaluations on that split, every seed): the main evaluations
    (``evals``) or those of another split (``splits[split]``, e.g. ``ood``). ``budgets``: the test-time sweep
    instead, a column per swept arm and budget (``arm N=2 par``), each on the tasks and seeds of the arm's sweep
    (its N=0 column too), so that a template's columns count the same trials."""
    cfg = results["config"]
    split = split or cfg["eval_split"]
    n = cfg["eval_tasks"] if split == cfg["eval_split"] else cfg["ood_tasks"]
    ids = {t.id for t in load_tasks(cfg["suite"], split, n=n, seed=0)}
    cols: dict[str, list[dict]] = {}
    for arm in results["arms"]:
        for run in (results["runs"].get(arm) or {}).values():
            evals = run["evals"] + run.get("splits", {}).get(split, [])
            evals = [ev for ev in evals if all(p["task_id"] in ids for p in ev["per_task"])]
            if not budgets:
                for ev in evals:
                    if ev["n"] == 0:
                        cols.setdefault(arm, []).extend(ev["per_task"])
                continue
            swept = {p["task_id"] for ev in evals if ev["n"] > 0 for p in ev["per_task"]}
            for ev in sorted(evals, key=lambda e: (e["n"], e["mode"])):
                if swept:
                    name = arm + (" N=0" if ev["n"] == 0 else f" N={ev['n']} {MODE_SHORT.get(ev['mode'], ev['mode'])}")
                    cols.setdefault(name, []).extend(p for p in ev["per_task"] if p["task_id"] in swept)
    return cfg["suite"], split, cols


def columns_of_results(paths: list[str]) -> tuple[str, str, dict[str, list[dict]]]:
    """(suite, split, column name -> per-task rows) of saved evaluation results (``envace eval --out``,
    bench/tts_val.py's cells), which must be of one suite and split. A column is named by the file's stem, or by
    ``folder/stem`` where two files share a stem (the same cell of two models)."""
    cols, where = {}, set()
    stems = [Path(p).stem for p in paths]
    for path in paths:
        r = json.loads(Path(path).read_text())
        where.add((r.get("suite") or r.get("config", {}).get("suite"), r["split"]))
        p = Path(path)
        cols[p.stem if stems.count(p.stem) == 1 else f"{p.parent.name}/{p.stem}"] = r["per_task"]
    if len(where) != 1:
        raise SystemExit(f"the results are of different suites or splits: {sorted(map(str, where))}")
    suite, split = where.pop()
    return suite, split, cols


def table(suite: str, split: str, columns: dict[str, list[dict]]) -> str:
    """Successes / trials per (template, branch) and column, the tasks rebuilt from their ids."""
    counts: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    tasks: dict[str, Any] = {}  # each task built once, however many columns and seeds name it
    for name, rows in columns.items():
        for p in rows:
            if p["task_id"] not in tasks:
                tasks[p["task_id"]] = task_from_id(p["task_id"])
            t = tasks[p["task_id"]]
            c = counts[(t.metadata["template"], branch(t))][name]
            c[0] += sum(p["successes"])
            c[1] += len(p["successes"])
    names = list(columns)
    lines = [
        f"Success by template and branch, {suite} {split} (N=0 unless a column says otherwise, pooled over seeds): "
        "successes / trials",
        "",
        "| template | gold episode | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for (template, br), per in sorted(counts.items()):
        cells = [f"{per[a][0]} / {per[a][1]}" if per[a][1] else "–" for a in names]
        lines.append(f"| {template} | {br} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "results", nargs="+", help="an experiment's results.json, or saved evaluation results (a column each)"
    )
    ap.add_argument("--split", default=None, help="of an experiment: the evaluation split (default) or the ood split")
    ap.add_argument(
        "--budgets",
        action="store_true",
        help="of an experiment: a column per swept arm and budget N (its sweep's tasks)",
    )
    args = ap.parse_args()
    first = json.loads(Path(args.results[0]).read_text())
    if "runs" in first:
        md = table(*columns_of_experiment(first, args.split, args.budgets))
    else:
        md = table(*columns_of_results(args.results))
    print(md)
    name = "by_template" + (f"_{args.split}" if args.split else "") + ("_budgets" if args.budgets else "") + ".md"
    Path(os.path.dirname(os.path.abspath(args.results[0])), name).write_text(md)


if __name__ == "__main__":
    main()
