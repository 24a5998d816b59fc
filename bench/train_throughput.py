"""Training throughput: envace's update (forward + backward + optimizer over rows) against TRL's GRPOTrainer on
the same model, the same rows (batch shape and completion lengths) and the same optimizer, each in its own
process (so ``ru_maxrss`` is its own peak memory), side by side in one run.

Rows: scripted rehearsal rollouts of B tasks x K trajectories (Act follows the task's gold calls, then replies;
Rehearse returns a fixed ~60-token observation), as the trainer would receive them, with old log-probs
recomputed by the model (untimed) and advantages from random rewards (seeded).

- ``envace``: :func:`envace.training.update.optimizer_step` (packing per context, shared-prefix micro-batches, logits
  only at completion positions, the clipped surrogate of :mod:`envace.math.algos`, token-mean), ``micro_batch_tokens``.
- ``envace@REF`` (``--ref``): the same with ``envace.training.update`` of git revision REF (before/after), in its own
  process (memory), and again alternating steps with the current update in one process (speed ratio).
- ``envace+ckpt`` (``--checkpointing``): the current update with gradient checkpointing (``TrainConfig.
  gradient_checkpointing``: each layer's activations recomputed in the backward pass; no shared-prefix micro-batches).
- ``trl``: ``trl.GRPOTrainer.compute_loss`` (its loss path: per-row prompt + completion, fused LM head log-probs,
  entropies, loss_type="dapo", i.e. token-mean) + backward + AdamW step through the trainer's optimizer,
  ``per_device_train_batch_size`` rows per micro-batch (chosen so a micro-batch holds about
  ``micro_batch_tokens`` padded tokens, like envace's), no generation.

Both: float32 on CPU, AdamW lr 1e-6, grad clip 1.0; ``--steps`` timed optimizer steps after one untimed warm-up
step. Reported: tokens/s (completion tokens, and row tokens = prompt + completion of every row), peak RSS, and
the peak RSS growth over the process's RSS before the first step.

Usage: python bench/train_throughput.py [--tasks 2] [--group 4] [--steps 1] [--ref b2d4f0a] [--checkpointing]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import common  # noqa: F401
from common import Timer, peak_rss_mb, run_json_subprocess, update_module_at, write_result

import torch

from envace.chat.parsing import render_act
from envace.backends.models import DEFAULT_MODEL, enable_gradient_checkpointing, load

OBS = (
    '<observation>{"ok": true, "result": {"status": "completed", "id": "TX-20931", "balance": '
    '1824.5, "currency": "USD", "note": "the operation was applied to the account"}}</observation>'
)


def make_rows(tok, tasks_n: int, group: int, seed: int = 0):
    from envace.backends.scripted import ScriptedBackend
    from envace.envs import load_tasks
    from envace.chat.prompts import REHEARSE_SYSTEM
    from envace.rollout.engine import RolloutConfig, RolloutEngine
    from envace.training.trainer import rows_with_advantages

    tasks = load_tasks("builtin", "train", n=tasks_n, seed=seed)
    by_user = {t.user_turns[0]: t for t in tasks}

    def respond(prompt: str) -> str:
        if REHEARSE_SYSTEM[:40] in prompt:
            return OBS
        task = next(t for u, t in by_user.items() if u in prompt)
        gold, n = task.flat_gold(), prompt.count("<|im_start|>tool")
        return (
            render_act([gold[n]])
            if n < len(gold)
            else "All done: every operation you asked for has been carried out and checked."
        )

    trajs = RolloutEngine(ScriptedBackend(tok, respond), RolloutConfig(max_steps=8)).run(tasks, group_size=group)
    g = torch.Generator().manual_seed(seed)
    for t in trajs:
        t.reward = float(torch.rand((), generator=g))
    rows, adv, _ = rows_with_advantages(trajs, "rolewise", ("act", "rehearse"))
    return rows, adv


def rss_now_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker_envace(args, ref: str | None, ab: bool = False, checkpointing: bool = False) -> dict:
    """One process. ``ab``: alternate steps of the current update and the one of ``ref`` on the same model
    (A, B, A, B, ...; the fastest of each), a before/after ratio that load changes between processes cannot skew."""
    from envace.math import algos

    cur = __import__("envace.training.update", fromlist=["x"])
    U = update_module_at(ref) if (ref and not ab) else cur
    model, tok = load(args.model)
    if checkpointing:
        enable_gradient_checkpointing(model)
    rows, adv = make_rows(tok, args.tasks, args.group)
    temps = {"act": 1.0, "rehearse": 1.0}
    U.recompute_old_logprobs(model, rows, micro_batch_tokens=args.micro_batch_tokens, temperatures=temps)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)

    def loss_fn(logp, mask, idxs, normalizer):
        old = torch.nn.utils.rnn.pad_sequence([torch.tensor(rows[i].old_logprobs) for i in idxs], batch_first=True)
        return algos.policy_loss(logp, old, adv[idxs], mask, clip_eps=0.2, agg="token_mean", normalizer=normalizer)

    def step(sub):
        return U.optimizer_step(
            model,
            opt,
            sub,
            loss_fn,
            agg="token_mean",
            micro_batch_tokens=args.micro_batch_tokens,
            temperatures=temps,
            max_grad_norm=1.0,
        )

    base = rss_now_mb()
    step(rows[: max(1, len(rows) // 8)])  # warm-up
    if ab:
        B = update_module_at(ref)
        times_a, times_b = [], []
        for _ in range(args.steps):
            for mod, times in ((cur, times_a), (B, times_b)):
                with Timer() as t:
                    mod.optimizer_step(
                        model,
                        opt,
                        rows,
                        loss_fn,
                        agg="token_mean",
                        micro_batch_tokens=args.micro_batch_tokens,
                        temperatures=temps,
                        max_grad_norm=1.0,
                    )
                times.append(t.s)
        return {
            "current_step_seconds": times_a,
            "ref_step_seconds": times_b,
            "current_over_ref_speed": min(times_b) / min(times_a),
            "ref": ref,
            "steps_each": args.steps,
        }
    times = []
    for _ in range(args.steps):
        with Timer() as t:
            m = step(rows)
        times.append(t.s)
    n_mb = int(m.get("micro_batches", 0))
    return summary(rows, times, base) | {"micro_batches": n_mb, "packs": len(U.pack_rows(rows)), "ref": ref}


def worker_trl(args) -> dict:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tok = load(args.model)
    rows, adv = make_rows(tok, args.tasks, args.group)
    from envace.training.update import recompute_old_logprobs

    temps = {"act": 1.0, "rehearse": 1.0}
    recompute_old_logprobs(model, rows, micro_batch_tokens=args.micro_batch_tokens, temperatures=temps)
    longest = max(len(r.prompt_ids) for r in rows) + max(len(r.completion_ids) for r in rows)
    mb = max(2, (args.micro_batch_tokens // longest) // 2 * 2)
    out = tempfile.mkdtemp(prefix="trl-bench-")
    cfg = GRPOConfig(
        output_dir=out,
        per_device_train_batch_size=mb,
        num_generations=2,
        gradient_accumulation_steps=1,
        learning_rate=1e-6,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="dapo",
        temperature=1.0,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        max_completion_length=max(len(r.completion_ids) for r in rows),
    )
    ds = Dataset.from_list([{"prompt": "x"}] * 4)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=cfg,
        train_dataset=ds,
        processing_class=tok,
    )
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(), which we do not run (it would generate)
    model = trainer.model
    model.train()
    opt = trainer.create_optimizer()
    pad = tok.pad_token_id

    def batch(idx):
        P = max(len(rows[i].prompt_ids) for i in idx)
        C = max(len(rows[i].completion_ids) for i in idx)
        pi = torch.full((len(idx), P), pad)
        pm = torch.zeros(len(idx), P, dtype=torch.long)
        ci = torch.full((len(idx), C), pad)
        cm = torch.zeros(len(idx), C, dtype=torch.long)
        old = torch.zeros(len(idx), C)
        for j, i in enumerate(idx):
            p, c = rows[i].prompt_ids, rows[i].completion_ids
            pi[j, P - len(p) :] = torch.tensor(p)
            pm[j, P - len(p) :] = 1
            ci[j, : len(c)] = torch.tensor(c)
            cm[j, : len(c)] = 1
            old[j, : len(c)] = torch.tensor(rows[i].old_logprobs)
        return {
            "prompt_ids": pi,
            "prompt_mask": pm,
            "completion_ids": ci,
            "completion_mask": cm,
            "advantages": adv[idx],
            "old_per_token_logps": old,
            "num_items_in_batch": torch.tensor(float(sum(len(r.completion_ids) for r in sub_rows))),
        }

    def step(sub):
        nonlocal sub_rows
        sub_rows = [rows[i] for i in sub]
        opt.zero_grad(set_to_none=True)
        for s in range(0, len(sub), mb):
            loss = trainer.compute_loss(model, batch(sub[s : s + mb]))
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    sub_rows = rows
    base = rss_now_mb()
    step(list(range(max(1, len(rows) // 8))))  # warm-up
    times = []
    for _ in range(args.steps):
        with Timer() as t:
            step(list(range(len(rows))))
        times.append(t.s)
    import trl

    return summary(rows, times, base) | {
        "micro_batches": -(-len(rows) // mb),
        "rows_per_micro_batch": mb,
        "trl_version": trl.__version__,
    }


def summary(rows, times, base_rss) -> dict:
    comp = sum(len(r.completion_ids) for r in rows)
    tot = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    s = min(times)
    return {
        "rows": len(rows),
        "completion_tokens": comp,
        "row_tokens": tot,
        "step_seconds": times,
        "completion_tokens_per_s": comp / s,
        "row_tokens_per_s": tot / s,
        "peak_rss_mb": peak_rss_mb(),
        "rss_before_step_mb": base_rss,
        "peak_growth_mb": peak_rss_mb() - base_rss,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1, help="timed optimizer steps (the fastest is reported)")
    ap.add_argument("--micro-batch-tokens", type=int, default=4096, help="as TrainConfig.micro_batch_tokens")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--ref", default=None, help="also run envace.training.update of this git revision")
    ap.add_argument("--no-trl", action="store_true")
    ap.add_argument("--checkpointing", action="store_true", help="also the update with gradient checkpointing")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.worker:
        if args.worker == "trl":
            res = worker_trl(args)
        elif args.worker == "envace+ckpt":
            res = worker_envace(args, None, checkpointing=True)
        elif args.worker.startswith("ab@"):
            res = worker_envace(args, args.worker.split("@", 1)[1], ab=True)
        else:
            res = worker_envace(args, args.worker.split("@", 1)[1] if "@" in args.worker else None)
        print(json.dumps(res))
        return

    common_args = [
        __file__,
        "--tasks",
        str(args.tasks),
        "--group",
        str(args.group),
        "--steps",
        str(args.steps),
        "--micro-batch-tokens",
        str(args.micro_batch_tokens),
        "--model",
        args.model,
    ]
    results: dict = {
        "model": args.model,
        "B": args.tasks,
        "K": args.group,
        "micro_batch_tokens": args.micro_batch_tokens,
    }
    contenders = ["envace"] + ([f"envace@{args.ref}"] if args.ref else [])
    contenders += (["envace+ckpt"] if args.checkpointing else []) + ([] if args.no_trl else ["trl"])
    for name in contenders:
        t0 = time.perf_counter()
        results[name] = run_json_subprocess(common_args + ["--worker", name])
        r = results[name]
        print(
            f"{name}: {r['row_tokens_per_s']:.0f} row tok/s, {r['completion_tokens_per_s']:.1f} "
            f"completion tok/s, step {min(r['step_seconds']):.1f}s, peak RSS {r['peak_rss_mb']:.0f} "
            f"MiB (+{r['peak_growth_mb']:.0f}) [{time.perf_counter() - t0:.0f}s]"
        )
    e = results["envace"]
    ratios = {}
    if "envace+ckpt" in results:
        c = results["envace+ckpt"]
        ratios["ckpt_over_envace_peak_growth"] = c["peak_growth_mb"] / max(1.0, e["peak_growth_mb"])
        ratios["ckpt_over_envace_step_time"] = min(c["step_seconds"]) / min(e["step_seconds"])
    if "trl" in results:
        ratios["envace_vs_trl_tokens_per_s"] = e["row_tokens_per_s"] / results["trl"]["row_tokens_per_s"]
        ratios["envace_over_trl_peak_rss"] = e["peak_rss_mb"] / results["trl"]["peak_rss_mb"]
        ratios["envace_over_trl_peak_growth"] = e["peak_growth_mb"] / max(1.0, results["trl"]["peak_growth_mb"])
        results["targets"] = {
            "envace >= 1.2x TRL GRPOTrainer tokens/s": ratios["envace_vs_trl_tokens_per_s"] >= 1.2,
            "envace peak memory <= TRL": e["peak_rss_mb"] <= results["trl"]["peak_rss_mb"],
        }
    if args.ref:
        ratios[f"envace_vs_envace@{args.ref}"] = (
            e["row_tokens_per_s"] / results[f"envace@{args.ref}"]["row_tokens_per_s"]
        )
        ab = results["ab"] = run_json_subprocess(
            common_args + ["--steps", str(max(2, args.steps)), "--worker", f"ab@{args.ref}"]
        )
        ratios[f"envace_vs_envace@{args.ref}_alternating"] = ab["current_over_ref_speed"]
        print(
            f"alternating steps in one process: current {min(ab['current_step_seconds']):.1f}s, "
            f"{args.ref} {min(ab['ref_step_seconds']):.1f}s per step"
        )
    results["ratios"] = ratios
    print("ratios:", {k: round(v, 2) for k, v in ratios.items()})
    print("targets:", results.get("targets"))
    write_result("train_throughput", results, args.out)


if __name__ == "__main__":
    sys.exit(main())
