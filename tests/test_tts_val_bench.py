"""bench/tts_val.py: its grid cells, its refusal of the test split, and a smoke run on the tiny model that writes
per-task results, the records of what the final Act was told, and a summary paired against N = 0."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from tts_val import parse_cell  # noqa: E402


def test_cells_name_budget_mode_and_memory():
    assert parse_cell("0") == (0, "parallel", "lessons")
    assert parse_cell("sequential-2-model") == (2, "sequential", "model")
    assert parse_cell("plan-3") == (3, "plan", "lessons")
    assert parse_cell("parallel-2-agreed-live") == (2, "parallel", "agreed-live")


BAD_CELLS = [("2", "expected 0 or"), ("parallel-0", "expected 0 or"), ("dream-2", "parallel")]


@pytest.mark.parametrize("bad, says", BAD_CELLS)
def test_a_bad_cell_says_what_is_valid(bad, says):
    with pytest.raises((ValueError, KeyError), match=says):
        parse_cell(bad)


def _run(tmp_path, *extra):
    env = dict(
        os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1"
    )
    cmd = [sys.executable, str(ROOT / "bench" / "tts_val.py"), "--model", "tiny-random", "--name", "tiny"]
    cmd += ["--suite", "bank", "--tasks", "2", "--backend", "hf", "--out", str(tmp_path), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def test_the_test_split_is_refused_without_test_once(tmp_path):
    p = _run(tmp_path, "--split", "test", "--cells", "0")
    assert p.returncode != 0 and "refusing the test split" in p.stderr
    assert not (tmp_path / "tiny").exists()


def test_smoke_run_writes_results_records_and_a_paired_summary(tmp_path):
    p = _run(tmp_path, "--cells", "0", "parallel-1-lessons", "plan-1")
    assert p.returncode == 0, p.stderr[-2000:]
    out = tmp_path / "tiny"
    summary = json.loads((out / "summary.json").read_text())
    assert [c["cell"] for c in summary["cells"]] == ["0", "parallel-1-lessons", "plan-1"]
    assert summary["cells"][0]["vs_n0"] is None and summary["cells"][1]["vs_n0"]["n_tasks"] == 2
    records = [json.loads(line) for line in (out / "parallel-1-lessons.records.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all("memory" in r for r in records)
    assert "| parallel-1-lessons |" in (out / "summary.md").read_text()
    again = _run(tmp_path, "--cells", "0", "parallel-1-lessons", "plan-1")  # every cell reused: no model loads
    assert again.returncode == 0 and again.stdout.count("reusing") == 3
    other = _run(tmp_path, "--cells", "0", "--seed", "0")  # another task draw: its N=0 is not this folder's
    assert other.returncode != 0 and "seed 1, not 0" in other.stderr and "choose another --name" in other.stderr


def test_a_cell_is_reused_only_when_made_with_the_same_settings():
    from tts_val import reuse_mismatch

    made = {"model": "m", "suite": "s", "split": "val", "tasks": 100, "seed": 0, "cell": "0", "seconds": 3.0}
    assert reuse_mismatch(made, {"model": "m", "suite": "s", "split": "val", "tasks": 100, "seed": 0}) == ""
    assert (
        reuse_mismatch(made, {"model": "m", "suite": "s", "split": "val", "tasks": 100, "seed": 1}) == "seed 0, not 1"
    )
    assert "model 'm', not 'n'" in reuse_mismatch(made, {"model": "n", "seed": 0})
