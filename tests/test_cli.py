"""Subprocess smoke runs of the CLI commands with tiny settings (the tiny random model)."""

import json
import re
import subprocess
import sys


def run(*args, timeout=600):
    p = subprocess.run([sys.executable, "-m", "envace.cli", *args], capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def test_tasks_prints_json_tasks():
    out = run("tasks", "--suite", "shop", "-n", "1")
    task = json.loads(out)
    assert task["env"] == "shop" and task["tools"] and task["gold_actions"]


def test_rollout_writes_readable_trajectories(tmp_path):
    path = tmp_path / "t.jsonl"
    out = run(
        "rollout",
        "--model",
        "tiny-random",
        "--suite",
        "bank",
        "-n",
        "2",
        "-k",
        "2",
        "--max-steps",
        "2",
        "--max-new-tokens",
        "8",
        "--out",
        str(path),
    )
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and "trajectories" in out
    assert all(json.loads(line)["mode"] == "rehearsal" for line in lines)


def test_sft_then_eval(tmp_path):
    out = run(
        "sft",
        "--set",
        "model=tiny-random",
        "--set",
        "suite=files",
        "--set",
        "n_tasks=4",
        "--set",
        "steps=1",
        "--set",
        "batch_tasks=2",
        "--set",
        f"out_dir={tmp_path}/sft",
        "--set",
        "tensorboard=false",
        "--set",
        "progress=false",
    )
    ckpt = out.strip().split("checkpoint: ")[-1]
    res = tmp_path / "eval.json"
    out = run("eval", "--model", ckpt, "--suite", "files", "-n", "2", "--max-new-tokens", "8", "--out", str(res))
    assert "success_rate" in out and json.loads(res.read_text())["metrics"]["format_valid_rate"] >= 0


def test_demo_quick_runs_end_to_end_and_prints_the_table(tmp_path):
    out = run("demo", "--quick", "--model", "tiny-random", "--eval-tasks", "2", "--out", str(tmp_path))
    assert "| after SFT + EnvACE |" in out and "| untrained |" in out
    saved = json.loads((tmp_path / "demo_results.json").read_text())
    assert {"untrained", "after SFT", "after SFT + EnvACE", "comparison", "times", "hardware", "seed"} <= set(saved)
    assert saved["comparison"]["n_tasks"] == 2 and saved["hardware"]["cores"] >= 1 and saved["times"]["total_s"] > 0
    assert (
        "paired 95% CI" in out
        and "Hardware:" in out
        and (tmp_path / "results.md").read_text().startswith("Held-out bank test tasks: 2")
    )
    row = next(line for line in out.splitlines() if line.startswith("| untrained |"))
    assert re.match(r"\| untrained \| \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\] \|", row)  # success with its 95% interval
    sft, envace = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("sft", "envace"))
    assert sft["task_ids"] == envace["task_ids"] and len(sft["per_task"]) == 2  # comparable with envace compare
