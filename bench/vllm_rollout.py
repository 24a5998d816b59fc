"""Rollouts and RL iterations on envace's HF engine (float32, bf16) and on vLLM (in process, CPU or GPU), side by
side in one run.

The policy is a short SFT warm-up of the demo (``--warmup-steps`` steps of
``envace.evaluation.demo.demo_sft_config`` on the demo's suite; reused from ``--warm-model``), so that Act calls tools
and Rehearse has calls to answer, as in the demo's RL.
Four workloads, each run by every engine (``--engines``) one after the other, with the demo's rollout settings:

- ``rehearsal``: the rollout benchmark, ``RolloutEngine`` in rehearsal mode on B tasks x K trajectories (Act
  samples freely at T=1, Rehearse at T=0.6 / top-p 0.8). The untrained model rarely calls a tool, so this is
  mostly Act; the engines sample different tokens, so their work differs a little: compare tokens/s and
  trajectories/s, and the rows each produced.
- ``rehearse_gold_act``: the same tasks with Act scripted to the gold calls (``per_role`` mode: a scripted Act,
  the engine under test plays Rehearse), so that every call is rehearsed by the engine.
- ``act_prompts``: the same fixed prompts (the first Act prompt of every trajectory of the HF rollout) in one
  ``generate`` call, T=1, ``--max-new`` tokens at most: the same work for both engines.

- ``rl_iteration``: one iteration of the demo's EnvACE training (``envace.evaluation.demo.demo_train_config``:
  2 tasks x 4 trajectories, update in the demo's precision for every engine) with ``rollout_backend`` / ``rollout_bf16``
  set to the engine: rollout, update and weight sync as the trainer times them (``perf/*``).

vLLM's Act rows are also recomputed by the float32 model (what the trainer does before an update): the log-prob
difference shows how far its sampler is from the trainer. vLLM's start-up (engine, weights, KV cache) is timed
apart: a training run pays it once.

Usage: python bench/vllm_rollout.py [--tasks 8] [--group 8] [--engines hf_float32,hf_bf16,vllm] [--out bench/results]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import statistics
import tempfile

import common  # noqa: F401  (sets the thread-pool environment before torch loads)
from common import HFBackend, Timer, write_result


from envace.chat.parsing import render_act
from envace.backends.base import SamplingParams
from envace.backends.scripted import ScriptedBackend
from envace.backends.models import DEFAULT_MODEL, load, model_path
from envace.backends.vllm import VLLMBackend, vllm_probe
from envace.evaluation.demo import DEMO_SUITE, demo_rollout, demo_sft_config, demo_train_config
from envace.core.precision import hardware_summary
from envace.envs import load_tasks
from envace.rollout.engine import RolloutEngine
from envace.training.sft import sft
from envace.training.trainer import train
from envace.training.update import recompute_old_logprobs

ENGINES = ("hf_float32", "hf_bf16", "vllm")
""" The engines compared: (rollout_backend, rollout_bf16) of each in the RL iteration."""
ENGINE_SETTINGS = {"hf_float32": ("hf", False), "hf_bf16": ("hf", True), "vllm": ("vllm", "auto")}


def rollout(be, tasks, cfg, group: int) -> tuple[dict, list]:
    before = be.stats["generated_tokens"]
    with Timer() as t:
        trajs = RolloutEngine(be, cfg).run(tasks, group_size=group, seed=0)
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
        return render_act([gold[n]]) if n < len(gold) else "Done: all requested actions are complete."

    return respond


def rehearse_only(be, tasks, cfg, group: int) -> dict:
    """Scripted Act, ``be`` as the Rehearse role: the rollout's rows are all Rehearse generations of ``be``."""
    before = be.stats["generated_tokens"]
    scripted = ScriptedBackend(be.tokenizer, gold_act(tasks))
    with Timer() as t:
        trajs = RolloutEngine(scripted, cfg, rehearser=be, mode="per_role").run(tasks, group_size=group, seed=0)
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


def warm_model(args) -> str:
    """The policy folder of the demo's warm-up, ``--warmup-steps`` steps (or ``--warm-model`` as given)."""
    if args.warm_model:
        return args.warm_model
    out = os.path.join(args.work, "warmup")
    cfg = demo_sft_config(DEFAULT_MODEL, args.suite, out, steps=args.warmup_steps)
    return sft(dataclasses.replace(cfg, progress=False)).checkpoint


def rl_iteration(model: str, suite: str, engine: str, work: str) -> dict:
    """One iteration of the demo's EnvACE training from ``model`` with ``engine`` rolling out."""
    backend, bf16 = ENGINE_SETTINGS[engine]
    cfg = dataclasses.replace(
        demo_train_config(model, suite, os.path.join(work, f"rl-{engine}"), iterations=1),
        rollout_backend=backend,
        rollout_bf16=bf16,
        progress=False,
    )
    with Timer() as t:
        res = train(cfg)
    m = res.metrics[-1]
    keep = ("perf/rollout_s", "perf/update_s", "perf/sync_s", "perf/iteration_s", "perf/gen_tokens")
    out = {k.removeprefix("perf/"): round(m[k], 2) for k in keep if k in m}
    out |= {k: m[k] for k in ("act/rows", "rehearse/rows", "reward/mean") if k in m}
    out["train_call_s"] = round(t.s, 1)  # with the engine's start-up and the checkpoint
    out["iterations_per_minute"] = round(60 / m["perf/iteration_s"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=8, help="B: tasks")
    ap.add_argument("--group", type=int, default=8, help="K: trajectories per task")
    ap.add_argument("--suite", default=DEMO_SUITE)
    ap.add_argument("--max-new", type=int, default=128, help="most new tokens per fixed Act prompt")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"a subset of {','.join(ENGINES)}")
    ap.add_argument("--warmup-steps", type=int, default=10, help="SFT steps of the demo's warm-up before measuring")
    ap.add_argument("--warm-model", default=None, help="a warm-up policy folder to start from (no SFT)")
    ap.add_argument("--work", default=None, help="folder for the warm-up and the RL runs (default: a temporary one)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    if bad := [e for e in engines if e not in ENGINES]:
        raise SystemExit(f"unknown engine(s) {bad}; choose from {', '.join(ENGINES)}")
    probe = vllm_probe()
    if "vllm" in engines and not probe.runs:
        raise SystemExit(f"vLLM cannot run here: {probe.problem}")
    args.work = args.work or tempfile.mkdtemp(prefix="vllm-bench-")

    with Timer() as warm_t:
        policy_dir = warm_model(args)
    model, tok = load(policy_dir)
    tasks = load_tasks(args.suite, "test", n=args.tasks, seed=0)
    cfg = demo_rollout()
    act = SamplingParams(temperature=1.0, max_new_tokens=args.max_new, seed=0)

    result: dict = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "hardware": hardware_summary(),
        "model": f"{DEFAULT_MODEL} after {args.warmup_steps} SFT steps of the demo's warm-up"
        if not args.warm_model
        else args.warm_model,
        "suite": args.suite,
        "B": args.tasks,
        "K": args.group,
        "warmup_seconds": round(warm_t.s, 1),
        "engines": engines,
        "load_average_at_start": os.getloadavg(),  # other work on the machine slows every engine, unequally
    }
    prompts = None
    for name in engines:
        print(f"[{name}] rollouts", flush=True)
        if name == "vllm":
            with Timer() as start:
                be = VLLMBackend(str(model_path(policy_dir)), tok)
                be.generate([tok.encode("Hello")], act.with_(max_new_tokens=4))  # warm-up
            result["vllm"] = {
                "version": __import__("vllm").__version__,
                "platform": probe.platform,
                "dtype": str(be.llm.llm_engine.model_config.dtype),
                "startup_seconds": round(start.s, 1),
            }
        else:
            be = HFBackend(model, tok, bf16=ENGINE_SETTINGS[name][1])
            be.generate([tok.encode("Hello")], act.with_(max_new_tokens=4))  # warm-up
        roll, trajs = rollout(be, tasks, cfg, args.group)
        if prompts is None:  # the first engine's first Act prompts: the same fixed work for every engine
            prompts = [tr.rows[0].prompt_ids for tr in trajs]
        result.setdefault("rehearsal", {})[name] = roll
        result.setdefault("rehearse_gold_act", {})[name] = rehearse_only(be, tasks, cfg, args.group)
        result.setdefault(
            "act_prompts",
            {"prompts": len(prompts), "prompt_tokens_mean": round(statistics.fmean(map(len, prompts)), 1)},
        )[name] = fixed_prompts(be, prompts, act)
        if name != "hf_float32":
            result.setdefault("act_logprobs_vs_float32_recompute", {})[name] = logprob_gap(model, trajs, cfg)
        if name == "vllm":
            result["vllm_prefix_cache"] = {k: be.stats[k] for k in ("prompt_tokens", "cached_tokens")}
            del be  # the RL iteration starts its own engine
        print(f"[{name}] one RL iteration", flush=True)
        result.setdefault("rl_iteration", {})[name] = rl_iteration(policy_dir, args.suite, name, args.work)

    base = "hf_float32" if "hf_float32" in engines else engines[0]
    result["speedup_over_" + base] = {
        name: {
            "rehearsal_tokens_per_s": ratio(result["rehearsal"], name, base, "tokens_per_s"),
            "rehearsal_trajectories_per_s": ratio(result["rehearsal"], name, base, "trajectories_per_s"),
            "act_prompts_tokens_per_s": ratio(result["act_prompts"], name, base, "tokens_per_s"),
            "rehearse_gold_act_tokens_per_s": ratio(result["rehearse_gold_act"], name, base, "tokens_per_s"),
            "rl_rollout": round(
                result["rl_iteration"][base]["rollout_s"] / result["rl_iteration"][name]["rollout_s"], 2
            ),
            "rl_iterations_per_minute": ratio(result["rl_iteration"], name, base, "iterations_per_minute"),
        }
        for name in engines
        if name != base
    }
    for name, v in result["speedup_over_" + base].items():
        print(f"{name} / {base}: " + ", ".join(f"{k} {x}x" for k, x in v.items()))
    result["load_average_at_end"] = os.getloadavg()
    write_result("vllm_rollout", result, args.out)


def ratio(table: dict, a: str, b: str, key: str) -> float:
    return round(table[a][key] / table[b][key], 2)


if __name__ == "__main__":
    main()
