"""Every reward against the adversarial cases of envace.rewards.adversarial on 100 test tasks of each built-in suite:
per (reward, case) the mean reward and how many trajectories earn full reward while the real environment's own
check fails. Writes bench/results/reward_audit.json and .md.   python bench/reward_audit.py [N]"""

from __future__ import annotations

import json
import os
import sys

from envace.envs.builtin import ALL_DOMAINS
from envace.rewards.adversarial import real_cases, audit
from envace.evaluation.agreement import spec_label
from envace.rewards.functions import DEFAULT_REWARD

REWARDS = [
    DEFAULT_REWARD,
    "grounded",
    "gold_f1*reply_facts",
    "outcome_checklist",
    "consistent_f1*consistent_facts",
    "gold_f1",
]


def main(n: int = 100) -> None:
    suites = sorted(ALL_DOMAINS)
    cases = {s: real_cases(s, n) for s in suites}
    rows: dict[str, dict] = {}
    for r in REWARDS:
        per = {s: audit(r, cases[s]) for s in suites}
        names = list(next(iter(per.values())))
        rows[spec_label(r)] = {
            c: {
                "mean": sum(per[s][c]["mean"] for s in suites) / len(suites),
                "full_on_failure": sum(per[s][c]["full_on_failure"] for s in suites),
                "real_failures": sum(per[s][c]["real_failures"] for s in suites),
                "examples": [e for s in suites for e in per[s][c]["examples"]][:5],
            }
            for c in names
        }
    out = os.path.join(os.path.dirname(__file__), "results")
    json.dump(
        {"n_tasks_per_suite": n, "suites": suites, "rewards": rows}, open(f"{out}/reward_audit.json", "w"), indent=1
    )
    names = list(next(iter(rows.values())))
    lines = [
        "Mean reward / trajectories with full reward while the "
        f"real check fails, {n} test tasks x {len(suites)} suites",
        "",
        "| reward | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    fails = {c: next(iter(rows.values()))[c]["real_failures"] for c in names}
    lines.append("| (real failures) | " + " | ".join(str(fails[c]) for c in names) + " |")
    for r, per in rows.items():
        lines.append(
            f"| {r} | " + " | ".join(f"{per[c]['mean']:.2f} / {per[c]['full_on_failure']}" for c in names) + " |"
        )
    open(f"{out}/reward_audit.md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
