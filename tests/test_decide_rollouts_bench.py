"""bench/decide_rollouts.py: a training rollout's comparison read back as imagined value, real value and Act's
branch, so that a wrong imagined price and a wrong comparison by Act are told apart."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from decide_rollouts import row  # noqa: E402

from envace.envs import load_tasks  # noqa: E402


def _rollout(task, obs: dict, write: bool) -> dict:
    first = task.flat_gold()[0]
    call = {"name": first.name, "arguments": first.arguments}
    msgs = [
        {"role": "user", "content": task.user_turns[0]},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": json.dumps(obs)},
    ]
    if write:
        msgs.append({"role": "assistant", "content": "", "tool_calls": [{"name": "cancel_order", "arguments": {}}]})
    msgs.append({"role": "assistant", "content": "done"})
    return {"id": "i3-0:x/0", "task_id": task.id, "reward": 0.5, "iteration": 3, "messages": msgs}


def test_a_wrong_imagined_total_and_a_wrong_comparison_are_told_apart():
    tasks = load_tasks("shop-world-decide", "train", n=200)
    task = next(t for t in tasks if t.metadata["template"] == "cancel_if_over")
    cancel = not task.metadata["read_only"]  # the gold branch: the real total is over the limit
    real_total = float(task.gold_replies[0].split("$")[1].split(",")[0])
    # Rehearse right, Act takes the gold branch
    r = row(_rollout(task, {"total": f"{real_total:.2f}"}, write=cancel))
    assert r["value_right"] and r["told_right"] and r["act_follows"] and r["right"] and r["iteration"] == 3
    # Rehearse right, Act takes the other branch: Act's comparison is wrong
    r = row(_rollout(task, {"total": f"{real_total:.2f}"}, write=not cancel))
    assert r["value_right"] and r["told_right"] and not r["act_follows"] and not r["right"]
    # Rehearse imagines a total on the other side of the limit and Act follows it
    fake = 0.5 if cancel else 100000.0
    r = row(_rollout(task, {"total": f"{fake:.2f}"}, write=not cancel))
    assert not r["value_right"] and not r["told_right"] and r["act_follows"] and not r["right"]


def test_other_templates_are_not_rows():
    task = next(t for t in load_tasks("shop-world-decide", "train", n=50) if t.metadata["template"] == "buy_cheaper")
    assert row({"task_id": task.id, "messages": [], "reward": 0.0, "iteration": 0}) is None
