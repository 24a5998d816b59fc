"""Summarise bench/world_fidelity.sh's fidelity results (one JSON per model x test set) as summary.md / .json:
overall exact and leaf accuracy, outcome (error vs success) agreement, and the read / write and real success /
error breakdowns, with a 95% Wilson interval on the exact-match rate of each cell."""

from __future__ import annotations

import json
import os
import sys

from envace.evaluation.fidelity import exact_cell, summary_bucket
from envace.math.stats import wilson_interval

RUNS = {
    "sft-world_on_world": "SFT on bank-world, rehearsing bank-world test",
    "sft-fresh_on_fresh": "SFT on bank (fresh worlds), rehearsing bank test",
    "sft-fresh_on_world": "SFT on bank (fresh worlds), rehearsing bank-world test",
}
CELLS = (
    ("overall", None),
    ("by_state", "read"),
    ("by_state", "write"),
    ("by_outcome", "success"),
    ("by_outcome", "error"),
)


def main(out: str) -> None:
    rows, table = {}, []
    head = "| model, test set | pairs | " + " | ".join(f"{g if b is None else b} exact [95% CI]" for g, b in CELLS)
    table += [head + " | leaf acc | outcome agree |", "|---" * (len(CELLS) + 4) + "|"]
    for name, label in RUNS.items():
        path = os.path.join(out, f"{name}.json")
        if not os.path.exists(path):
            continue
        summary = json.load(open(path))["summary"]
        rows[name] = {"label": label}
        parts = []
        for g, b in CELLS:
            s = summary_bucket(summary, g, b)
            if not s or not s["n"]:
                parts.append("-")
                continue
            n, k = int(s["n"]), round(s["exact"] * s["n"])
            lo, hi = wilson_interval(k, n)
            rows[name][f"{g}/{b or 'all'}"] = {"n": n, "exact": s["exact"], "ci": [lo, hi], "leaf_acc": s["leaf_acc"]}
            parts.append(exact_cell(s))
        o = summary["overall"]
        table.append(
            f"| {label} | {int(o['n'])} | " + " | ".join(parts) + f" | {o['leaf_acc']:.2f} | {o['outcome']:.2f} |"
        )
    json.dump(rows, open(os.path.join(out, "summary.json"), "w"), indent=1)
    open(os.path.join(out, "summary.md"), "w").write("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/results/world-fidelity")
