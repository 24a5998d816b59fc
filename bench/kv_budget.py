"""Memory budget of the HF backend's batches (``HFBackend(max_kv_gib=...)``): peak memory and wall time of one
greedy real-environment evaluation of held-out tasks, per budget, each in a fresh process (peak RSS is per process).

Every sequence of a batch takes as many cache columns as the longest one, so a 100-task evaluation of
SmolLM2-135M held a 4.7 GB slab (80 rows x 1.3k columns, float32) plus the contexts kept between turns, and the
process peaked at 12.6 GB. The budget bounds the slab; the stream's follow-ups-first order bounds the kept
contexts. Reported: peak RSS, wall time, ratio to the unbounded run, and whether the per-task outcomes agree
(greedy: they should, up to float rounding of different batch shapes).

Usage: python bench/kv_budget.py [--model PATH] [--tasks 100] [--budgets none,2,1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time

import common  # noqa: F401
from common import write_result


def one(model: str, tasks: int, budget: float | None) -> dict:
    """Evaluate in this process (called through a child process): wall, peak RSS, per-task successes."""
    from envace.backends.hf import HFBackend
    from envace.envs import load_tasks
    from envace.evaluation.trials import evaluate
    from envace.backends.models import load
    from envace.rollout.engine import RolloutConfig

    m, tok = load(model)
    be = HFBackend(m, tok, bf16="auto", max_kv_gib=budget)
    ts = load_tasks("bank", "test", n=tasks, seed=0)
    rc = RolloutConfig(progress=False)
    rc = dataclasses.replace(rc, act=rc.act.with_(temperature=0.0))
    t = time.perf_counter()
    res = evaluate(be, ts, samples=1, rollout=rc, seed=0)
    return {
        "budget_gib": budget,
        "wall_s": time.perf_counter() - t,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        "success_rate": res.metrics["success_rate"],
        "successes": [p["successes"] for p in res.per_task],
        "generated_tokens": be.stats["generated_tokens"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model",
        default="SmolLM2-135M-Instruct",
        help="a model name or checkpoint (the README figures: the CPU experiment's SFT warm-up)",
    )
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--budgets", default="none,2,1")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(one(a.model, a.tasks, None if a.child == "none" else float(a.child))))
        return
    rows = []
    for b in a.budgets.split(","):
        out = subprocess.run(
            [sys.executable, __file__, "--model", a.model, "--tasks", str(a.tasks), "--child", b],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(
            f"budget {b:>5} GiB: peak {r['peak_rss_gb']:.2f} GB, {r['wall_s']:.0f} s, success {r['success_rate']:.3f}",
            flush=True,
        )
    base = rows[0]
    for r in rows:
        r["wall_vs_first"] = r["wall_s"] / base["wall_s"]
        r["outcomes_agree_with_first"] = sum(x == y for x, y in zip(r["successes"], base["successes"]))
    write_result("kv_budget", {"model": a.model, "tasks": a.tasks, "rows": rows})


if __name__ == "__main__":
    main()
