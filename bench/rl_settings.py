"""Choose the demo's RL settings on the validation split, never on test (issue 16, item 1).

One SFT warm-up (the demo's: 256 bank train tasks, 30 steps of 4, lr 1e-4, bf16 where fast, seed 0), then each
candidate RL setting from it (EnvACE variant, rehearsed rollouts only), each evaluated greedily on the same 100
bank *val* tasks (carved from train, disjoint from test) in the real environment, paired against the SFT model.
Resumable: a candidate whose val result exists in the work folder is not run again.

    python bench/rl_settings.py                      # every candidate (about 8-10 min each on 2 cores)
    python bench/rl_settings.py --only cons cons2    # some of them
Writes bench/results/rl_settings.json and .md (the table and per-kind comparisons), and into
bench/results/rl_settings_val/ every val result (per-task outcomes, no trajectories) and training curve.
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

import dataclasses  # noqa: E402

from envace.cli import _demo_rollout, demo_sft_config, demo_train_config  # noqa: E402
from envace.config import to_dict  # noqa: E402
from envace.evaluation.budget import evaluate_model  # noqa: E402
from envace.evaluation.trials import compare_results, format_comparison, load_result, save_result  # noqa: E402
from envace.core.precision import hardware_summary  # noqa: E402
from envace.training.sft import sft  # noqa: E402
from envace.training.trainer import train  # noqa: E402

SPLIT, N_TASKS, EVAL_SEED = "val", 100, 1
# name -> (what it tries, TrainConfig fields over the demo's RL defaults below)
CANDIDATES: dict[str, tuple[str, dict]] = {
    "demo": (
        "the demo's own setting: gold_f1*reply_facts, lr 1e-5, float32",
        {"reward": "gold_f1*reply_facts", "bf16": False, "rollout_bf16": False},
    ),
    "f1": ("gold_f1 alone (dense)", {"reward": "gold_f1"}),
    "oc": ("outcome_checklist (dense, rule-checked outcome)", {"reward": "outcome_checklist"}),
    "cons": (
        "consistent_f1*consistent_facts: the gold read in the imagined world",
        {"reward": "consistent_f1*consistent_facts"},
    ),
    "cons2": (
        "as cons, lr 3e-5 and 2 update epochs",
        {"reward": "consistent_f1*consistent_facts", "lr": 3e-5, "update_epochs": 2},
    ),
}
# over the demo's EnvACE step (envace.cli.demo_train_config: 4 iterations x 2 tasks x 4 trajectories, lr 1e-5)
RL_DEFAULTS = dict(progress=False, bf16="auto", rollout_bf16="auto")


def evaluate(model: str, path: str) -> dict:
    if not os.path.exists(path):
        t0 = time.perf_counter()
        res = evaluate_model(
            model, "bank", SPLIT, N_TASKS, 1, seed=EVAL_SEED, rollout=_demo_rollout(), bf16="auto", progress=False
        )
        save_result(res, path, config={"model": model, "split": SPLIT, "wall_s": round(time.perf_counter() - t0, 1)})
    return load_result(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="runs/rl-settings", help="checkpoints and val results (resumable)")
    ap.add_argument("--only", nargs="*", help="candidates to run (default: all)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "rl_settings"))
    args = ap.parse_args()
    names = args.only or list(CANDIDATES)
    os.makedirs(args.work, exist_ok=True)
    kept = args.out + "_val"
    os.makedirs(kept, exist_ok=True)

    def keep(*paths: str) -> None:
        """A copy for the repository: a val result without its trajectories (per-task outcomes stay), a curve."""
        for p in paths:
            with open(p, encoding="utf-8") as f:
                d = json.load(f)
            d.pop("trajectories", None)
            with open(os.path.join(kept, os.path.basename(p)), "w", encoding="utf-8") as f:
                json.dump(d, f, indent=1)

    scfg = demo_sft_config("SmolLM2-135M-Instruct", "bank", os.path.join(args.work, "sft"), seed=0)
    sft_ckpt = os.path.join(scfg.out_dir, "checkpoints", f"step-{scfg.steps:06d}", "policy")
    if not os.path.isdir(sft_ckpt):
        sft(scfg)
    base = evaluate(sft_ckpt, os.path.join(args.work, "val-sft.json"))
    keep(os.path.join(args.work, "val-sft.json"))
    rows, reused = [], []
    for name in names:
        what, over = CANDIDATES[name]
        path = os.path.join(args.work, f"val-{name}.json")
        mpath = os.path.join(args.work, f"metrics-{name}.json")
        cfg = dataclasses.replace(
            demo_train_config(sft_ckpt, "bank", os.path.join(args.work, f"rl-{name}"), seed=0),
            **{**RL_DEFAULTS, **over},
        )
        if os.path.exists(path):
            reused.append(name)
        else:
            t0 = time.perf_counter()
            tr = train(cfg)
            with open(mpath, "w", encoding="utf-8") as f:
                json.dump({"train_s": round(time.perf_counter() - t0, 1), "metrics": tr.metrics}, f)
            evaluate(os.path.join(tr.checkpoint, "policy"), path)
        cand = load_result(path)
        cmp = compare_results(base, cand, names=("SFT", name))
        with open(mpath, encoding="utf-8") as f:
            trained = json.load(f)
        settings = {k: v for k, v in to_dict(cfg).items() if k not in ("out_dir", "model")}
        rows.append(
            {
                "name": name,
                "what": what,
                "settings": settings,
                "train_s": trained["train_s"],
                "val_success": cand["metrics"]["success_rate"],
                "comparison": cmp,
                "reward_per_iteration": [round(m["reward/mean"], 3) for m in trained["metrics"]],
            }
        )
        keep(path, mpath)
        print(
            f"{name}: val {cand['metrics']['success_rate']:.3f} (SFT {base['metrics']['success_rate']:.3f})", flush=True
        )
    lines = [
        f"# RL settings chosen on bank {SPLIT} ({N_TASKS} tasks), never on test",
        "",
        f"SFT warm-up (the demo's), then the demo's EnvACE step (4 iterations x 2 tasks x 4 rehearsed trajectories) from it; greedy evaluation in the real environment. SFT on val: {base['metrics']['success_rate']:.3f}.",
        "",
        "| setting | what it tries | val success | B - SFT [paired 95% CI] | McNemar p | reward per iteration |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        o = r["comparison"]["overall"]
        lines.append(
            f"| `{r['name']}` | {r['what']} | {r['val_success']:.3f} | {o['diff']:+.3f} [{o['diff_ci95'][0]:+.3f}, {o['diff_ci95'][1]:+.3f}] | {o['p']:.3g} | {r['reward_per_iteration']} |"
        )
    lines += ["", "Per task kind:", ""]
    for r in rows:
        lines += ["```", format_comparison(r["comparison"]), "```", ""]
    if reused:
        lines.append(
            f"Val results read from the work folder {args.work} (written by an earlier run with the same settings and seeds): {', '.join(reused)}."
        )
    lines.append(
        f"Hardware: {hardware_summary()['cpu']}; command: python bench/rl_settings.py {' '.join(sys.argv[1:])}"
    )
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w", encoding="utf-8") as f:
        json.dump(
            {
                "split": SPLIT,
                "n_tasks": N_TASKS,
                "sft_val_success": base["metrics"]["success_rate"],
                "candidates": rows,
                "hardware": hardware_summary(),
            },
            f,
            indent=1,
            default=str,
        )
    with open(args.out + ".md", "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
