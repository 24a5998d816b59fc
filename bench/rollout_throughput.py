"""Rollout throughput: the project's rehearsal rollouts (B tasks x K trajectories, Act and Rehearse) against a
naive ``model.generate`` loop and against llama.cpp, on the same prompts, side by side in one run.

Contenders (same model: SmolLM2-135M-Instruct; HF contenders run its float32 weights, llama.cpp the Q4_1 GGUF
they are dequantized from):

- ``envace``: ``RolloutEngine`` + ``HFBackend`` (all Act generations of a step batched, then all observations of a
  call index; per-session KV reuse, shared-prefix prefill, preallocated KV cache). Act is scripted to the task's
  gold calls (the untrained model emits no tool calls, so it would never reach Rehearse); Rehearse samples freely
  (temperature 0.6, top-p 0.8). Scripted tokens cost one batched forward each, like sampled ones.
- ``envace@REF`` (``--ref``): the same rollout with the backend of git revision REF (before/after). Identical
  tokens are checked.
- ``envace-bf16`` (``--bf16``): the same rollout with ``HFBackend(bf16=True)`` (packed bf16 weights through
  ``envace.backends.fastdecode``, float32 keys/values and attention), with the log-prob drift of its rows against a
  float32 recomputation (what a float32 trainer would see).
- ``naive``: for a subset of the rollout's generate calls (spread over the rollout, about ``--replay-tokens``
  generated tokens), ``model.generate`` per call per trajectory, batch 1, re-encoding the whole prompt, exactly
  as many new tokens as the rollout produced for that call.
- ``llama.cpp`` (if ``llama_cpp`` imports): the same subset through ``llama_cpp.Llama`` on the GGUF, 2 threads,
  single stream (its automatic prefix reuse on); reported whole and decode-only (time after the first token).

Usage: python bench/rollout_throughput.py [--tasks 4] [--group 4] [--ref b2d4f0a] [--bf16]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time

import common  # noqa: F401  (sets the thread-pool environment before torch loads)
from common import HFBackend, Timer, backend_module_at, forced_backend, gold_act_script, write_result

import torch

from envace.envs import load_tasks
from envace.backends.models import DEFAULT_MODEL, gguf_path, load
from envace.rollout.engine import RolloutConfig, RolloutEngine


def run_rollout(backend_cls, model, tok, tasks, cfg, group, **kw):
    be = backend_cls(model, tok, act_script=gold_act_script({t.id: t for t in tasks}), **kw)
    with Timer() as t:
        trajs = RolloutEngine(be, cfg, mode="rehearsal").run(tasks, group_size=group, seed=0)
    gen = be.stats["generated_tokens"]
    rows = [r for tr in trajs for r in tr.rows]
    res = {
        "seconds": t.s,
        "generated_tokens": gen,
        "tokens_per_s": gen / t.s,
        "trajectories_per_s": len(trajs) / t.s,
        "rows": {"act": sum(r.role == "act" for r in rows), "rehearse": sum(r.role == "rehearse" for r in rows)},
        "completion_tokens": {
            "act": sum(len(r.completion_ids) for r in rows if r.role == "act"),
            "rehearse": sum(len(r.completion_ids) for r in rows if r.role == "rehearse"),
        },
        "stats": dict(be.stats),
        "generate_calls": len(be.calls),
    }
    return res, trajs, be


def replay_subset(calls, budget: int) -> list[dict]:
    """Single (prompt, n_new, params) items spread over the rollout, about ``budget`` generated tokens in all."""
    items = []
    for c in calls:
        for p, g in zip(c["prompts"], c["gens"]):
            items.append({"prompt": p, "n": len(g.token_ids), "role": c["role"]})
    total = sum(it["n"] for it in items)
    stride = max(1, round(total / max(1, budget)))
    return items[::stride]


def run_naive(model, tok, items, cfg):
    """model.generate per item, batch 1, the whole prompt encoded, exactly n new tokens."""
    done = 0
    with torch.no_grad(), Timer() as t:
        for it in items:
            sp = cfg.act if it["role"] == "act" else cfg.rehearse
            ids = torch.tensor([it["prompt"]])
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=it["n"],
                min_new_tokens=it["n"],
                do_sample=True,
                temperature=sp.temperature,
                top_p=sp.top_p,
                top_k=0,
                pad_token_id=tok.pad_token_id,
            )
            done += out.shape[1] - ids.shape[1]
    return {"seconds": t.s, "generated_tokens": done, "tokens_per_s": done / t.s, "calls": len(items)}


def run_llama(items, cfg, threads: int):
    try:
        import llama_cpp
    except ImportError:
        return {"skipped": "llama_cpp is not installed (see docs/benchmarks.md for the build command)"}
    llm = llama_cpp.Llama(
        model_path=str(gguf_path()),
        n_ctx=4096,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=512,
        verbose=False,
        seed=0,
    )
    llm.generate(items[0]["prompt"][:8], temp=1.0).__next__()  # warm-up
    llm.reset()
    done, t_first, t_decode, prefill_tok = 0, 0.0, 0.0, 0
    t0 = time.perf_counter()
    for it in items:
        sp = cfg.act if it["role"] == "act" else cfg.rehearse
        before = llm.n_tokens
        reuse = 0
        toks = it["prompt"]
        # llama-cpp-python reuses the longest prefix of the tokens it evaluated last (reset=True does that match)
        for i in range(min(before, len(toks))):
            if llm._input_ids[i] != toks[i]:
                break
            reuse = i + 1
        prefill_tok += len(toks) - reuse
        s = time.perf_counter()
        gen = llm.generate(toks, temp=sp.temperature, top_p=sp.top_p, top_k=0, reset=True)
        for k in range(it["n"]):
            next(gen)
            if k == 0:
                f = time.perf_counter()
                t_first += f - s
        t_decode += time.perf_counter() - f
        done += it["n"]
    total = time.perf_counter() - t0
    decode_tokens = done - len(items)
    return {
        "seconds": total,
        "generated_tokens": done,
        "tokens_per_s": done / total,
        "decode_tokens_per_s": decode_tokens / t_decode if t_decode else float("nan"),
        "prefill_tokens": prefill_tok,
        "prefill_tokens_per_s": prefill_tok / t_first if t_first else float("nan"),
        "threads": threads,
        "llama_cpp_version": getattr(llama_cpp, "__version__", "?"),
    }


def bf16_drift(model, trajs, cfg) -> dict:
    """|log-prob from the bf16 sampler - float32 recomputation| over every completion token of the rows."""
    from envace.training.update import completion_logprobs, micro_batches, pack_rows

    rows = [r for tr in trajs for r in tr.rows]
    temps = {"act": cfg.act.temperature or 1.0, "rehearse": cfg.rehearse.temperature or 1.0}
    diffs = []
    with torch.no_grad():
        for mb in micro_batches(pack_rows(rows), 8192):
            for i, lp in completion_logprobs(model, mb, rows, temps).items():
                diffs += [abs(a - b) for a, b in zip(lp.tolist(), rows[i].old_logprobs)]
    eps = 0.2  # the PPO clip range: a first step's ratio exp(dlogp) leaves [1 - eps, 1 + eps] beyond about log(1 + eps)
    clip = math.log1p(eps)
    return {
        "tokens": len(diffs),
        "mean_abs": statistics.fmean(diffs),
        "max_abs": max(diffs),
        "p99_abs": sorted(diffs)[int(0.99 * (len(diffs) - 1))],
        f"fraction_above_log(1+{eps})": sum(d > clip for d in diffs) / len(diffs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=4, help="B: tasks")
    ap.add_argument("--group", type=int, default=4, help="K: trajectories per task")
    ap.add_argument("--suite", default="builtin")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="llama.cpp runs the default model's GGUF whatever this says")
    ap.add_argument("--ref", default=None, help="also run the backend of this git revision (before/after)")
    ap.add_argument("--bf16", action="store_true", help="also run the rollout under bf16 autocast")
    ap.add_argument(
        "--replay-tokens", type=int, default=400, help="generated tokens replayed by the naive loop and llama.cpp"
    )
    ap.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="llama.cpp threads (torch uses its own setting)"
    )
    ap.add_argument("--no-naive", action="store_true")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    model, tok = load(args.model)
    tasks = load_tasks(args.suite, "train", n=args.tasks, seed=0)
    cfg = RolloutConfig()
    Forced = forced_backend(HFBackend)
    # warm-up (first-call allocations, kernel selection) on one tiny generation
    HFBackend(model, tok).generate([tok.encode("Hello")], cfg.act.with_(max_new_tokens=4, seed=0))

    results: dict = {
        "model": args.model,
        "B": args.tasks,
        "K": args.group,
        "suite": args.suite,
        "rollout_config": dataclasses.asdict(cfg) | {"group_size": args.group},  # (as the results before)
    }
    envace, trajs, be = run_rollout(Forced, model, tok, tasks, cfg, args.group)
    results["envace"] = envace
    print(
        f"envace rollout: {envace['generated_tokens']} tokens in {envace['seconds']:.1f}s = "
        f"{envace['tokens_per_s']:.1f} tok/s, {envace['trajectories_per_s']:.3f} traj/s; rows {envace['rows']}"
    )
    if args.ref:
        old = backend_module_at(args.ref)
        ref, ref_trajs, _ = run_rollout(forced_backend(old.HFBackend), model, tok, tasks, cfg, args.group)
        same = all(
            a.completion_ids == b.completion_ids for x, y in zip(trajs, ref_trajs) for a, b in zip(x.rows, y.rows)
        )
        lp = max(
            (
                abs(p - q)
                for x, y in zip(trajs, ref_trajs)
                for a, b in zip(x.rows, y.rows)
                for p, q in zip(a.old_logprobs, b.old_logprobs)
            ),
            default=0.0,
        )
        ref |= {"ref": args.ref, "identical_tokens": same, "max_logprob_diff": lp}
        results[f"envace@{args.ref}"] = ref
        print(
            f"envace@{args.ref}: {ref['tokens_per_s']:.1f} tok/s (current is "
            f"{envace['tokens_per_s'] / ref['tokens_per_s']:.2f}x); identical tokens: {same}, max |dlogp| {lp:.2e}"
        )
    if args.bf16:
        b16, b16_trajs, _ = run_rollout(Forced, model, tok, tasks, cfg, args.group, bf16=True)
        b16["logprob_drift_vs_fp32"] = bf16_drift(model, b16_trajs, cfg)
        results["envace_bf16"] = b16
        print(
            f"envace bf16: {b16['tokens_per_s']:.1f} tok/s "
            f"({b16['tokens_per_s'] / envace['tokens_per_s']:.2f}x fp32); drift {b16['logprob_drift_vs_fp32']}"
        )
    items = replay_subset(be.calls, args.replay_tokens)
    results["replay"] = {
        "calls": len(items),
        "generated_tokens": sum(it["n"] for it in items),
        "prompt_tokens": sum(len(it["prompt"]) for it in items),
    }
    if not args.no_naive:
        results["naive"] = run_naive(model, tok, items, cfg)
        print(f"naive generate loop: {results['naive']['tokens_per_s']:.1f} tok/s over {len(items)} calls")
    if not args.no_llama:
        results["llama_cpp"] = run_llama(items, cfg, args.threads)
        print(f"llama.cpp: {results['llama_cpp']}")
    r = {}
    e = envace["tokens_per_s"]
    if "naive" in results:
        r["envace_vs_naive"] = e / results["naive"]["tokens_per_s"]
    lc = results.get("llama_cpp", {})
    if "tokens_per_s" in lc:
        r["envace_vs_llama_cpp"] = e / lc["tokens_per_s"]
        r["envace_vs_llama_cpp_decode"] = e / lc["decode_tokens_per_s"]
    if "envace_bf16" in results:
        r["envace_bf16_vs_fp32"] = results["envace_bf16"]["tokens_per_s"] / e
        if "tokens_per_s" in lc:
            r["envace_bf16_vs_llama_cpp_decode"] = results["envace_bf16"]["tokens_per_s"] / lc["decode_tokens_per_s"]
        if "naive" in results:
            r["envace_bf16_vs_naive"] = results["envace_bf16"]["tokens_per_s"] / results["naive"]["tokens_per_s"]
    if args.ref:
        r[f"envace_vs_envace@{args.ref}"] = e / results[f"envace@{args.ref}"]["tokens_per_s"]
    results["ratios"] = r
    results["targets"] = {
        "envace >= 2x llama.cpp single-stream decode": (r.get("envace_vs_llama_cpp_decode", 0) >= 2.0)
        if "envace_vs_llama_cpp_decode" in r
        else None,
        "envace >= 4x naive generate loop": (r.get("envace_vs_naive", 0) >= 4.0) if "envace_vs_naive" in r else None,
    }
    print("ratios:", {k: round(v, 2) for k, v in r.items()})
    print("targets:", results["targets"])
    write_result("rollout_throughput", results, args.out)


if __name__ == "__main__":
    main()
