"""Does Rehearse fidelity rise with Rehearse training, on a persistent world and on a fresh one? (issue 27, item 3)

From a warm-up of the demo's shape (30 steps x 4 gold trajectories of every kind, lr 1e-4), two more supervised
stages train the **Rehearse rows only** (`SFTConfig.roles = [rehearse]`: the real observations of gold
trajectories of train tasks; `--steps` (40) x 4 each, lr 1e-4, stage i with seed i, so each draws its own 256
train tasks). After the warm-up and after each stage, Rehearse fidelity is measured exactly as `envace demo` measures it
(`envace.cli._fidelity`: the first 24 test tasks, one trajectory each, Act at T=1.0, rollout seed 1, every rehearsed
observation scored against the real one). Two suites with the same tools and templates:

- `bank-world`: every task starts from the record of one of eight customers, the same record each time, so a
  balance, a transaction or a frozen account can be learnt; the warm-up is the demo's own (`runs/demo-world/sft`,
  written by `envace demo --full --out runs/demo-world`), or trained here when missing.
- `bank`: a fresh random world per task, which no training can predict beyond the tools' formats and rules.

    python bench/world_learning.py                 # both suites, resumable (a stage whose output exists is kept)
    python bench/world_learning.py --suites bank-world

Writes docs/results/world-learning/: one fidelity summary per (suite, stage) and summary.md / summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from envace.cli import DEMO_FIDELITY_TASKS, _fidelity, demo_sft_config, fidelity_table  # noqa: E402
from envace.config import SFTConfig  # noqa: E402
from envace.core.precision import hardware_summary  # noqa: E402
from envace.training.sft import sft  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
REHEARSE_STEPS = 40
"""Optimizer steps (x 4 gold trajectories) of each Rehearse-only stage; stage i (from 1) has seed i."""
WARMUPS = {"bank-world": "runs/demo-world/sft"}
"""Warm-ups made elsewhere (the demo's); a suite without one gets a warm-up of the demo's shape here."""


def trained(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "DONE"))


def mark_done(path: str) -> None:
    Path(path, "DONE").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")


def warm_up(suite: str, runs: str) -> str:
    given = WARMUPS.get(suite)
    if given and os.path.isdir(os.path.join(given, "checkpoints")):  # saved when the warm-up is done
        return given
    out = os.path.join(runs, f"{suite}-sft30")
    if not trained(out):
        cfg = demo_sft_config(MODEL, suite, out, seed=0)
        cfg.progress = False
        sft(cfg)
        mark_done(out)
    return out


def rehearse_stage(start: str, suite: str, out: str, seed: int, steps: int) -> str:
    if not trained(out):
        sft(
            SFTConfig(
                model=start,
                suite=suite,
                roles=("rehearse",),
                steps=steps,
                batch_tasks=4,
                lr=1e-4,
                bf16="auto",
                seed=seed,
                out_dir=out,
                tensorboard=False,
                progress=False,
            )
        )
        mark_done(out)
    return out


def measure(model: str, suite: str, path: Path) -> dict:
    if path.exists():
        return json.loads(path.read_text())["summary"]
    t0 = time.perf_counter()
    summary = _fidelity(model, suite, DEMO_FIDELITY_TASKS)
    path.write_text(
        json.dumps(
            {"model": model, "suite": suite, "seconds": round(time.perf_counter() - t0), "summary": summary}, indent=1
        )
    )
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suites", nargs="+", default=["bank-world", "bank"])
    p.add_argument("--out", default="docs/results/world-learning")
    p.add_argument("--runs", default="runs/world-learning")
    p.add_argument("--stages", type=int, default=2, help="Rehearse-only stages after the warm-up")
    p.add_argument("--steps", type=int, default=REHEARSE_STEPS, help="optimizer steps of each stage")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, results = [], {}
    for suite in args.suites:
        model = warm_up(suite, args.runs)
        for i in range(args.stages + 1):  # each stage measured as soon as it is trained (a stopped run keeps them)
            if i == 0:
                label = "warm-up (SFT 30 x 4, both roles)"
            else:
                name = f"{suite}-r{args.steps * i}"
                model = rehearse_stage(model, suite, os.path.join(args.runs, name), seed=i, steps=args.steps)
                label = f"+ {args.steps * i} steps x 4, Rehearse rows only"
            path = model
            summary = measure(path, suite, out / f"{suite}-{i}.json")
            rows.append((f"`{suite}`: {label}", summary))
            results[f"{suite}/{i}"] = {"label": label, "model": path, "summary": summary}
            print(
                f"{suite} {label}: exact {summary['overall']['exact']:.3f} (n={int(summary['overall']['n'])})",
                flush=True,
            )
    lines = [
        "Rehearse fidelity on the first 24 test tasks of each suite, one trajectory each (Act at T=1.0, seed 1), every",
        "rehearsed observation against the real one; exact = canonical JSON equal, 95% Wilson interval over observations.",
        f"`python bench/world_learning.py {' '.join(sys.argv[1:])}`",
        "",
        *fidelity_table(rows),
        "",
        f"Hardware: {hardware_summary()['cpu']}",
    ]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
