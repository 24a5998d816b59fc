"""Pool saved evaluation results of disjoint task sets (one suite, one split) into one result, so that two models
measured on the same draws can be compared over all of them: e.g. two seeds of ``bench/tts_val.py`` (100 val tasks
each, different draws) become 200 tasks, and ``envace compare`` pairs them task by task as before.

    python bench/pool_results.py OUT.json seed0/0.json seed1/0.json
    envace compare pooled-plain.json pooled-notes.json

Refuses results of other suites or splits, and task ids that appear in more than one input (pooling would count a
task twice). The output holds ``per_task`` (the inputs' rows, in order), ``suite``, ``split`` and ``pooled_from``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from envace.evaluation.trials import load_result, result_identity  # noqa: E402


def pool(results: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """One result whose per-task rows are those of ``results`` (disjoint task sets of one suite and split)."""
    idents = [result_identity(r) for r in results]
    for label, i in (("suite", 0), ("split", 1)):
        values = {x[i] for x in idents if x[i]}
        if len(values) > 1:
            raise ValueError(f"cannot pool results of different {label}s: {sorted(values)}")
    seen: dict[str, str] = {}
    for name, (_, _, ids) in zip(names, idents):
        for t in ids:
            if t in seen:
                raise ValueError(f"task {t} is in both {seen[t]} and {name}: pooling would count it twice")
            seen[t] = name
    return {
        "suite": next((x[0] for x in idents if x[0]), ""),
        "split": next((x[1] for x in idents if x[1]), ""),
        "per_task": [row for r in results for row in r["per_task"]],
        "pooled_from": names,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("results", nargs="+")
    a = ap.parse_args(argv)
    out = pool([load_result(p) for p in a.results], a.results)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"{a.out}: {len(out['per_task'])} tasks from {len(a.results)} results")


if __name__ == "__main__":
    main()
