"""The ``envace`` command line.

    envace --version                 prints `envace <version>`
    envace demo                      SFT warm-up -> EnvACE training -> before/after evaluation (embedded defaults)
    envace sft   [--config F] [--set key=value ...]
    envace train [--config F] [--set key=value ...]     e.g. --set variant=real_env --set rollout.group_size=4
    envace eval  --model M --suite S [--split test] [-n 20] [--samples K] [--tts-n N --tts-mode parallel|sequential] [--out F]
    envace compare A.json B.json [--json]   paired comparison of two saved eval results on the same tasks
    envace fidelity --model M --suite S [-n 8] [-k 2] [--mode rehearsal|per_role|simulator] [--out F]
    envace experiment [--config F] [--set key=value ...]  all arms x seeds x budgets -> report.md / report.html
    envace rollout --model M --suite S --mode rehearsal -n 2 -k 4 --out trajs.jsonl
    envace tasks --suite S [--split test] [-n 3]
    envace rehearse --model M --suite S [--index 0] [-N 2] [--mode parallel|sequential] [--memory model|concat]
    envace serve --model M [--served-model-name N] [--host 127.0.0.1] [--port 8000]   OpenAI-compatible server
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from . import __version__


MODEL_HELP = "model name, model folder, or training checkpoint / run folder (full fine-tuning or LoRA: a LoRA adapter is merged into its base)"


def _common_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config field (dotted for nested: rollout.group_size=4)")


def cmd_sft(args: argparse.Namespace) -> int:
    from .config import SFTConfig, load_config
    from .sft import sft

    cfg = load_config(SFTConfig, args.config, args.overrides)
    res = sft(cfg)
    last = res.metrics[-1] if res.metrics else {}
    print(f"SFT done: {len(res.metrics)} steps, final nll {last.get('sft/nll', float('nan')):.3f}; checkpoint: {res.checkpoint}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from .config import TrainConfig, load_config
    from .trainer import train

    cfg = load_config(TrainConfig, args.config, args.overrides)
    res = train(cfg)
    print(f"training done at step {res.step}; checkpoint: {res.checkpoint}; metrics: {os.path.join(res.out_dir, 'metrics.jsonl')}")
    return 0


def _demo_rollout(**kw: Any) -> Any:
    """The demo's rollout settings: one call per Act step (generation stops after ``</tool_call>``), short
    completions, at most 4 Act steps per user turn."""
    from .backends.base import SamplingParams
    from .rollout import RolloutConfig

    return RolloutConfig(max_steps=8, max_steps_per_turn=4, act=SamplingParams(temperature=1.0, max_new_tokens=96, stop=["</tool_call>"]), rehearse=SamplingParams(temperature=0.6, top_p=0.8, max_new_tokens=96, stop=["</observation>"]), **kw)


def _eval(model: str, suite: str, split: str, n: int, samples: int, seed: int = 0) -> Any:
    from .evaluation import evaluate_model

    return evaluate_model(model, suite, split, n, samples, seed, rollout=_demo_rollout())


def cmd_eval(args: argparse.Namespace) -> int:
    from .backends.base import SamplingParams
    from .evaluation import evaluate_model, save_result
    from .rollout import RolloutConfig

    sp = lambda t: SamplingParams(temperature=t, top_p=0.8 if t < 1 else 1.0, max_new_tokens=args.max_new_tokens)  # noqa: E731
    rc = RolloutConfig(max_steps=args.max_steps, act=sp(1.0), rehearse=sp(0.6).with_(stop=["</observation>"]))
    res = evaluate_model(args.model, args.suite, args.split, args.n, args.samples, args.seed, tts_n=args.tts_n, tts_mode=args.tts_mode, rollout=rc, temperature=args.temperature, tts_options={"memory": args.tts_memory}, bf16=args.bf16)
    print(f"{args.model} on {args.suite}/{args.split}: {len(res.per_task)} tasks x {args.samples} real trials, rehearsal budget N={args.tts_n}" + (f" ({args.tts_mode})" if args.tts_n else ""))
    print(res.table())
    if args.out:
        save_result(res, args.out, config={k: v for k, v in vars(args).items() if k != "fn"}, with_trajectories=args.trajectories)
        print(f"wrote {args.out}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Paired comparison of two saved ``envace eval --out`` results: refused unless suite, split and tasks match."""
    from .evaluation import compare_results, format_comparison, load_result

    c = compare_results(load_result(args.a), load_result(args.b), names=(args.a, args.b), resamples=args.resamples, seed=args.seed)
    print(json.dumps(c, indent=1) if args.json else format_comparison(c))
    return 0


def cmd_fidelity(args: argparse.Namespace) -> int:
    from .backends.base import SamplingParams
    from .backends.hf import HFBackend
    from .envs import load_tasks
    from .fidelity import measure_fidelity
    from .models import load, resolve_model
    from .rollout import RolloutConfig, format_trajectory

    policy = HFBackend(*load(args.model))
    extra: dict[str, Any] = {}
    if args.mode == "per_role":
        extra["rehearser"] = HFBackend(*load(resolve_model(args.rehearser or args.model, "rehearser")))
    if args.mode == "simulator":
        extra["simulator"] = HFBackend(*load(args.simulator or args.model))
    tasks = load_tasks(args.suite, args.split, n=args.n, seed=args.seed)
    rc = RolloutConfig(mode=args.mode, group_size=args.k, max_steps=args.max_steps, seed=args.seed, validate_in_code=args.validate_in_code, reference_cache=args.reference_cache, progress=True, act=SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens), rehearse=SamplingParams(temperature=0.6, top_p=0.8, max_new_tokens=args.max_new_tokens, stop=["</observation>"]))
    res = measure_fidelity(policy, tasks, rc, **extra)
    for t in res.trajectories[: args.show]:
        print(format_trajectory(t) + "\n")
    print(f"rehearsal fidelity of {args.model} ({args.mode}) on {len(tasks)} {args.suite}/{args.split} tasks x {args.k}:")
    print(res.table())
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(res.to_dict(with_trajectories=True), f, indent=1, default=str)
        print(f"wrote {args.out}")
    return 0


def cmd_experiment(args: argparse.Namespace) -> int:
    from .experiment import load_experiment_config, run_experiment

    res = run_experiment(load_experiment_config(args.config, args.overrides))
    print(f"report: {res.report['html']} (and report.md, trajectories.html, results.json in {res.out_dir})")
    return 0


def cmd_rollout(args: argparse.Namespace) -> int:
    from .backends.base import SamplingParams
    from .backends.hf import HFBackend
    from .envs import load_tasks
    from .models import load, resolve_model
    from .rollout import RolloutConfig, RolloutEngine, format_trajectory
    from .types import write_jsonl

    m, tok = load(args.model)
    tasks = load_tasks(args.suite, args.split, n=args.n, seed=args.seed)
    cfg = RolloutConfig(mode=args.mode, group_size=args.k, max_steps=args.max_steps, seed=args.seed, shadow=args.shadow, progress=True, act=SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens), rehearse=SamplingParams(temperature=0.6, top_p=0.8, max_new_tokens=args.max_new_tokens, stop=["</observation>"]))
    extra = {}
    if args.mode == "simulator":
        extra["simulator"] = HFBackend(*load(args.simulator or args.model))
    if args.mode == "per_role":
        extra["rehearser"] = HFBackend(*load(resolve_model(args.rehearser or args.model, "rehearser")))
    t0 = time.perf_counter()
    trajs = RolloutEngine(HFBackend(m, tok), cfg, **extra).run(tasks)
    dt = time.perf_counter() - t0
    if os.path.exists(args.out):
        os.remove(args.out)
    write_jsonl(args.out, trajs)
    for t in trajs[: args.show]:
        print(format_trajectory(t))
        print()
    n_tok = sum(len(r.completion_ids) for t in trajs for r in t.rows)
    print(f"{len(trajs)} trajectories, {n_tok} generated tokens in {dt:.1f}s ({n_tok / dt:.1f} tok/s); wrote {args.out}")
    return 0


def cmd_rehearse(args: argparse.Namespace) -> int:
    """Test-time scaling on one task: N private attempts + reflections -> memory -> one real execution."""
    from .backends.base import SamplingParams
    from .backends.hf import HFBackend
    from .envs import load_tasks
    from .models import load
    from .rollout import RolloutConfig
    from .tts import TTSConfig, format_record, run_tts

    m, tok = load(args.model)
    tasks = load_tasks(args.suite, args.split, n=args.index + 1, seed=args.seed)
    if args.index >= len(tasks):
        raise ValueError(f"suite {args.suite!r} split {args.split!r} has only {len(tasks)} tasks")
    gen = SamplingParams(temperature=args.temperature, top_p=1.0, max_new_tokens=args.max_new_tokens)
    rc = RolloutConfig(mode="rehearsal", group_size=1, max_steps=args.max_steps, seed=args.seed, act=gen, rehearse=SamplingParams(temperature=0.6, top_p=0.8, max_new_tokens=args.max_new_tokens, stop=["</observation>"]))
    cfg = TTSConfig(n=args.N, mode=args.mode, memory=args.memory, memory_max_tokens=args.memory_max_tokens, reflect_sampling=gen.with_(temperature=0.7), memory_sampling=SamplingParams(temperature=0.0, max_new_tokens=args.memory_max_tokens), rollout=rc, final_act=gen.with_(temperature=0.0))
    rec = run_tts(HFBackend(m, tok), [tasks[args.index]], cfg)[0]
    print(format_record(rec))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(rec.to_dict(), f, ensure_ascii=False)
        print(f"wrote {args.out}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """An OpenAI-compatible server (/v1/chat/completions, /v1/completions, /v1/models, /health) over a backend."""
    from .serve import serve

    serve(args.model, name=args.served_model_name, host=args.host, port=args.port, backend=args.backend, device=args.device, bf16=args.bf16, max_batch=args.max_batch, batch_wait_s=args.batch_wait_ms / 1000, default_max_tokens=args.default_max_tokens, max_tokens_limit=args.max_tokens_limit, verbose=args.verbose)
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    from .envs import load_tasks

    for t in load_tasks(args.suite, args.split, n=args.n, seed=args.seed):
        print(json.dumps(t.to_dict(), indent=1, ensure_ascii=False))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """SFT warm-up, EnvACE training, before/after evaluation on held-out tasks, as a table with intervals and
    the paired comparison of SFT + EnvACE against SFT. Writes into ``--out``: ``untrained.json``, ``sft.json`` and
    ``envace.json`` (evaluation results with per-task outcomes; ``envace compare sft.json envace.json`` recomputes
    the comparison), ``demo_results.json`` (metrics, comparison, stage times, hardware) and ``results.md``."""
    from .config import SFTConfig, TrainConfig
    from .evaluation import compare_results, format_comparison, load_result, rate_with_ci, save_result
    from .models import DEFAULT_MODEL
    from .precision import hardware_summary
    from .sft import sft
    from .trainer import train

    out = args.out
    quick = args.quick
    t_start = time.perf_counter()
    times: dict[str, float] = {}

    def stage(name: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        r = fn()
        times[name] = round(time.perf_counter() - t0, 1)
        return r

    print(f"[demo] model {args.model}; seed {args.seed}; output in {out}", flush=True)
    print("[demo] 1/4 evaluating the untrained model on held-out tasks", flush=True)
    before = stage("eval_untrained_s", lambda: _eval(args.model, args.suite, "test", args.eval_tasks, 1, seed=1))
    print("[demo] 2/4 SFT warm-up on gold trajectories", flush=True)
    s = stage("sft_s", lambda: sft(SFTConfig(model=args.model, suite=args.suite, n_tasks=64 if quick else 256, steps=2 if quick else args.sft_steps, batch_tasks=args.sft_batch, lr=1e-4 if args.model == DEFAULT_MODEL else 1e-3, bf16="auto", micro_batch_tokens=4096, seed=args.seed, out_dir=os.path.join(out, "sft"), tensorboard=False)))
    print("[demo] 3/4 evaluating after SFT", flush=True)
    mid = stage("eval_sft_s", lambda: _eval(s.checkpoint, args.suite, "test", args.eval_tasks, 1, seed=1))
    print("[demo] 4/4 EnvACE training (rehearsal rollouts, role-wise GRPO)", flush=True)
    tr = stage("envace_s", lambda: train(TrainConfig(model=s.checkpoint, suite=args.suite, variant="envace", reward="gold_f1*reply_facts", iterations=1 if quick else args.rl_iterations, batch_tasks=2 if quick else args.rl_batch, lr=args.rl_lr, rollout=_demo_rollout(group_size=4), micro_batch_tokens=4096, seed=args.seed, out_dir=os.path.join(out, "train"), save_every=1000, tensorboard=False)))
    after = stage("eval_envace_s", lambda: _eval(os.path.join(tr.checkpoint, "policy"), args.suite, "test", args.eval_tasks, 1, seed=1))
    results = {"untrained": before, "sft": mid, "envace": after}
    for name, res in results.items():  # per-task outcomes, for envace compare
        save_result(res, os.path.join(out, f"{name}.json"))
    comparison = compare_results(*(load_result(os.path.join(out, f"{n}.json")) for n in ("sft", "envace")), names=("SFT", "SFT + EnvACE"))  # as `envace compare` reads them
    times["total_s"] = round(time.perf_counter() - t_start, 1)
    hardware = hardware_summary()
    rows = [("untrained", before.metrics), ("after SFT", mid.metrics), ("after SFT + EnvACE", after.metrics)]
    keys = ["success_rate", "call_f1", "format_valid_rate", "tool_calls_per_traj", "steps_per_traj"]
    lines = [
        f"Held-out {args.suite} test tasks: {len(mid.per_task)}, greedy, real environment; success with its 95% Wilson interval over tasks; seed {args.seed}",
        "",
        "| model | " + " | ".join(keys) + " |",
        "|---|" + "---|" * len(keys),
        *(f"| {name} | " + " | ".join(rate_with_ci(m, k) for k in keys) + " |" for name, m in rows),
        "",
        "Paired comparison on the same tasks (A = after SFT, B = after SFT + EnvACE):",
        "",
        format_comparison(comparison),
        "",
        f"Hardware: {hardware['cpu']} ({hardware['cores']} cores, torch CPU capability {hardware['torch_cpu_capability']}; SFT bf16: {hardware['bf16_decision']})",
        "Time: " + ", ".join(f"{k[:-2]} {v:.0f} s" for k, v in times.items()),
    ]
    print()
    print("\n".join(lines))
    print(f"\n[demo] total time {times['total_s']:.0f}s")
    with open(os.path.join(out, "demo_results.json"), "w", encoding="utf-8") as f:
        json.dump({**{name: m for name, m in rows}, "comparison": comparison, "times": times, "hardware": hardware, "seed": args.seed, "args": {k: v for k, v in vars(args).items() if k != "fn"}}, f, indent=1, default=str)
    with open(os.path.join(out, "results.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return 0


def _bf16_arg(value: str) -> bool | str:
    from .precision import bf16_setting

    try:
        return bf16_setting(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).split(": ", 1)[1]) from None


# --bf16 (on), --bf16 auto|on|off; absent: float32. "on" where bf16 is slow is honoured with a warning
_BF16_ARG: dict[str, Any] = dict(nargs="?", const=True, default=False, type=_bf16_arg, metavar="auto|on|off")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="envace", description="EnvACE: world-rehearsal RL for tool-using LLM agents")
    p.add_argument("--version", action="version", version=f"envace {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("demo", help="SFT warm-up, EnvACE training and before/after evaluation on the embedded defaults")
    d.add_argument("--model", default="SmolLM2-135M-Instruct")
    d.add_argument("--suite", default="bank", help="built-in suite to train and evaluate on (bank, shop, files or builtin = all three)")
    d.add_argument("--out", default="runs/demo")
    d.add_argument("--eval-tasks", type=int, default=100, help="held-out test tasks each model is evaluated on")
    d.add_argument("--seed", type=int, default=0, help="seed of SFT and EnvACE training (the evaluation tasks stay the same)")
    d.add_argument("--sft-steps", type=int, default=30)
    d.add_argument("--sft-batch", type=int, default=4, help="gold trajectories per SFT step")
    d.add_argument("--rl-iterations", type=int, default=4)
    d.add_argument("--rl-batch", type=int, default=2, help="tasks per RL iteration (x 4 trajectories each)")
    d.add_argument("--rl-lr", type=float, default=1e-5)
    d.add_argument("--quick", action="store_true", help="a few steps of everything (smoke run)")
    d.set_defaults(fn=cmd_demo)

    s = sub.add_parser("sft", help="supervised warm-up on gold trajectories")
    _common_config_args(s)
    s.set_defaults(fn=cmd_sft)

    t = sub.add_parser("train", help="role-wise GRPO training (any variant)")
    _common_config_args(t)
    t.set_defaults(fn=cmd_train)

    e = sub.add_parser("eval", help="evaluate a model in the real environment (optionally after private test-time rehearsal)")
    e.add_argument("--model", default="SmolLM2-135M-Instruct", help=MODEL_HELP)
    e.add_argument("--suite", default="builtin")
    e.add_argument("--split", default="test")
    e.add_argument("-n", type=int, default=20, help="tasks")
    e.add_argument("--samples", "-k", type=int, default=1, help="real trials per task (pass^k for k <= samples)")
    e.add_argument("--tts-n", type=int, default=0, help="test-time rehearsal budget N (0: none)")
    e.add_argument("--tts-mode", default="parallel", help="parallel | sequential")
    e.add_argument("--tts-memory", default="model", help="model | concat")
    e.add_argument("--temperature", type=float, help="Act temperature of the real trials (default: 0 for 1 sample, else 0.7)")
    e.add_argument("--max-steps", type=int, default=8)
    e.add_argument("--max-new-tokens", type=int, default=160)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--bf16", **_BF16_ARG, help="generate in bf16 (on CPU: packed bf16 weights, ~1.6x faster on a CPU with AVX-512-BF16); --bf16 auto: only where bf16 is faster than float32 here")
    e.add_argument("--out", help="write metrics and per-task results as JSON")
    e.add_argument("--trajectories", action="store_true", help="include the trajectories in --out")
    e.set_defaults(fn=cmd_eval)

    c = sub.add_parser("compare", help="paired comparison of two saved eval results (envace eval --out) on the same tasks")
    c.add_argument("a", help="result A (the baseline)")
    c.add_argument("b", help="result B (difference is B - A)")
    c.add_argument("--resamples", type=int, default=10_000, help="paired bootstrap (and permutation) resamples")
    c.add_argument("--seed", type=int, default=0, help="seed of the resampling")
    c.add_argument("--json", action="store_true", help="print the comparison as JSON instead of a table")
    c.set_defaults(fn=cmd_compare)

    f = sub.add_parser("fidelity", help="rehearsal fidelity: rehearsed vs real observations on shadow rollouts")
    f.add_argument("--model", default="SmolLM2-135M-Instruct", help=MODEL_HELP)
    f.add_argument("--suite", default="builtin")
    f.add_argument("--split", default="test")
    f.add_argument("-n", type=int, default=8, help="tasks")
    f.add_argument("-k", type=int, default=2, help="shadow trajectories per task")
    f.add_argument("--mode", default="rehearsal", help="rehearsal | per_role (with --rehearser) | simulator (with --simulator)")
    f.add_argument("--rehearser", help="per_role: the Rehearse model (default: the checkpoint's rehearser/)")
    f.add_argument("--simulator", help="simulator: the frozen simulator model (default: --model)")
    f.add_argument("--validate-in-code", action="store_true")
    f.add_argument("--reference-cache", action="store_true")
    f.add_argument("--max-steps", type=int, default=8)
    f.add_argument("--max-new-tokens", type=int, default=160)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--show", type=int, default=0, help="print this many shadow trajectories")
    f.add_argument("--out", help="write the summary, every scored pair and the trajectories as JSON")
    f.set_defaults(fn=cmd_fidelity)

    x = sub.add_parser("experiment", help="the paper's comparison in miniature: all arms x seeds x rehearsal budgets, report folder")
    _common_config_args(x)
    x.set_defaults(fn=cmd_experiment)

    r = sub.add_parser("rollout", help="roll out one batch and write the trajectories as JSON lines")
    r.add_argument("--model", default="SmolLM2-135M-Instruct", help=MODEL_HELP)
    r.add_argument("--suite", default="builtin")
    r.add_argument("--split", default="train")
    r.add_argument("--mode", default="rehearsal")
    r.add_argument("--simulator")
    r.add_argument("--rehearser")
    r.add_argument("-n", type=int, default=2)
    r.add_argument("-k", type=int, default=4)
    r.add_argument("--max-steps", type=int, default=4)
    r.add_argument("--max-new-tokens", type=int, default=96)
    r.add_argument("--shadow", action="store_true")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--show", type=int, default=2)
    r.add_argument("--out", default="trajectories.jsonl")
    r.set_defaults(fn=cmd_rollout)

    h = sub.add_parser("rehearse", help="test-time scaling on one task: private rehearsal, memory, one real run")
    h.add_argument("--model", default="SmolLM2-135M-Instruct", help=MODEL_HELP)
    h.add_argument("--suite", default="builtin")
    h.add_argument("--split", default="test")
    h.add_argument("--index", type=int, default=0, help="which task of the suite/split")
    h.add_argument("-N", type=int, default=2, help="rehearsal budget: attempts before the real run (0 = plain acting)")
    h.add_argument("--mode", default="parallel", help="parallel | sequential")
    h.add_argument("--memory", default="model", help="model | concat")
    h.add_argument("--memory-max-tokens", type=int, default=256)
    h.add_argument("--max-steps", type=int, default=6)
    h.add_argument("--max-new-tokens", type=int, default=128)
    h.add_argument("--temperature", type=float, default=1.0, help="Act sampling temperature of the attempts (the real run is greedy)")
    h.add_argument("--seed", type=int, default=0)
    h.add_argument("--out", help="write the full record as JSON")
    h.set_defaults(fn=cmd_rehearse)

    v = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API (for simulators, judges, evaluation)")
    v.add_argument("--model", default="SmolLM2-135M-Instruct", help=MODEL_HELP)
    v.add_argument("--served-model-name", help="the name clients send as 'model' (default: --model)")
    v.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0 exposes the server to the network)")
    v.add_argument("--port", type=int, default=8000, help="0: a free port (printed)")
    v.add_argument("--backend", default="hf", help="backend that generates (envace.backends.BACKENDS)")
    v.add_argument("--device", default="cpu")
    v.add_argument("--bf16", **_BF16_ARG, help="generate in bf16; --bf16 auto: only where bf16 is faster than float32 here")
    v.add_argument("--max-batch", type=int, default=32, help="most prompts generated together")
    v.add_argument("--batch-wait-ms", type=float, default=5.0, help="how long the first request waits for others to batch with")
    v.add_argument("--default-max-tokens", type=int, default=256)
    v.add_argument("--max-tokens-limit", type=int, default=4096)
    v.add_argument("--verbose", action="store_true", help="log every request")
    v.set_defaults(fn=cmd_serve)

    k = sub.add_parser("tasks", help="print tasks of a suite")
    k.add_argument("--suite", default="builtin")
    k.add_argument("--split", default="train")
    k.add_argument("-n", type=int, default=2)
    k.add_argument("--seed", type=int, default=0)
    k.set_defaults(fn=cmd_tasks)
    return p


def main(argv: list[str] | None = None) -> int:
    from .envs.base import EnvStartupError

    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, KeyError, FileNotFoundError, ImportError, EnvStartupError) as e:
        print(f"envace {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
