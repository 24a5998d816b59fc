"""Rollouts on envace's HF engine (float32) and on vLLM (in process, CPU or GPU), side by side in one run.

Three workloads, each run by both engines one after the other:

- ``rehearsal``: the rollout benchmark, ``RolloutEngine`` in rehearsal mode on B tasks x K trajectories (Act
  samples freely at T=1, Rehearse at T=0.6 / top-p 0.8). The untrained model rarely calls a tool, so this is
  mostly Act; the engines sample different tokens, so their work differs a little: compare tokens/s and
  trajectories/s, and the rows each produced.
- ``rehearse_gold_act``: the same tasks with Act scripted to the gold calls (``per_role`` mode: a scripted Act,
  the engine under test plays Rehearse), so that every call is rehearsed by the engine.
- ``act_prompts``: the same fixed prompts (the first Act prompt of every trajectory of the HF rollout) in one
  ``generate`` call, T=1, ``--max-new`` tokens at most: the same work for both engines.

vLLM's Act rows are also recomputed by the float32 model (what the trainer does before an update): the log-prob
difference shows how far its sampler is from the trainer. vLLM's start-up (engine, weights, KV cache) is timed
apart: a training run pays it once.

Usage: python bench/vllm_rollout.py [--tasks 8] [--group 8] [--out bench/results]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import statistics

import common  # noqa: F401  (sets the thread-pool environment before torch loads)
from common import HFBackend, Timer, write_result

import torch

from envace.backends.base import SamplingParams
from envace.backends.scripted import ScriptedBackend
from envace.backends.models import DEFAULT_MODEL, load, model_path
from envace.backends.vllm import VLLMBackend, vllm_probe
from envace.core.precision import hardware_summary
from envace.envs import load_tasks
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.training.update import recompute_old_logprobs


def rollout(be, tasks, cfg) -> tuple[dict, list]:
    before = be.stats["generated_tokens"]
    with Timer() as t:
        trajs = RolloutEngine(be, cfg).run(tasks)
    gen = be.stats["generated_tokens"] - before
    rows = [r for tr in trajs for r in tr.rows]
    return {
        "seconds": round(t.s, 2),
        "generated_tokens": gen,
        "tokens_per_s": round(gen / t.s, 1),
        "trajectories": len(trajs),
        "trajectories_per_s": round(len(trajs) / t.s, 3),
        "rows": {role: sum(r.role == role for r in rows) for role in ("act", "rehearse")},
    }, trajs


def gold_act(tasks):
    """Act as a script: the task's gold calls, one per step, then a reply."""
    by_user = {t.user_turns[0]: t for t in tasks}

    def respond(prompt: str) -> str:
        task = next(t for u, t in by_user.items() if u in prompt)
        n, gold = prompt.count("<|im_start|>tool"), task.flat_gold()
        return gold[n].to_text() if n < len(gold) else "Done: all requested actions are complete."

    return respond


def rehearse_only(be, tasks, cfg) -> dict:
    """Scripted Act, ``be`` as the Rehearse role: the rollout's rows are all Rehearse generations of ``be``."""
    before = be.stats["generated_tokens"]
    scripted = ScriptedBackend(be.tokenizer, gold_act(tasks))
    with Timer() as t:
        trajs = RolloutEngine(scripted, dataclasses.replace(cfg, mode="per_role"), rehearser=be).run(tasks)
    gen = be.stats["generated_tokens"] - before
    return {
        "seconds": round(t.s, 2),
        "generated_tokens": gen,
        "tokens_per_s": round(gen / t.s, 1),
        "trajectories_per_s": round(len(trajs) / t.s, 3),
        "rehearse_rows": sum(r.role == "rehearse" for tr in trajs for r in tr.rows),
    }


def fixed_prompts(be, prompts, params) -> dict:
    with Timer() as t:
        gens = be.generate(prompts, params)
    gen = sum(len(g.token_ids) for g in gens)
    return {"seconds": round(t.s, 2), "generated_tokens": gen, "tokens_per_s": round(gen / t.s, 1)}


def logprob_gap(model, trajs, cfg) -> dict:
    """|sampler log-prob - float32 recomputation| over the Act rows' tokens (Act samples without a nucleus, where
    vLLM's processed log-probs are the trainer's quantity)."""
    rows = [r for tr in trajs for r in tr.rows if r.role == "act"]
    sampled = [lp for r in rows for lp in r.old_logprobs]
    recompute_old_logprobs(model, rows, micro_batch_tokens=8192, temperatures={"act": cfg.act.temperature})
    diffs = [abs(a - b) for a, b in zip(sampled, (lp for r in rows for lp in r.old_logprobs))]
    return {"tokens": len(diffs), "mean_abs": statistics.fmean(diffs), "max_abs": max(diffs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=8, help="B: tasks")
    ap.add_argument("--group", type=int, default=8, help="K: trajectories per task")
    ap.add_argument("--suite", default="bank")
    ap.add_argument("--max-new", type=int, default=128, help="most new tokens per fixed Act prompt")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    probe = vllm_probe()
    if not probe.runs:
        raise SystemExit(f"vLLM cannot run here: {probe.problem}")
    model, tok = load(DEFAULT_MODEL)
    tasks = load_tasks(args.suite, "test", n=args.tasks, seed=0)
    cfg = RolloutConfig(mode="rehearsal", group_size=args.group, seed=0)
    act = SamplingParams(temperature=1.0, max_new_tokens=args.max_new, seed=0)

    hf = HFBackend(model, tok)
    hf.generate([tok.encode("Hello")], act.with_(max_new_tokens=4))  # warm-up
    hf_rollout, hf_trajs = rollout(hf, tasks, cfg)
    prompts = [tr.rows[0].prompt_ids for tr in hf_trajs]
    hf_fixed = fixed_prompts(hf, prompts, act)
    hf_rehearse = rehearse_only(hf, tasks, cfg)

    with Timer() as start:
        vl = VLLMBackend(str(model_path(DEFAULT_MODEL)), tok)
        vl.generate([tok.encode("Hello")], act.with_(max_new_tokens=4))  # warm-up
    vl_rollout, vl_trajs = rollout(vl, tasks, cfg)
    vl_fixed = fixed_prompts(vl, prompts, act)
    vl_rehearse = rehearse_only(vl, tasks, cfg)

    result = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "hardware": hardware_summary(),
        "model": DEFAULT_MODEL,
        "B": args.tasks,
        "K": args.group,
        "vllm": {
            "version": __import__("vllm").__version__,
            "platform": probe.platform,
            "dtype": str(vl.llm.llm_engine.model_config.dtype),
        },
        "vllm_startup_seconds": round(start.s, 1),
        "rehearsal": {"hf_float32": hf_rollout, "vllm": vl_rollout},
        "rehearse_gold_act": {"hf_float32": hf_rehearse, "vllm": vl_rehearse},
        "act_prompts": {
            "prompts": len(prompts),
            "prompt_tokens_mean": round(statistics.fmean(map(len, prompts)), 1),
            "hf_float32": hf_fixed,
            "vllm": vl_fixed,
        },
        "speedup": {
            "rehearsal_tokens_per_s": round(vl_rollout["tokens_per_s"] / hf_rollout["tokens_per_s"], 2),
            "rehearsal_trajectories_per_s": round(
                vl_rollout["trajectories_per_s"] / hf_rollout["trajectories_per_s"], 2
            ),
            "act_prompts_tokens_per_s": round(vl_fixed["tokens_per_s"] / hf_fixed["tokens_per_s"], 2),
            "rehearse_gold_act_tokens_per_s": round(vl_rehearse["tokens_per_s"] / hf_rehearse["tokens_per_s"], 2),
        },
        "vllm_act_logprobs_vs_float32_recompute": logprob_gap(model, vl_trajs, cfg),
        "vllm_prefix_cache": {k: vl.stats[k] for k in ("prompt_tokens", "cached_tokens")},
    }
    for k, v in result["speedup"].items():
        print(f"vLLM / HF float32, {k}: {v}x")
    write_result("vllm_rollout", result, args.out)


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
