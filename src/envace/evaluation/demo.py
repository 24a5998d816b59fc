"""``envace demo``: SFT warm-up -> EnvACE training -> before/after evaluation, on embedded defaults.

The demo's settings (:data:`DEMO_SUITE`, :data:`DEMO_REWARD`, :data:`DEMO_CONTROLS`, :func:`demo_rollout`), the
configs of its stages (:func:`demo_sft_config`, :func:`demo_train_config`; bench/rl_settings.py and
bench/vllm_rollout.py start from them too), its evaluation and Rehearse fidelity measurement, and :func:`run_demo`,
which runs the stages in order and writes the tables. Its flags are parsed in envace.cli, which hands them to
:func:`run_demo`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ..core.atomic import write_json, write_text
from ..rewards.functions import DEFAULT_REWARD


def demo_rollout(**kw: Any) -> Any:
    """The demo's rollout settings: one call per Act step (generation stops after ``</tool_call>``), short
    completions, at most 4 Act steps per user turn."""
    from ..backends.base import SamplingParams
    from ..chat.parsing import CALL_CLOSE
    from ..rollout.engine import RolloutConfig, rehearse_sampling

    return RolloutConfig(
        max_steps=8,
        max_steps_per_turn=4,
        act=SamplingParams(temperature=1.0, max_new_tokens=96, stop=[CALL_CLOSE]),
        rehearse=rehearse_sampling(96),
        **kw,
    )


# The demo's settings. The suite is the persistent shop-world (envace.envs.builtin: one fixed catalog of products,
# prices and stock rules for every customer, each customer's orders the same in every task), the built-in world whose
# facts Rehearse was measured to learn (docs/results/world-learning: exact fidelity 0.55 after 100 Rehearse steps, vs
# 0.21 on bank-world, whose per-customer records a 135M model does not memorise). The warm-up sees the gold of every
# kind, the natural one (issue 27): the partial warm-up on the simple and read-only kinds (HEADROOM_KINDS, still
# --sft-kinds) was chosen on bank's val split with the world-consistent reward, which paid full reward to
# trajectories that fail, and has not been validated with the reward the demo now trains with: the training default,
# anchored to the real outcome (envace.rewards.functions.DEFAULT_REWARD).
DEMO_SUITE = "shop-world"
HEADROOM_KINDS = ("simple", "read_only_report")
DEMO_REWARD = DEFAULT_REWARD
DEMO_FIDELITY_TASKS = 24
"""Test tasks of the demo's fixed shadow set: one trajectory each, every rehearsed observation scored against the
real one (as bench/world_fidelity.sh does)."""
DEMO_CONTROLS = {"caller_only": "caller-only (Rehearse frozen)", "real_env": "real-env GRPO"}
"""The controls of ``envace demo --full``: the EnvACE step's budget from the same warm-up, with Rehearse not trained
(does training Rehearse matter?) and with the real environment in the loop (standard GRPO)."""


def demo_sft_config(
    model: str,
    suite: str,
    out_dir: str,
    seed: int = 0,
    steps: int = 30,
    batch: int = 4,
    quick: bool = False,
    task_kinds: tuple[str, ...] | None = None,
) -> Any:
    """An SFT warm-up of the demo's shape (also the start of bench/rl_settings.py): 256 gold trajectories of
    ``suite``'s train split (of ``task_kinds`` only, if given; e.g. :data:`HEADROOM_KINDS`), lr 1e-4 for
    the embedded default (1e-3 for other, e.g. tiny, models), bf16 where it is fast."""
    from ..config import SFTConfig
    from ..backends.models import DEFAULT_MODEL

    return SFTConfig(
        model=model,
        suite=suite,
        n_tasks=64 if quick else 256,
        task_kinds=task_kinds,
        steps=2 if quick else steps,
        batch_tasks=batch,
        lr=1e-4 if model == DEFAULT_MODEL else 1e-3,
        bf16="auto",
        micro_batch_tokens=4096,
        seed=seed,
        out_dir=out_dir,
        tensorboard=False,
    )


def demo_train_config(
    model: str,
    suite: str,
    out_dir: str,
    seed: int = 0,
    iterations: int = 4,
    batch: int = 2,
    lr: float = 1e-5,
    quick: bool = False,
    reward: Any = DEMO_REWARD,
    variant: str = "envace",
) -> Any:
    """The demo's EnvACE step from the warm-up ``model``: ``iterations`` x ``batch`` tasks x 4 rehearsed
    trajectories, ``reward`` (:data:`DEMO_REWARD`), the demo's rollout settings, bf16 rollouts and update where
    bf16 is fast (float32 elsewhere); ``variant`` runs a control (:data:`DEMO_CONTROLS`) with the same budget."""
    from ..config import TrainConfig

    return TrainConfig(
        model=model,
        suite=suite,
        variant=variant,
        reward=reward,
        bf16="auto",
        rollout_bf16="auto",
        rollout_backend="auto",  # hf on a CPU (measured faster there for an RL iteration), vLLM on a GPU
        iterations=1 if quick else iterations,
        batch_tasks=2 if quick else batch,
        lr=lr,
        group_size=4,
        rollout=demo_rollout(),
        micro_batch_tokens=4096,
        seed=seed,
        out_dir=out_dir,
        save_every=1000,
        tensorboard=False,
    )


def demo_eval(model: str, suite: str, split: str, n: int, samples: int, seed: int = 0) -> Any:
    """The demo's evaluation (as bench/rl_settings.py's on val): greedy, bf16 generation where bf16 is fast, on the
    engine ``auto`` picks (vLLM where it runs and bf16 is fast, measured 2.1x the hf engine's speed there; else hf)."""
    from .budget import evaluate_model

    return evaluate_model(model, suite, split, n, samples, seed, rollout=demo_rollout(), bf16="auto", backend="auto")


def same_config(saved: dict[str, Any] | None, cfg: Any) -> bool:
    """Whether ``saved`` (a checkpoint's config, as an earlier version may have written it: keys that moved are
    read as the config reader reads them, envace.config.saved_config_dict) is ``cfg``."""
    from ..config import config_diff, saved_config_dict, to_dict

    return isinstance(saved, dict) and not config_diff(saved_config_dict(type(cfg), saved), to_dict(cfg))


def finished_warmup(cfg: Any) -> str | None:
    """The policy of a warm-up that ``cfg`` already trained (its final checkpoint under ``cfg.out_dir``, saved with
    this very config), so that a rerun of the demo into the same folder goes on from there; else None."""
    from ..core.checkpoint import latest_checkpoint, load_state
    from ..training.sft import finished as finished_sft

    ckpt = latest_checkpoint(os.path.join(cfg.out_dir, "checkpoints"))
    if ckpt is None:
        return None
    state = load_state(ckpt)
    same = finished_sft(state) and same_config(state.get("config"), cfg)
    return os.path.join(ckpt, "policy") if same and os.path.isdir(os.path.join(ckpt, "policy")) else None


def demo_fidelity(model: str, suite: str, n: int, seed: int = 1) -> dict[str, Any]:
    """Rehearse fidelity of ``model`` on the demo's shadow set (the first ``n`` test tasks, one trajectory each, the
    demo's rollout settings): :func:`envace.evaluation.fidelity.aggregate`'s summary."""
    from ..backends.loaders import open_backend
    from ..envs import load_tasks
    from .fidelity import measure_fidelity

    policy = open_backend(model, "auto", bf16="auto")
    res = measure_fidelity(policy, load_tasks(suite, "test", n=n), demo_rollout(), group_size=1, seed=seed)
    return res.summary


FIDELITY_CELLS = (
    ("all", "overall", None),
    ("reads", "by_state", "read"),
    ("writes", "by_state", "write"),
    ("real errors", "by_outcome", "error"),
)
"""The demo's fidelity columns: (header, summary group, bucket); exact-match rate with its Wilson interval."""


def fidelity_table(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Markdown lines: one row per (model, fidelity summary), exact match (canonical JSON equal) with its 95% Wilson
    interval over rehearsed observations for each of :data:`FIDELITY_CELLS`, then leaf accuracy and how often the
    rehearsal agrees with the real call on error vs success."""
    from .fidelity import exact_cell, summary_bucket

    head = ["model", *(f"exact, {h}" for h, _, _ in FIDELITY_CELLS), "leaf accuracy", "error vs success agrees"]
    return [
        "| " + " | ".join(head) + " |",
        "|---|" + "---|" * (len(head) - 1),
        *(
            f"| {name} | "
            + " | ".join(exact_cell(summary_bucket(s, g, b)) for _, g, b in FIDELITY_CELLS)
            + f" | {s['overall']['leaf_acc']:.2f} | {s['overall']['outcome']:.2f} |"
            for name, s in rows
        ),
    ]


def run_demo(args: Any) -> int:
    """SFT warm-up (gold of every kind by default), EnvACE training (:data:`DEMO_REWARD`), before/after evaluation on
    held-out tasks of :data:`DEMO_SUITE`, as a table with intervals and the paired comparison of SFT + EnvACE against
    SFT, and Rehearse fidelity before and after on a fixed shadow set. ``--full`` then trains the controls of
    :data:`DEMO_CONTROLS` with the same budget from the same warm-up and pairs each with EnvACE.
    Writes into ``--out``: ``sft.json``, ``envace.json`` (and ``untrained.json`` with ``--untrained``, one
    ``<control>.json`` each with ``--full``): evaluation results with per-task outcomes (``envace compare sft.json
    envace.json`` recomputes the comparison); ``stages.json`` (what each evaluation was made with, and its fidelity
    summary: a rerun into the same folder reuses them, and a finished warm-up or RL run); ``demo_results.json``
    (metrics, comparisons, fidelity, stage times, hardware) and ``results.md``. ``args``: the parsed ``envace demo``
    arguments (envace.cli)."""
    from ..config import task_kinds_setting
    from .trials import compare_results, format_comparison, load_result, rate_with_ci, save_result
    from ..core.precision import hardware_summary
    from .agreement import spec_label as reward_label
    from ..training.sft import sft
    from ..training.trainer import train

    out = args.out
    quick = args.quick
    t_start = time.perf_counter()
    times: dict[str, float] = {}

    def stage(name: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        r = fn()
        times[name] = round(time.perf_counter() - t0, 1)
        return r

    kinds = None if args.sft_kinds == "all" else task_kinds_setting(args.sft_kinds, "--sft-kinds")
    warmup_tasks = ", ".join(kinds) + " tasks" if kinds else "every kind"
    controls = list(DEMO_CONTROLS) if args.full else []
    n_stages = 4 + int(args.untrained) + len(controls)
    at = iter(range(1, n_stages + 1))
    n_fid = 2 if quick else args.fidelity_tasks

    def say(what: str) -> None:
        print(f"[demo] {next(at)}/{n_stages} {what}", flush=True)

    stages_path = os.path.join(out, "stages.json")
    reused: list[str] = []  # stages an earlier run into this folder made: not timed here
    done: dict[str, Any] = {}
    if os.path.isfile(stages_path):  # a rerun into the same --out reuses every evaluation made with the same settings
        with open(stages_path, encoding="utf-8") as f:
            done = json.load(f)

    def evaluate(name: str, model: str) -> None:
        key = {"model": model, "suite": args.suite, "eval_tasks": args.eval_tasks, "fidelity_tasks": n_fid}
        path = os.path.join(out, f"{name}.json")
        if done.get(name, {}).get("key") == key and os.path.isfile(path):
            print(f"[demo] reusing {path} (evaluated before with the same settings)", flush=True)
            reused.append(f"eval_{name}")
        else:
            res = stage(f"eval_{name}_s", lambda: demo_eval(model, args.suite, "test", args.eval_tasks, 1, seed=1))
            save_result(res, path)  # per-task outcomes, for envace compare
            fid = None
            if n_fid and name != "untrained":
                fid = stage(f"fidelity_{name}_s", lambda: demo_fidelity(model, args.suite, n_fid))
            done[name] = {"key": key, "fidelity": fid}
            write_json(stages_path, done)
        results[name] = load_result(path)
        if done[name]["fidelity"] is not None:
            fidelity[name] = done[name]["fidelity"]

    print(f"[demo] model {args.model}; suite {args.suite}; seed {args.seed}; output in {out}", flush=True)
    results: dict[str, Any] = {}
    fidelity: dict[str, dict[str, Any]] = {}
    if args.untrained:
        say("evaluating the untrained model on held-out tasks")
        evaluate("untrained", args.model)
    say("SFT warm-up on gold trajectories of " + warmup_tasks)
    scfg = demo_sft_config(
        args.model, args.suite, os.path.join(out, "sft"), args.seed, args.sft_steps, args.sft_batch, quick, kinds
    )
    warm = finished_warmup(scfg)
    if warm:
        print(f"[demo] reusing the warm-up {warm} (trained before with the same settings)", flush=True)
        reused.append("sft")
    else:
        warm = stage("sft_s", lambda: sft(scfg)).checkpoint
    say("evaluating after SFT (success, then Rehearse fidelity)")
    evaluate("sft", warm)

    def rl(variant: str) -> str:
        cfg = demo_train_config(
            warm,
            args.suite,
            os.path.join(out, "train" if variant == "envace" else f"train-{variant}"),
            args.seed,
            args.rl_iterations,
            args.rl_batch,
            args.rl_lr,
            quick,
            args.reward,
            variant=variant,
        )
        tcfgs[variant] = cfg
        res = stage(f"{variant}_s", lambda: train(cfg))  # resumes a run an earlier demo started or finished
        if not res.metrics:  # no iteration ran here: a finished run, resumed
            reused.append(variant)
            times.pop(f"{variant}_s")
        return os.path.join(res.checkpoint, "policy")

    tcfgs: dict[str, Any] = {}
    say("EnvACE training (rehearsal rollouts, role-wise GRPO)")
    envace_model = rl("envace")
    say("evaluating after SFT + EnvACE")
    evaluate("envace", envace_model)
    for variant in controls:
        say(f"control: {DEMO_CONTROLS[variant]} with the same budget from the same warm-up, then its evaluation")
        evaluate(variant, rl(variant))
    labels = {
        "untrained": "untrained",
        "sft": "after SFT",
        "envace": "after SFT + EnvACE",
        **{v: f"after SFT + {DEMO_CONTROLS[v]}" for v in controls},
    }
    comparisons = {  # as `envace compare` reads them
        f"{a}_vs_{b}": compare_results(results[a], results[b], names=(labels[a][6:], labels[b][6:]))
        for a, b in [("sft", "envace"), *(("envace", v) for v in controls)]
    }
    times["total_s"] = round(time.perf_counter() - t_start, 1)
    hardware = hardware_summary()
    rows = [(labels[name], res["metrics"]) for name, res in results.items()]
    keys = ["success_rate", "call_f1", "format_valid_rate", "tool_calls_per_traj", "steps_per_traj"]
    tcfg = tcfgs["envace"]
    lines = [
        f"Held-out {args.suite} test tasks: {len(results['sft']['per_task'])}, greedy, real "
        f"environment; success with its 95% Wilson interval over tasks; seed {args.seed}",
        f"SFT: {scfg.steps} steps x {scfg.batch_tasks} gold trajectories of "
        + warmup_tasks
        + f" (lr {scfg.lr:g}); EnvACE: {tcfg.iterations} iterations "
        f"x {tcfg.batch_tasks} tasks x {tcfg.group_size}"
        + f" rehearsed trajectories, reward {reward_label(tcfg.reward)}, lr {tcfg.lr:g}"
        + (f"; controls with the same budget: {', '.join(DEMO_CONTROLS[v] for v in controls)}" if controls else ""),
        "",
        "| model | " + " | ".join(keys) + " |",
        "|---|" + "---|" * len(keys),
        *(f"| {name} | " + " | ".join(rate_with_ci(m, k) for k in keys) + " |" for name, m in rows),
    ]
    for key, c in comparisons.items():
        a, b = key.split("_vs_")
        lines += ["", f"Paired comparison on the same tasks (A = {labels[a]}, B = {labels[b]}):", ""]
        lines.append(format_comparison(c))
    if fidelity:
        lines += [
            "",
            f"Rehearse fidelity on a fixed shadow set: the first {n_fid} test tasks, one trajectory each "
            "(Act at T=1.0), every rehearsed observation against what the real environment returned for "
            "the same call; exact = canonical JSON equal, 95% Wilson interval over observations:",
            "",
            *fidelity_table([(labels[name], s) for name, s in fidelity.items()]),
        ]
    lines += [
        "",
        f"Hardware: {hardware['cpu']} ({hardware['cores']} cores, torch CPU capability "
        f"{hardware['torch_cpu_capability']}; SFT bf16: {hardware['bf16_decision']})",
        "Time: "
        + ", ".join(f"{k[:-2]} {v:.0f} s" for k, v in times.items())
        + (f" (reused from an earlier run into {out}, not timed here: {', '.join(reused)})" if reused else ""),
    ]
    print()
    print("\n".join(lines))
    print(f"\n[demo] total time {times['total_s']:.0f}s")
    write_json(
        os.path.join(out, "demo_results.json"),
        {
            **{name: m for name, m in rows},
            "comparison": comparisons["sft_vs_envace"],
            "comparisons": comparisons,
            "fidelity": {labels[name]: s for name, s in fidelity.items()},
            "times": times,
            "hardware": hardware,
            "seed": args.seed,
            "args": {k: v for k, v in vars(args).items() if k != "fn"},
        },
        default=str,
    )
    write_text(os.path.join(out, "results.md"), "\n".join(lines) + "\n")
    return 0
