"""``envace rehearse --index`` and :func:`envace.envs.task_at`: task i of a suite's own stable order, built alone
where the suite is generated, an error past the end (issue 32, item 7)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envace.envs import load_tasks

SERVER = Path(__file__).parent / "fixtures" / "mcp_server.py"
INCREMENT = {"name": "increment", "parameters": {"type": "object", "properties": {"by": {"type": "integer"}}}}


def _mcp_suite(tmp_path, n: int) -> str:
    """A tasks file of ``n`` tasks ``t0``... (their tools given: loading it starts no server)."""
    tasks = [{"id": f"t{i}", "user_turns": [f"Add {i} to the counter."], "tools": [INCREMENT]} for i in range(n)]
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps({"command": f"{sys.executable} {SERVER}", "tasks": tasks}))
    return f"mcp:{path}"


def _rehearse(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "envace.cli", "rehearse", "--split", "all", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_task_at_follows_the_order_of_an_mcp_tasks_file(tmp_path):
    from envace.envs import task_at

    spec = _mcp_suite(tmp_path, 10)
    assert [task_at(spec, "all", i).id for i in (0, 1, 9)] == ["t0", "t1", "t9"]
    with pytest.raises(ValueError, match=r"task index 10 is past the end .* it has 10 tasks \(0\.\.9\)"):
        task_at(spec, "all", 10)
    with pytest.raises(ValueError, match="negative"):
        task_at(spec, "all", -1)


def test_task_at_follows_the_order_of_a_bfcl_category():
    from envace.envs import task_at

    pytest.importorskip("bfcl_eval")
    spec = "bfcl:multi_turn_base"
    order = [t.id for t in load_tasks(spec, "test")]
    assert [task_at(spec, "test", i).id for i in (0, 1, len(order) - 1)] == [order[0], order[1], order[-1]]
    with pytest.raises(ValueError, match=f"it has {len(order)} tasks"):
        task_at(spec, "test", len(order))


def test_task_at_builds_one_generated_task_however_far_its_index():
    from envace.envs import task_at
    from envace.envs.builtin import make_task

    t0 = time.perf_counter()
    task = task_at("bank", "test", 99_999)
    assert time.perf_counter() - t0 < 5.0  # one task built, not 100,000
    assert task.id == make_task("bank", "test", 99_999).id
    assert task_at("builtin", "test", 4).id == load_tasks("builtin", "test", n=5)[4].id
    with pytest.raises(ValueError, match=r"past the end of suite 'builtin': its indices are 0\.\.2999999"):
        task_at("builtin", "test", 3_000_000)


def test_rehearse_index_runs_that_task_of_an_mcp_suite(tmp_path):
    p = _rehearse("--model", "tiny-random", "--suite", _mcp_suite(tmp_path, 10), "--index", "1", "-N", "0")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "=== task t1: N=0" in p.stdout


def test_rehearse_index_past_the_end_is_a_one_line_error_before_the_model_loads(tmp_path):
    p = _rehearse("--model", "/nonexistent/model", "--suite", _mcp_suite(tmp_path, 2), "--index", "5")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("envace rehearse: error: task index 5 is past the end"), lines
    assert "it has 2 tasks (0..1)" in lines[0]
