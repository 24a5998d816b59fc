"""Choose the demo's RL settings on the validation split, never on test (issue 16, item 1).

An SFT warm-up (256 bank train tasks, 30 steps of 4, lr 1e-4, bf16 where fast, seed 0, every kind; a candidate
may change it, e.g. the *headroom* ones warm up on the simple and read-only kinds only, as the demo now does), then the
candidate's RL setting from it (EnvACE variant, rehearsed rollouts only), each evaluated greedily on the same 100 bank
*val* tasks (carved from train, disjoint from test) in the real environment, paired against its own warm-up.
Resumable: a warm-up or candidate whose val result exists in the work folder is not run again, and the table holds
every candidate with a result there.

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
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import dataclasses  # noqa: E402

from envace.evaluation.demo import HEADROOM_KINDS, demo_rollout, demo_sft_config, demo_train_config  # noqa: E402
from envace.config import to_dict  # noqa: E402
from envace.evaluation.budget import evaluate_model  # noqa: E402
from envace.evaluation.trials import compare_results, format_comparison, load_result, save_result  # noqa: E402
from envace.core.precision import hardware_summary  # noqa: E402
from envace.training.sft import sft  # noqa: E402
from envace.training.trainer import train  # noqa: E402

SPLIT, N_TASKS, EVAL_SEED = "val", 100, 1
# the warm-up that leaves RL something to learn (issue 16's "headroom" lever): no gold of the kinds whose later
# calls need an earlier observation (chained) or that recover from a tool error (recovery)
HEADROOM = {"task_kinds": HEADROOM_KINDS}  # the demo's warm-up since this choice
# name -> (what it tries, TrainConfig fields over the demo's RL defaults below[, SFTConfig fields over the demo's])
CANDIDATES: dict[str, tuple] = {
    "demo": (
        "the demo's old setting: gold_f1*reply_facts, lr 1e-5, float32",
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
    "headroom": (
        "SFT on the simple and read-only kinds only, then the old demo's RL (gold_f1*reply_facts, all kinds)",
        {"reward": "gold_f1*reply_facts"},
        HEADROOM,
    ),
    "headroom_rl_kinds": (
        "SFT on the simple and read-only kinds only, then the old demo's RL on the chained and recovery kinds",
        {"reward": "gold_f1*reply_facts", "task_kinds": ("chained", "recovery")},
        HEADROOM,
    ),
    "headroom_cons": (
        "SFT on the simple and read-only kinds only, then RL (all kinds) on the imagined world's own gold read",
        {"reward": "consistent_f1*consistent_facts"},
        HEADROOM,
    ),
    "headroom_cons_real": (
        "as headroom_cons, with 1 of each group's 4 trajectories in the real environment (real_share 0.25: beyond"
        " the paper, an arm of its own, not EnvACE)",
        {"reward": "consistent_f1*consistent_facts", "real_share": 0.25},
        HEADROOM,
    ),
}


def warmup_name(over: dict) -> str:
    """The work-folder name of a warm-up: ``sft`` (every kind), else ``sft-`` and its changed fields."""
    if not over:
        return "sft"
    return "sft-" + "-".join(f"{k}={'+'.join(v) if isinstance(v, tuple) else v}" for k, v in sorted(over.items()))


# over the demo's EnvACE step (envace.evaluation.demo.demo_train_config: 4 iterations x 2 tasks x 4 trajectories,
# lr 1e-5)
RL_DEFAULTS = dict(progress=False, bf16="auto", rollout_bf16="auto")


def evaluate(model: str, path: str) -> dict:
    if not os.path.exists(path):
        t0 = time.perf_counter()
        res = evaluate_model(
            model, "bank", SPLIT, N_TASKS, 1, seed=EVAL_SEED, rollout=demo_rollout(), bf16="auto", progress=False
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

    warmups: dict[str, dict] = {}  # warm-up name -> its val result
    reused: list[str] = []  # candidates whose results come from the committed copies

    def warmup(over: dict) -> str:
        """The warm-up's checkpoint (trained if missing), its val result written (evaluated if missing)."""
        name = warmup_name(over)
        scfg = dataclasses.replace(
            demo_sft_config("SmolLM2-135M-Instruct", "bank", os.path.join(args.work, name), seed=0), **over
        )
        ckpt = os.path.join(scfg.out_dir, "checkpoints", f"step-{scfg.steps:06d}", "policy")
        if not os.path.isdir(ckpt):
            sft(scfg)
        val = os.path.join(args.work, f"val-{name}.json")
        if not os.path.exists(val):
            evaluate(ckpt, val)
            keep(val)
        return ckpt

    def found(name: str) -> str | None:
        """A val result or training record: the work folder's, else the committed copy (without trajectories)."""
        for folder in (args.work, kept):
            if os.path.exists(os.path.join(folder, name)):
                return os.path.join(folder, name)
        return None

    def rl_config(name: str, sft_ckpt: str) -> Any:
        over = CANDIDATES[name][1]
        return dataclasses.replace(
            demo_train_config(sft_ckpt, "bank", os.path.join(args.work, f"rl-{name}"), seed=0),
            **{**RL_DEFAULTS, **over},
        )

    for name in names:  # run what is missing
        path = os.path.join(args.work, f"val-{name}.json")
        if found(f"val-{name}.json"):
            continue
        sft_ckpt = warmup(CANDIDATES[name][2] if len(CANDIDATES[name]) > 2 else {})
        t0 = time.perf_counter()
        tr = train(rl_config(name, sft_ckpt))
        with open(os.path.join(args.work, f"metrics-{name}.json"), "w", encoding="utf-8") as f:
            json.dump({"train_s": round(time.perf_counter() - t0, 1), "metrics": tr.metrics}, f)
        evaluate(os.path.join(tr.checkpoint, "policy"), path)
        keep(path, os.path.join(args.work, f"metrics-{name}.json"))
    rows = []
    for name, (what, over, *sft_over) in CANDIDATES.items():  # every candidate with a result, in table order
        path = found(f"val-{name}.json")
        if path is None:
            continue
        if not path.startswith(args.work):
            reused.append(name)
        wname = warmup_name(sft_over[0] if sft_over else {})
        if wname not in warmups:  # read once, shared by the candidates from it
            warmups[wname] = load_result(found(f"val-{wname}.json"))
        base = warmups[wname]
        cand = load_result(path)
        cmp = compare_results(base, cand, names=(wname.upper() if wname == "sft" else wname, name))
        with open(found(f"metrics-{name}.json"), encoding="utf-8") as f:
            trained = json.load(f)
        settings = {k: v for k, v in to_dict(rl_config(name, "<warm-up>")).items() if k not in ("out_dir", "model")}
        rows.append(
            {
                "name": name,
                "what": what,
                "warmup": wname,
                "warmup_settings": sft_over[0] if sft_over else {},
                "settings": settings,
                "train_s": trained["train_s"],
                "warmup_val_success": base["metrics"]["success_rate"],
                "val_success": cand["metrics"]["success_rate"],
                "comparison": cmp,
                "reward_per_iteration": [round(m["reward/mean"], 3) for m in trained["metrics"]],
            }
        )
        print(f"{name}: val {cand['metrics']['success_rate']:.3f} ({wname} {base['metrics']['success_rate']:.3f})")
    lines = [
        f"# RL settings chosen on bank {SPLIT} ({N_TASKS} tasks), never on test",
        "",
        "A warm-up (`sft` on every kind, or the candidate's own), then the demo's EnvACE "
        "step (4 iterations x 2 tasks x 4 rehearsed trajectories) from it; greedy "
        "evaluation in the real environment, paired against the candidate's own warm-up. "
        + "; ".join(f"`{w}` on val: {r['metrics']['success_rate']:.3f}" for w, r in sorted(warmups.items()))
        + ".",
        "",
        "| setting | what it tries | warm-up (val) | val success | B - "
        "warm-up [paired 95% CI] | McNemar p | reward per iteration |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        o = r["comparison"]["overall"]
        lines.append(
            f"| `{r['name']}` | {r['what']} | `{r['warmup']}` ({r['warmup_val_success']:.3f}) "
            f"| {r['val_success']:.3f} | {o['diff']:+.3f} [{o['diff_ci95'][0]:+.3f}, "
            f"{o['diff_ci95'][1]:+.3f}] | {o['p']:.3g} | {r['reward_per_iteration']} |"
        )
    lines += ["", "Per task kind:", ""]
    for r in rows:
        lines += ["```", format_comparison(r["comparison"]), "```", ""]
    if reused:
        lines.append(
            f"Read from the committed copies in {os.path.relpath(kept, ROOT)} (an "
            f"earlier run of this script, same settings and seeds): {', '.join(reused)}."
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
                "warmup_val_success": {w: r["metrics"]["success_rate"] for w, r in warmups.items()},
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
