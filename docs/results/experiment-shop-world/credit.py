"""Where the RL arms' training signal came from: per arm and seed, from each run's trajectories.jsonl.

    python docs/results/experiment-shop-world/credit.py runs/experiment-shop-world > credit.md

For every GRPO group (K trajectories of one task in one iteration): whether its rewards were all equal (no signal),
and for every trajectory its group advantage sign (reward minus the group mean). "Right calls" are trajectories
whose tool calls match the gold calls exactly (gold_f1 = 1); "pushed down" are those with a negative advantage: the
update lowers the probability of Act's right calls there, because the trajectory failed for another reason (in the
rehearsal arms: a wrong imagined observation, then a reply or a later call built on it).
"""

import json
import os
import sys
from collections import defaultdict

ARMS = ("real_env", "envace", "per_role", "simulator", "caller_only")


def arm_stats(path: str) -> dict:
    groups = defaultdict(list)
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            groups[(r.get("iteration"), r["group_id"])].append(r)
    n = sum(len(g) for g in groups.values())
    flat = sum(1 for g in groups.values() if len({t["reward"] for t in g}) == 1)
    right = pushed = right_failed = wrong_fact = 0
    for g in groups.values():
        mean = sum(t["reward"] for t in g) / len(g)
        for t in g:
            info = t["reward_info"]
            f1 = info.get("gold_f1*reply_facts", {}).get("gold_f1", {}).get("f1")
            if f1 != 1.0:
                continue
            right += 1
            if t["reward"] < 1.0:
                right_failed += 1
                if info.get("grounded", {}).get("details", {}).get("missing_outputs"):
                    wrong_fact += 1
            if t["reward"] < mean - 1e-9:
                pushed += 1
    return {
        "trajectories": n,
        "mean_reward": sum(t["reward"] for g in groups.values() for t in g) / max(1, n),
        "flat_groups": f"{flat}/{len(groups)}",
        "right_calls": right,
        "right_calls_failed": right_failed,
        "of_which_reply_fact_wrong": wrong_fact,
        "right_calls_pushed_down": pushed,
    }


def main(out_dir: str) -> None:
    seeds = sorted(d for d in os.listdir(out_dir) if d.startswith("seed"))
    head = [
        "arm",
        "seed",
        "trajectories",
        "mean reward",
        "groups with equal rewards",
        "right calls",
        "right calls, reward < 1",
        "… a stated fact wrong",
        "right calls pushed down",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for arm in ARMS:
        for seed in seeds:
            p = os.path.join(out_dir, seed, arm, "trajectories.jsonl")
            if not os.path.exists(p):
                continue
            s = arm_stats(p)
            print(
                f"| {arm} | {seed[4:]} | {s['trajectories']} | {s['mean_reward']:.2f} | {s['flat_groups']} | "
                f"{s['right_calls']} | {s['right_calls_failed']} | {s['of_which_reply_fact_wrong']} | "
                f"{s['right_calls_pushed_down']} |"
            )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/experiment-shop-world")
