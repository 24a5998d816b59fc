"""Success of every arm of an experiment by task template, and by whether the gold episode writes (an order placed
or cancelled) or only reads: on ``shop-world-decide`` the two halves of a template are the two branches of its
decision, so a policy that learnt the decision gains on both and one that shifted its prior gains on one only.
The last row weights every (template, branch) cell equally; ``--contrast A B`` gives B - A so weighted, paired by
(seed, task) with a bootstrap within cells: a split with more tasks of one branch (test has more "reads only"
`cancel_if_over` tasks than val) cannot move it.

    python bench/by_template.py docs/results/decide-val/results.json [--split ood] [--budgets] \\
        [--contrast caller_only envace]
    python bench/by_template.py docs/results/tts-val/decide-sft100-seed2/{0,parallel-2-agreed}.json

Reads an experiment's per-task outcomes (its N=0 evaluations, pooled over seeds) or saved evaluation results (a
column each), and the tasks' metadata (rebuilt from their ids); prints a markdown table and writes
``by_template.md`` beside the first file."""

from __future__ import annotations

import argparse
import functools
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
from envace.math.stats import stratified_paired_bootstrap  # noqa: E402


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
        for seed, run in (results["runs"].get(arm) or {}).items():
            evals = run["evals"] + run.get("splits", {}).get(split, [])
            evals = [ev for ev in evals if all(p["task_id"] in ids for p in ev["per_task"])]
            if not budgets:
                for ev in evals:
                    if ev["n"] == 0:
                        cols.setdefault(arm, []).extend(p | {"seed": seed} for p in ev["per_task"])
                continue
            swept = {p["task_id"] for ev in evals if ev["n"] > 0 for p in ev["per_task"]}
            for ev in sorted(evals, key=lambda e: (e["n"], e["mode"])):
                if swept:
                    name = arm + (" N=0" if ev["n"] == 0 else f" N={ev['n']} {MODE_SHORT.get(ev['mode'], ev['mode'])}")
                    cols.setdefault(name, []).extend(
                        p | {"seed": seed} for p in ev["per_task"] if p["task_id"] in swept
                    )
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


built = functools.cache(task_from_id)
"""The task of an id, built once however many columns and seeds name it."""


def cell(task: Any) -> tuple[str, str]:
    """A task's (template, branch): the strata of the table and of the balanced contrast."""
    return task.metadata["template"], branch(task)


def table(suite: str, split: str, columns: dict[str, list[dict]]) -> str:
    """Successes / trials per (template, branch) and column, the tasks rebuilt from their ids; the last row: each
    column's mean of its cells' success rates (every cell weighted equally)."""
    counts: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for name, rows in columns.items():
        for p in rows:
            c = counts[cell(built(p["task_id"]))][name]
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
    balanced = []
    for a in names:
        rates = [per[a][0] / per[a][1] for per in counts.values() if per[a][1]]
        balanced.append(f"{sum(rates) / len(rates):.3f}" if rates else "–")
    lines.append("| every cell weighted equally | mean of the cells' rates | " + " | ".join(balanced) + " |")
    return "\n".join(lines) + "\n"


def balanced_contrast(columns: dict[str, list[dict]], a: str, b: str, seed: int = 0) -> dict[str, Any]:
    """Column ``b`` - column ``a`` on the (seed, task) pairs both have, every (template, branch) cell weighted
    equally (:func:`envace.math.stats.stratified_paired_bootstrap` of the per-task mean successes), beside the
    plain paired mean over the same pairs."""
    for name in (a, b):
        if name not in columns:
            raise SystemExit(f"--contrast: no column {name!r}; the columns are {', '.join(columns)}")

    def means(name: str) -> dict[tuple[Any, str], float]:
        return {(p.get("seed"), p["task_id"]): sum(p["successes"]) / len(p["successes"]) for p in columns[name]}

    ma, mb = means(a), means(b)
    keys = [k for k in ma if k in mb]
    out = stratified_paired_bootstrap(
        [cell(built(k[1])) for k in keys], [ma[k] for k in keys], [mb[k] for k in keys], seed=seed
    )
    out["plain_diff"] = sum(mb[k] - ma[k] for k in keys) / len(keys) if keys else float("nan")
    return out


def contrast_lines(columns: dict[str, list[dict]], pairs: list[list[str]]) -> str:
    lines = []
    for a, b in pairs:
        c = balanced_contrast(columns, a, b)
        lo, hi = c["diff_ci"]
        lines.append(
            f"- {b} - {a}, every cell weighted equally: {c['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}] (paired bootstrap "
            f"within cells; {c['n_tasks']} (seed, task) pairs in {c['n_strata']} cells); plain mean "
            f"{c['plain_diff']:+.3f}"
        )
    return "\n".join(lines) + ("\n" if lines else "")


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
    ap.add_argument(
        "--contrast",
        nargs=2,
        action="append",
        default=[],
        metavar=("A", "B"),
        help="B - A with every (template, branch) cell weighted equally, paired (repeatable)",
    )
    args = ap.parse_args()
    first = json.loads(Path(args.results[0]).read_text())
    if "runs" in first:
        suite, split, cols = columns_of_experiment(first, args.split, args.budgets)
    else:
        suite, split, cols = columns_of_results(args.results)
    md = table(suite, split, cols)
    if args.contrast:
        md += "\n" + contrast_lines(cols, args.contrast)
    print(md)
    name = "by_template" + (f"_{args.split}" if args.split else "") + ("_budgets" if args.budgets else "") + ".md"
    Path(os.path.dirname(os.path.abspath(args.results[0])), name).write_text(md)


if __name__ == "__main__":
    main()
