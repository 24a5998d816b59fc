"""bench/rescore_looked.py: a stored success on a task with nothing to do whose trial never made the gold's read is
what the current check fails; the script finds exactly those rows, fails them, and recomputes the rates."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from rescore_looked import main, needs_a_look  # noqa: E402

from envace.envs import load_tasks  # noqa: E402


def _row(task_id: str, success: bool, tool_recall: float, samples: int = 1) -> dict:
    return {"task_id": task_id, "domain": "shop", "kind": "simple", "successes": [success] * samples,
            "tool_recall": tool_recall}  # fmt: skip


def _tasks():
    tasks = load_tasks("shop-world-decide", "val", n=40, seed=0)
    nothing = [t for t in tasks if needs_a_look(t.id)]
    pending = [t for t in tasks if t.metadata["template"] == "cancel_pending" and not needs_a_look(t.id)]
    assert len(nothing) >= 2 and pending
    assert all(t.metadata["template"] == "cancel_pending" and not t.expected_outputs for t in nothing)
    return nothing, pending


def _experiment(rows: list[dict]) -> dict:
    ev = {"n": 0, "mode": "none", "metrics": {"success_rate": -1.0, "tool_f1": 0.5}, "per_task": rows}
    return {"config": {"suite": "shop-world-decide", "eval_split": "val"}, "runs": {"base": {"1": {"evals": [ev]}}}}


def test_only_successes_without_the_read_on_tasks_with_nothing_to_do_are_failed(tmp_path, capsys):
    nothing, pending = _tasks()
    rows = [
        _row(nothing[0].id, True, 0.0),  # guessed: fails now
        _row(nothing[1].id, True, 1.0),  # looked: stays
        _row(pending[0].id, True, 0.5),  # something to do: the end state is the evidence, stays
        _row(pending[0].id.replace("val", "test"), False, 0.0),
    ]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_experiment(rows), indent=1))
    assert main([str(path)]) == 0
    assert "| base seed 1 val N=0 none |" in capsys.readouterr().out
    assert json.loads(path.read_text())["runs"]["base"]["1"]["evals"][0]["per_task"][0]["successes"] == [True]

    assert main([str(path), "--write"]) == 0
    ev = json.loads(path.read_text())["runs"]["base"]["1"]["evals"][0]
    assert [p["successes"] for p in ev["per_task"]] == [[False], [True], [True], [False]]
    assert ev["metrics"]["success_rate"] == 0.5 and ev["metrics"]["tool_f1"] == 0.5  # other metrics kept
    assert ev["metrics"]["success_rate/ci_lo"] < 0.5 < ev["metrics"]["success_rate/ci_hi"]
    assert "rescored" in ev
    capsys.readouterr()
    assert main([str(path)]) == 0  # a second pass finds nothing left to change
    assert capsys.readouterr().out.count("\n") == 2


def test_a_row_of_several_trials_is_refused_rather_than_guessed(tmp_path):
    nothing, _ = _tasks()
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"split": "val", "per_task": [_row(nothing[0].id, True, 0.5, samples=2)]}))
    with pytest.raises(ValueError, match="2 trials"):
        main([str(path), "--write"])
