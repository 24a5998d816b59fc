"""How far each arm of an experiment moved from its warm-up, role by role: KL(warm-up || arm) per token of each role.

    python bench/act_shift.py docs/results/experiment-shop-world-decide/results.json [--tasks 32] [--seeds 2 0]

For each seed the warm-up (the ``sft`` arm's model) rehearses the first ``--tasks`` evaluation tasks once, both roles
sampled at T=1 (the experiment's rollout limits, seeded): its own Act and Rehearse tokens. Every arm's final model of
that seed then scores those tokens (float32, no test-time anything), and per role the per-token k3 estimate
``mean(exp(d) - 1 - d)``, d = log p_arm - log p_warm-up, estimates KL(warm-up || arm) (unbiased: the tokens are the
warm-up's own samples at T=1), beside the mean change of the tokens' log-probability. An arm whose Act moved little
changes few outcomes; with shared weights, EnvACE's update mixes Act and Rehearse tokens in one token mean, and this
says how much of its movement each role got. Writes ``act_shift.md`` and ``act_shift.json`` beside results.json."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from envace.backends.hf import HFBackend  # noqa: E402
from envace.backends.models import load  # noqa: E402
from envace.config import from_dict  # noqa: E402
from envace.core.types import Row  # noqa: E402
from envace.envs import load_tasks  # noqa: E402
from envace.evaluation.experiment import recorded_model  # noqa: E402
from envace.rollout.engine import RolloutConfig, RolloutEngine  # noqa: E402
from envace.training.update import completion_logprobs, micro_batches, pack_rows  # noqa: E402

ROLES = ("act", "rehearse")


def warmup_rows(model: Any, tok: Any, tasks: list, rollout: RolloutConfig, seed: int) -> list[Row]:
    """The rows (both roles, completion tokens only) of one rehearsed trajectory per task by ``model``, every
    generation at T=1, top-p 1 (its own distribution), within ``rollout``'s limits."""
    at_t1 = dataclasses.replace(
        rollout,
        act=dataclasses.replace(rollout.act, temperature=1.0, top_p=1.0),
        rehearse=dataclasses.replace(rollout.rehearse, temperature=1.0, top_p=1.0),
        progress=False,
    )
    trajs = RolloutEngine(HFBackend(model, tok), at_t1, mode="rehearsal").run(
        tasks, group_prefix="shift", group_size=1, seed=seed
    )
    return [r for t in trajs for r in t.rows if r.completion_ids and r.role in ROLES]


@torch.no_grad()
def token_logprobs(model: Any, rows: list[Row], max_tokens: int = 4096) -> list[np.ndarray]:
    """Log-probability (float32, T=1) of each row's completion tokens under ``model``, row by row."""
    out: dict[int, np.ndarray] = {}
    for mb in micro_batches(pack_rows(rows), max_tokens):
        for i, lp in completion_logprobs(model, mb, rows, {}).items():
            out[i] = lp.float().numpy()
    return [out[i] for i in range(len(rows))]


def shift(base: list[np.ndarray], arm: list[np.ndarray], rows: list[Row]) -> dict[str, dict[str, float]]:
    """Per role: tokens, the k3 estimate of KL(base || arm) per token, and the mean change of the tokens'
    log-probability (arm - base; below 0: the base model's own tokens became less likely)."""
    out = {}
    for role in ROLES:
        d = [a - b for a, b, r in zip(arm, base, rows) if r.role == role]
        d = np.concatenate(d) if d else np.zeros(0)
        out[role] = {
            "tokens": int(d.size),
            "kl_k3": float(np.mean(np.exp(d) - 1.0 - d)) if d.size else 0.0,
            "mean_dlogp": float(np.mean(d)) if d.size else 0.0,
        }
    return out


def _kl_cell(values: list[float]) -> str:
    """``mean (seed a / seed b / ...)``."""
    each = " / ".join(f"{v:.4f}" for v in values)
    return f"{np.mean(values):.4f} ({each})"


def markdown(table: dict[str, dict[str, Any]], tasks: int, split: str, seeds: list[int], cmd: str) -> list[str]:
    """The table of :func:`main`: per arm, each role's KL (mean over seeds, then each seed's) and mean change of
    log-probability (mean over seeds), and the tokens scored."""
    lines = [
        f"KL(warm-up || arm) per token on the warm-up's own rehearsed tokens (first {tasks} `{split}` tasks, T=1, k3 "
        f"estimate): mean over seeds (seeds {' / '.join(map(str, seeds))}); Δ log p: mean change of those tokens' "
        f"log-probability, mean over seeds. `{cmd}`",
        "",
        "| arm | Act KL | Rehearse KL | Act Δ log p | Rehearse Δ log p | Act / Rehearse tokens |",
        "|---|---|---|---|---|---|",
    ]
    for arm, by_seed in table.items():
        per = {r: [by_seed[str(s)][r] for s in seeds if str(s) in by_seed] for r in ROLES}
        kl = {r: _kl_cell([x["kl_k3"] for x in per[r]]) for r in ROLES}
        dl = {r: f"{np.mean([x['mean_dlogp'] for x in per[r]]):+.4f}" for r in ROLES}
        n = {r: sum(x["tokens"] for x in per[r]) for r in ROLES}
        cells = [arm, kl["act"], kl["rehearse"], dl["act"], dl["rehearse"], f"{n['act']} / {n['rehearse']}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="an experiment's results.json")
    ap.add_argument("--tasks", type=int, default=32, help="evaluation tasks the warm-up rehearses (the first ones)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default: every seed the sft arm ran")
    ap.add_argument("--arms", nargs="+", default=None, help="default: every trained arm but sft")
    a = ap.parse_args(argv)
    res = json.load(open(a.results, encoding="utf-8"))
    c = res["config"]
    cfg = types.SimpleNamespace(out_dir=c["out_dir"])  # where recorded_model looks for moved model folders
    rollout = from_dict(RolloutConfig, c["rollout"])
    tasks = load_tasks(c["suite"], c.get("eval_split", "test"), n=a.tasks)
    seeds = a.seeds or sorted(int(s) for s in res["runs"]["sft"])
    arms = a.arms or [x for x in res["arms"] if x not in ("base", "sft") and x in res["runs"]]
    table: dict[str, dict[str, Any]] = {}
    for seed in seeds:
        warm_path = recorded_model(cfg, res["runs"]["sft"][str(seed)]["models"]["policy"])
        model, tok = load(warm_path)
        model.eval()
        rows = warmup_rows(model, tok, tasks, rollout, seed)
        base = token_logprobs(model, rows)
        del model
        for arm in arms:
            rec = res["runs"].get(arm, {}).get(str(seed))
            if rec is None:
                continue
            m, _ = load(recorded_model(cfg, rec["models"]["policy"]))
            m.eval()
            table.setdefault(arm, {})[str(seed)] = shift(base, token_logprobs(m, rows), rows)
            print(f"[act-shift] seed {seed} {arm}: {table[arm][str(seed)]}", flush=True)
            del m
    cmd = "python bench/act_shift.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = markdown(table, a.tasks, c.get("eval_split", "test"), seeds, cmd)
    out = os.path.dirname(os.path.abspath(a.results))
    with open(os.path.join(out, "act_shift.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "act_shift.json"), "w", encoding="utf-8") as f:
        json.dump({"tasks": a.tasks, "seeds": seeds, "shift": table}, f, indent=1)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
