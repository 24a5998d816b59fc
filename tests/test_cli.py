"""Subprocess smoke runs of the CLI commands with tiny settings (the tiny random model)."""

import json
import re
import subprocess
import sys

import pytest


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
    out = run("demo", "--quick", "--untrained", "--model", "tiny-random", "--eval-tasks", "2", "--out", str(tmp_path))
    assert "| after SFT + EnvACE |" in out and "| untrained |" in out
    assert (
        "gold trajectories of simple, read_only_report tasks" in out and "0.5 grounded + 0.5 gold_f1*reply_facts" in out
    )
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


def test_the_demo_runs_the_settings_chosen_on_val_and_skips_the_untrained_model_unless_asked(monkeypatch, tmp_path):
    import types

    import envace.cli as cli
    import envace.training.sft as sft_mod
    import envace.training.trainer as trainer_mod

    class Stop(Exception):
        pass

    evaluated, warmups, trained = [], [], []
    monkeypatch.setattr(cli, "_eval", lambda model, *a, **kw: evaluated.append(model))
    monkeypatch.setattr(sft_mod, "sft", lambda cfg: warmups.append(cfg) or types.SimpleNamespace(checkpoint="WARM"))
    monkeypatch.setattr(trainer_mod, "train", lambda cfg: trained.append(cfg) or (_ for _ in ()).throw(Stop()))

    def demo(*argv):
        evaluated.clear()
        args = cli.build_parser().parse_args(["demo", "--model", "tiny-random", "--out", str(tmp_path), *argv])
        with pytest.raises(Stop):
            cli.cmd_demo(args)

    demo()
    assert evaluated == ["WARM"]  # the SFT model only, before EnvACE; no untrained evaluation by default
    assert warmups[-1].task_kinds == cli.DEMO_SFT_KINDS == ("simple", "read_only_report")
    assert warmups[-1].steps == 30 and warmups[-1].bf16 == "auto"
    cfg = trained[-1]
    assert (cfg.model, cfg.variant, cfg.reward) == ("WARM", "envace", {"grounded": 0.5, "gold_f1*reply_facts": 0.5})
    assert (cfg.bf16, cfg.rollout_bf16, cfg.iterations, cfg.batch_tasks) == ("auto", "auto", 4, 2)
    demo("--untrained", "--sft-kinds", "all", "--reward", "gold_f1")
    assert evaluated == ["tiny-random", "WARM"]
    assert warmups[-1].task_kinds is None and trained[-1].reward == "gold_f1"
    with pytest.raises(ValueError, match="valid kinds"):
        cli.cmd_demo(cli.build_parser().parse_args(["demo", "--sft-kinds", "chianed", "--out", str(tmp_path)]))
