"""Reward agreement: does each candidate reward, computed on an imagined (rehearsed) trajectory, agree with the
real outcome of the same Act decisions? (envace.evaluation.agreement; docs/rewards.md.)

The model rolls out ``n`` tasks x ``K`` trajectories in rehearsal mode with the shadow environment on (its own
Rehearse answers every call; a private real environment executes the same calls and the environment's own success
check gives the real outcome), with the demo's rollout settings (Act temperature 1.0, as in training). Every
candidate reward is computed on each imagined trajectory and compared with the real outcome: mean, AUC, within-task
AUC (what GRPO's group advantages see), point-biserial correlation, rewarded failures (full reward, real failure),
overall and per task kind, and each reward's AUC minus ``gold_f1``'s with a bootstrap-over-tasks 95% interval.

Measure on ``train`` (or a validation split), never on ``test``: the result chooses a default.

Usage: python bench/reward_agreement.py --model runs/sft-bank [--suite bank] [--split train] [--n 32] [--k 4]
       [--reward SPEC ...] [--judge policy|MODEL|URL] [--bf16 auto] [--out-dir bench/results] [--name reward_agreement]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import common  # noqa: F401  (thread and hub settings before torch)
from common import DEFAULT_OUT, write_result
import yaml

from envace.backends.base import SamplingParams
from envace.backends.hf import HFBackend
from envace.backends.loaders import frozen_backend
from envace.evaluation.demo import demo_rollout
from envace.envs import load_tasks
from envace.backends.models import DEFAULT_MODEL, load
from envace.core.precision import bf16_setting
from envace.evaluation.agreement import DEFAULT_BASELINE, format_report, measure_reward_agreement, spec_label
from envace.rewards.functions import JUDGE_MAX_NEW_TOKENS, RewardContext, reward_names

CANDIDATES: list = [
    "gold_f1",  # the default today: calls vs gold, blind to observations and replies
    "gold_exact",
    "reply_facts",  # the facts the replies must state (expected outputs)
    "checklist",  # the task's rule checklist (built-in suites: calls, forbidden writes, reply facts, call budget)
    "outcome_checklist",  # the checklist completed with every expected output (and gold calls where none)
    "gold_f1*reply_facts",
    "gold_exact*reply_facts",
    {"gold_f1": 0.5, "reply_facts": 0.5},
]


def _judge_backend(judge: str, policy: HFBackend, bf16: bool | str) -> object:
    """The judge as ``TrainConfig.judge`` names it: the policy, a served model's URL or a local model."""
    return policy if judge == "policy" else frozen_backend(judge, bf16=bf16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="policy: an SFT checkpoint / run folder (the untrained default "
        "makes no tool calls), tiny-random for a smoke run",
    )
    ap.add_argument("--suite", default="bank")
    ap.add_argument(
        "--split", default="train", help="train or a validation split; test is refused (the result chooses a default)"
    )
    ap.add_argument("--n", type=int, default=32, help="tasks")
    ap.add_argument("--k", type=int, default=4, help="trajectories per task")
    ap.add_argument("--seed", type=int, default=0, help="task sample (0: the first n tasks) and sampling seed")
    ap.add_argument("--batch-tasks", type=int, default=8, help="tasks per rollout engine run")
    ap.add_argument(
        "--reward",
        action="append",
        default=None,
        help="a reward spec as YAML (repeatable; default: the candidates in this script)",
    )
    ap.add_argument("--baseline", default=DEFAULT_BASELINE)
    ap.add_argument(
        "--judge",
        default=None,
        help="add checklist_judge with this judge: policy, a model name / folder, or an http(s)://.../v1 URL",
    )
    ap.add_argument(
        "--judge-max-new-tokens",
        type=int,
        default=JUDGE_MAX_NEW_TOKENS,
        help="most tokens of one verdict (cut short = unparsable = unscored)",
    )
    ap.add_argument("--bf16", default="auto", help="bf16 rollouts: true, false or auto (where faster than float32)")
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--out-dir", default=str(DEFAULT_OUT))
    ap.add_argument("--name", default="reward_agreement")
    args = ap.parse_args()
    if args.split == "test":
        raise SystemExit(
            "reward_agreement: refusing the test split (this measurement "
            "chooses the default reward); use train or a validation split"
        )

    specs = [yaml.safe_load(s) for s in args.reward] if args.reward else list(CANDIDATES)
    if args.judge and "checklist_judge" not in {n for s in specs for n in reward_names(s)}:
        specs.append("checklist_judge")
    bf16 = bf16_setting(args.bf16, "--bf16")
    t0 = time.perf_counter()
    model, tok = load(args.model)
    policy = HFBackend(model, tok, bf16=bf16)
    ctx = RewardContext()
    if args.judge:
        ctx = RewardContext(
            judge=_judge_backend(args.judge, policy, bf16),
            judge_params=SamplingParams(temperature=0.0, max_new_tokens=args.judge_max_new_tokens),
        )
    tasks = load_tasks(args.suite, args.split, n=args.n, seed=args.seed)
    rollout_cfg = demo_rollout()
    t1 = time.perf_counter()
    report, records, trajs = measure_reward_agreement(
        policy,
        tasks,
        specs,
        rollout_cfg,
        ctx,
        batch_tasks=args.batch_tasks,
        baseline=args.baseline,
        resamples=args.resamples,
        seed=args.seed,
        group_size=args.k,
        rollout_seed=args.seed,
    )
    wall = time.perf_counter() - t1
    table = format_report(report)
    print(table)
    setup = {
        "model": args.model,
        "suite": args.suite,
        "split": args.split,
        "n_tasks": len(tasks),
        "K": args.k,
        "seed": args.seed,
        "bf16": bf16,
        "judge": args.judge,
        "judge_max_new_tokens": args.judge_max_new_tokens if args.judge else None,
        "rewards": [spec_label(s) for s in specs],
        "rollout": "envace.evaluation.demo.demo_rollout(), K per task, shadow",
        "load_s": round(t1 - t0, 1),
        "rollout_and_scoring_s": round(wall, 1),
        "n_calls_per_traj": sum(len(t.calls()) for t in trajs) / max(len(trajs), 1),
        "truncated": sum(t.truncated is not None for t in trajs),
    }
    path = write_result(
        args.name, {"setup": setup, "report": report, "records": [r.to_dict() for r in records]}, args.out_dir
    )
    md = Path(args.out_dir) / f"{args.name}.md"
    md.write_text(
        f"# Reward agreement ({args.suite} {args.split}, {len(tasks)} tasks x K={args.k}, model {args.model})\n\n"
        f"Real success rate of the imagined trajectories' calls and replies: {report['real_success_rate']}; "
        f"rollout + scoring {wall:.0f} s. Command and machine: {path.name}.\n\n{table}\n"
    )
    print(f"wrote {md}")
    print(json.dumps({k: setup[k] for k in ("load_s", "rollout_and_scoring_s", "n_calls_per_traj", "truncated")}))


if __name__ == "__main__":
    main()
