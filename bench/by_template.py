"""Success of every arm of an experiment by task template, and by whether the gold episode writes (an order placed
or cancelled) or only reads: on ``shop-world-decide`` the two halves of a template are the two branches of its
decision, so a policy that learnt the decision gains on both and one that shifted its prior gains on one only.

    python bench/by_template.py docs/results/decide-val/results.json [--split ood]

Reads the experiment's per-task outcomes (N=0 evaluations, pooled over seeds) and the tasks' metadata (rebuilt from
the suite, split and count in the results' config); prints a markdown table and writes ``by_template.md`` beside
the results."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from envace.envs import load_tasks  # noqa: E402


def branch(task) -> str:
    return "reads only" if task.metadata.get("read_only") else "writes"


def table(results: dict, split: str | None = None) -> str:
    cfg = results["config"]
    split = split or cfg["eval_split"]
    n = cfg["eval_tasks"] if split == cfg["eval_split"] else cfg["ood_tasks"]
    tasks = {t.id: t for t in load_tasks(cfg["suite"], split, n=n, seed=0)}
    counts: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    arms = [a for a in results["arms"] if results["runs"].get(a)]
    for arm in arms:
        for run in results["runs"][arm].values():
            for ev in run["evals"]:
                if ev["n"] != 0 or not all(p["task_id"] in tasks for p in ev["per_task"]):
                    continue
                for p in ev["per_task"]:
                    t = tasks[p["task_id"]]
                    c = counts[(t.metadata["template"], branch(t))][arm]
                    c[0] += sum(p["successes"])
                    c[1] += len(p["successes"])
    lines = [
        f"Success by template and branch, {cfg['suite']} {split} (first {n} tasks, N=0, pooled over seeds): "
        "successes / trials",
        "",
        "| template | gold episode | " + " | ".join(arms) + " |",
        "|---|---|" + "---|" * len(arms),
    ]
    for (template, br), per in sorted(counts.items()):
        cells = [f"{per[a][0]} / {per[a][1]}" if per[a][1] else "–" for a in arms]
        lines.append(f"| {template} | {br} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="an experiment's results.json")
    ap.add_argument("--split", default=None, help="the evaluation split (default) or the ood split")
    args = ap.parse_args()
    md = table(json.loads(Path(args.results).read_text()), args.split)
    print(md)
    name = "by_template.md" if args.split is None else f"by_template_{args.split}.md"
    Path(os.path.dirname(os.path.abspath(args.results)), name).write_text(md)


if __name__ == "__main__":
    main()
