"""bench/pool_results.py: results of disjoint task sets pooled into one that compares paired over all of them; a
task in two inputs, or another split, is refused."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from pool_results import pool  # noqa: E402

from envace.evaluation.trials import compare_results  # noqa: E402


def _result(ids, wins, split="val"):
    return {
        "suite": "shop-world-decide",
        "split": split,
        "per_task": [{"task_id": t, "successes": [w]} for t, w in zip(ids, wins)],
    }


def test_pooled_results_compare_over_every_task_of_both_draws():
    a0, a1 = _result(["t0", "t1"], [0, 1]), _result(["t2", "t3"], [0, 0])
    b0, b1 = _result(["t0", "t1"], [1, 1]), _result(["t2", "t3"], [1, 0])
    a, b = pool([a0, a1], ["a0", "a1"]), pool([b0, b1], ["b0", "b1"])
    assert [r["task_id"] for r in a["per_task"]] == ["t0", "t1", "t2", "t3"] and a["split"] == "val"
    c = compare_results(a, b)
    assert c["overall"]["n_tasks"] == 4 and c["overall"]["diff"] == pytest.approx(0.5)


def test_a_task_in_two_inputs_or_another_split_is_refused():
    with pytest.raises(ValueError, match="t1 is in both x and y"):
        pool([_result(["t0", "t1"], [0, 1]), _result(["t1"], [1])], ["x", "y"])
    with pytest.raises(ValueError, match="different splits"):
        pool([_result(["t0"], [0]), _result(["t1"], [1], split="test")], ["x", "y"])
