"""Which test-time rehearsal helps, chosen on val (issue 29, item 2).

One model, one suite, one split (val by default), the demo's rollout settings: every cell of a grid of test-time
rehearsal settings (budget N, mode, memory format) is evaluated on the same tasks in the real environment, greedy final
Act, and paired with N = 0 (plain acting) on those tasks. The attempts themselves sample Act at T = 1 and never touch
the real environment (METHOD.md section 3); ``plan`` is the compute-matched baseline (N plans, no tool result).

    python bench/tts_val.py --model runs/demo/train/checkpoints/.../policy --name envace
    python bench/tts_val.py --model ... --name sft --cells 0 parallel-2-lessons sequential-2-lessons plan-2
    python bench/tts_val.py --model ... --name envace-test --split test --tasks 100 --cells 0 <chosen> --test-once

A cell is ``0`` or ``<mode>-<N>[-<memory>]`` (modes: envace.evaluation.tts.REHEARSAL_MODES; memory formats:
MEMORY_FORMATS, default lessons). Writes into ``--out/<name>/``: ``<cell>.json`` (per-task outcomes: ``envace compare
<out>/<name>/0.json <out>/<name>/<cell>.json`` recomputes a difference), ``<cell>.records.jsonl`` (what each final Act
was told: attempts, reflections, memory, the real run), and ``summary.md`` / ``summary.json``. Finished cells are
reused, so a stopped run goes on where it stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from envace.backends.loaders import open_backend  # noqa: E402
from envace.core.precision import hardware_summary  # noqa: E402
from envace.envs import load_tasks  # noqa: E402
from envace.evaluation.budget import evaluate_at_budget  # noqa: E402
from envace.evaluation.demo import demo_rollout  # noqa: E402
from envace.evaluation.trials import compare_results, load_result, rate_with_ci, save_result  # noqa: E402
from envace.evaluation.tts import MEMORY_FORMATS, REHEARSAL_MODES, TTSConfig, save_records  # noqa: E402

CELLS = ("0", "parallel-1-lessons", "parallel-2-lessons", "sequential-2-lessons", "parallel-2-model", "plan-2")


def parse_cell(cell: str) -> tuple[int, str, str]:
    """``"0"`` -> (0, "parallel", "lessons"); ``"sequential-2-model"`` -> (2, "sequential", "model"); a bad cell
    raises ValueError naming the valid modes and memory formats."""
    if cell == "0":
        return 0, "parallel", "lessons"
    parts = cell.split("-", 2)  # a memory format may hold a dash (agreed-live)
    if len(parts) not in (2, 3) or not parts[1].isdigit() or int(parts[1]) < 1:
        raise ValueError(f"cell {cell!r}: expected 0 or <mode>-<N>[-<memory>], e.g. parallel-2-lessons")
    mode, n, memory = parts[0], int(parts[1]), parts[2] if len(parts) == 3 else "lessons"
    REHEARSAL_MODES.get(mode)  # unknown names raise, listing the valid ones
    MEMORY_FORMATS.get(memory)
    return n, mode, memory


def run_cell(policy, tasks, cell: str, seed: int):
    n, mode, memory = parse_cell(cell)
    rollout = demo_rollout()
    greedy = rollout.act.with_(temperature=0.0)
    if n == 0:
        return evaluate_at_budget(policy, tasks, rollout=dataclasses.replace(rollout, act=greedy), seed=seed)
    tts = TTSConfig(n=n, mode=mode, memory=memory, rollout=rollout, final_act=greedy, seed=seed)
    return evaluate_at_budget(policy, tasks, rollout=rollout, n=n, mode=mode, tts=tts, seed=seed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a model name, folder or training checkpoint")
    ap.add_argument("--name", required=True, help="the model's name in the output folder (e.g. sft, envace)")
    ap.add_argument("--suite", default="shop-world")
    ap.add_argument("--split", default="val")
    ap.add_argument("--tasks", type=int, default=48)
    ap.add_argument("--seed", type=int, default=1, help="seed of the task draw and of the attempts' sampling")
    ap.add_argument("--cells", nargs="+", default=list(CELLS))
    ap.add_argument("--backend", default="auto", help="auto: vLLM where it runs and bf16 is fast, else hf")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "tts-val"))
    ap.add_argument(
        "--test-once",
        action="store_true",
        help="allow --split test: for the one run of a setting already chosen on val, never to choose one",
    )
    a = ap.parse_args()
    if a.split == "test" and not a.test_once:
        ap.error("refusing the test split: choose the cells on val; --test-once for the one final run")
    for c in a.cells:
        parse_cell(c)  # fail on a bad cell before a model loads
    cells = ["0", *(c for c in a.cells if c != "0")]
    out = os.path.join(a.out, a.name)
    os.makedirs(out, exist_ok=True)
    tasks = load_tasks(a.suite, a.split, n=a.tasks, seed=a.seed)
    policy = None
    times: dict[str, float] = {}
    config = {"model": a.model, "suite": a.suite, "split": a.split, "tasks": a.tasks, "seed": a.seed}
    for cell in cells:
        path = os.path.join(out, f"{cell}.json")
        if os.path.isfile(path):
            if why := reuse_mismatch(load_result(path).get("config") or {}, config):
                ap.error(f"{path} was made with another {why}: choose another --name or --out")
            print(f"[tts-val] {a.name} {cell}: reusing {path}", flush=True)
            continue
        policy = policy or open_backend(a.model, a.backend, bf16="auto")
        print(f"[tts-val] {a.name} {cell} on {len(tasks)} {a.suite} {a.split} tasks", flush=True)
        t0 = time.perf_counter()
        res = run_cell(policy, tasks, cell, a.seed)
        times[cell] = round(time.perf_counter() - t0, 1)
        save_result(res, path, config={**config, "cell": cell, "seconds": times[cell]})
        if res.records:
            save_records(os.path.join(out, f"{cell}.records.jsonl"), res.records, with_rows=False)
        print(f"[tts-val] {a.name} {cell}: success {rate_with_ci(res.metrics)} ({times[cell]:.0f} s)", flush=True)
    write_summary(out, a.name, cells)
    return 0


def reuse_mismatch(saved: dict, wanted: dict) -> str:
    """Why a finished cell cannot be reused for this run (empty: it can): the settings it was made with that differ
    from this run's, e.g. ``seed 0, not 1`` (a cell of another task draw would be paired with the wrong N = 0)."""
    return ", ".join(f"{k} {saved.get(k)!r}, not {v!r}" for k, v in wanted.items() if saved.get(k) != v)


def write_summary(out: str, name: str, cells: list[str]) -> None:
    """summary.md / summary.json: each cell's success with its Wilson interval, the paired difference to N = 0, tool
    calls per trajectory, tokens generated per task (rehearsal included) and the seconds it took."""
    base = load_result(os.path.join(out, "0.json"))
    rows, lines = [], []
    head = ["cell", "success [95% CI]", "- N=0, paired 95% CI", "p", "tool calls / traj", "gen tokens / task", "s"]
    lines += ["| " + " | ".join(head) + " |", "|---|" + "---|" * (len(head) - 1)]
    for cell in cells:
        r = load_result(os.path.join(out, f"{cell}.json"))
        m = r["metrics"]
        c = compare_results(base, r, names=("N=0", cell)) if cell != "0" else None
        d = c["overall"] if c else None
        diff = f"{d['diff']:+.3f} [{d['diff_ci95'][0]:+.3f}, {d['diff_ci95'][1]:+.3f}]" if d else ""
        p = f"{d['p']:.2f}" if d and d.get("p") is not None else ""
        secs = r.get("config", {}).get("seconds", "")
        lines.append(
            f"| {cell} | {rate_with_ci(m)} | {diff} | {p} | {m.get('tool_calls_per_traj', 0):.2f} "
            f"| {m.get('gen_tokens_per_task', 0):.0f} | {secs} |"
        )
        rows.append({"cell": cell, "metrics": m, "vs_n0": d, "seconds": secs})
    hw = hardware_summary()
    cfg = base.get("config", {})
    text = [
        f"# Test-time rehearsal on {cfg.get('suite')} {cfg.get('split')}: {name}",
        "",
        f"Model `{cfg.get('model')}`; {len(base['per_task'])} tasks (seed {cfg.get('seed')}); the demo's rollout "
        "settings; attempts at Act T=1, final Act greedy; paired bootstrap over tasks against N=0.",
        "",
        *lines,
        "",
        f"Hardware: {hw['cpu']} ({hw['cores']} cores; bf16: {hw['bf16_decision']}). Command: "
        f"`python bench/tts_val.py --model {cfg.get('model')} --name {name} --suite {cfg.get('suite')} "
        f"--split {cfg.get('split')} --tasks {cfg.get('tasks')} --seed {cfg.get('seed')} --cells {' '.join(cells)}`",
    ]
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(text) + "\n")
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump({"name": name, "cells": rows, "hardware": hw}, f, indent=1, default=str)
    print("\n".join(text))


if __name__ == "__main__":
    sys.exit(main())
