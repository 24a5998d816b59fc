"""Subprocess smoke runs of the CLI commands with tiny settings (the tiny random model)."""

import json
import os
import re
import subprocess
import sys

import pytest

from envace.evaluation.demo import HEADROOM_KINDS


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


def test_fidelity_and_rehearse_write_a_readable_out_file_and_no_temporary(tmp_path):
    tiny = ("--model", "tiny-random", "--suite", "shop", "--max-steps", "2", "--max-new-tokens", "8")
    fid = tmp_path / "new" / "fidelity.json"
    run("fidelity", *tiny, "-n", "1", "-k", "1", "--out", str(fid))
    saved = json.loads(fid.read_text())
    assert {"summary", "pairs"} <= set(saved) and len(saved["trajectories"]) == 1
    reh = tmp_path / "rehearse.json"
    run("rehearse", *tiny, "-N", "1", "--memory-max-tokens", "16", "--out", str(reh))
    rec = json.loads(reh.read_text())
    assert rec["task_id"] and rec["n"] == 1 and len(rec["attempts"]) == 1 and rec["final"]["task_id"] == rec["task_id"]
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))  # written through a renamed temporary


def test_demo_quick_runs_end_to_end_and_prints_the_table(tmp_path):
    from envace.evaluation.demo import DEMO_SUITE, demo_sft_config, finished_warmup

    out = run("demo", "--quick", "--untrained", "--model", "tiny-random", "--eval-tasks", "2", "--out", str(tmp_path))
    assert "| after SFT + EnvACE |" in out and "| untrained |" in out
    assert "gold trajectories of every kind" in out and "0.5 grounded + 0.5 gold_f1*reply_facts" in out
    assert "Rehearse fidelity on a fixed shadow set: the first 2 test tasks" in out
    assert "| after SFT + EnvACE | " in out.split("Rehearse fidelity")[1]  # fidelity before and after RL
    saved = json.loads((tmp_path / "demo_results.json").read_text())
    assert {"untrained", "after SFT", "after SFT + EnvACE", "comparison", "times", "hardware", "seed"} <= set(saved)
    assert saved["comparison"]["n_tasks"] == 2 and saved["hardware"]["cores"] >= 1 and saved["times"]["total_s"] > 0
    assert set(saved["fidelity"]) == {"after SFT", "after SFT + EnvACE"}
    assert saved["fidelity"]["after SFT"]["overall"]["n"] >= 0 and "by_state" in saved["fidelity"]["after SFT"]
    assert (
        "paired 95% CI" in out
        and "Hardware:" in out
        and (tmp_path / "results.md").read_text().startswith(f"Held-out {DEMO_SUITE} test tasks: 2")
    )
    row = next(line for line in out.splitlines() if line.startswith("| untrained |"))
    assert re.match(r"\| untrained \| \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\] \|", row)  # success with its 95% interval
    sft, envace = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("sft", "envace"))
    assert sft["task_ids"] == envace["task_ids"] and len(sft["per_task"]) == 2  # comparable with envace compare
    quick_warmup = demo_sft_config("tiny-random", DEMO_SUITE, str(tmp_path / "sft"), quick=True)
    assert finished_warmup(quick_warmup) == str(tmp_path / "sft" / "checkpoints" / "step-000002" / "policy")
    quick_warmup.lr *= 2  # another setting: not the same warm-up
    assert finished_warmup(quick_warmup) is None


def _demo_spies(monkeypatch, stop_training: bool):
    """The demo with its stages recorded instead of run: evaluations, fidelity runs, warm-ups and RL configs; an
    evaluation's saved result names the model it evaluated (``tag``)."""
    import types

    import envace.cli as cli
    import envace.evaluation.demo as demo_mod
    import envace.evaluation.trials as trials_mod
    import envace.training.sft as sft_mod
    import envace.training.trainer as trainer_mod

    class Stop(Exception):
        pass

    seen: dict = {"evaluated": [], "fidelity": [], "warmups": [], "trained": []}

    def train(cfg):
        seen["trained"].append(cfg)
        if stop_training:
            raise Stop()
        return types.SimpleNamespace(checkpoint=f"RL-{cfg.variant}", metrics=[{"step": 1}])

    keys = ["success_rate", "call_f1", "format_valid_rate", "tool_calls_per_traj", "steps_per_traj"]

    def evaluate(model, *a, **kw):
        seen["evaluated"].append(model)
        row = {"task_id": "t0", "successes": [True]}
        return types.SimpleNamespace(
            to_dict=lambda _: {"tag": model, "metrics": dict.fromkeys(keys, 0.0), "per_task": [row]}
        )

    summary = {"overall": {"n": 0.0, "exact": 0.0, "leaf_acc": 0.0, "outcome": 0.0}}
    monkeypatch.setattr(demo_mod, "demo_eval", evaluate)
    fidelity = lambda model, suite, n: seen["fidelity"].append((model, suite, n)) or summary  # noqa: E731
    monkeypatch.setattr(demo_mod, "demo_fidelity", fidelity)
    monkeypatch.setattr(
        sft_mod, "sft", lambda cfg: seen["warmups"].append(cfg) or types.SimpleNamespace(checkpoint="WARM")
    )
    monkeypatch.setattr(trainer_mod, "train", train)
    monkeypatch.setattr(trials_mod, "compare_results", lambda a, b, names: (a["tag"], b["tag"]))
    monkeypatch.setattr(trials_mod, "format_comparison", lambda c: "")
    return cli, Stop, seen


def test_the_demo_warms_up_on_every_kind_of_shop_world_and_skips_the_untrained_model_unless_asked(
    monkeypatch, tmp_path
):
    cli, Stop, seen = _demo_spies(monkeypatch, stop_training=True)

    def demo(*argv):
        seen["evaluated"].clear()
        args = cli.build_parser().parse_args(["demo", "--model", "tiny-random", "--out", str(tmp_path), *argv])
        with pytest.raises(Stop):
            cli.cmd_demo(args)

    demo()
    assert seen["evaluated"] == ["WARM"]  # the SFT model only, before EnvACE; no untrained evaluation by default
    assert seen["fidelity"] == [("WARM", "shop-world", 24)]  # Rehearse fidelity before RL, on the shadow set
    warm = seen["warmups"][-1]
    assert (warm.suite, warm.task_kinds, warm.steps, warm.bf16) == ("shop-world", None, 30, "auto")
    cfg = seen["trained"][-1]
    assert (cfg.model, cfg.variant, cfg.reward) == ("WARM", "envace", {"grounded": 0.5, "gold_f1*reply_facts": 0.5})
    assert (cfg.bf16, cfg.rollout_bf16, cfg.iterations, cfg.batch_tasks, cfg.suite) == (
        "auto",
        "auto",
        4,
        2,
        "shop-world",
    )
    demo("--untrained", "--sft-kinds", ",".join(HEADROOM_KINDS), "--reward", "gold_f1", "--suite", "bank")
    assert seen["evaluated"] == ["tiny-random", "WARM"]
    assert seen["warmups"][-1].task_kinds == ("simple", "read_only_report") and seen["trained"][-1].reward == "gold_f1"
    assert seen["warmups"][-1].suite == "bank" and seen["trained"][-1].suite == "bank"
    with pytest.raises(ValueError, match="valid kinds"):
        cli.cmd_demo(cli.build_parser().parse_args(["demo", "--sft-kinds", "chianed", "--out", str(tmp_path)]))


def test_the_full_demo_trains_each_control_with_envaces_budget_from_the_same_warm_up_and_pairs_it_with_envace(
    monkeypatch, tmp_path
):
    cli, _, seen = _demo_spies(monkeypatch, stop_training=False)
    args = cli.build_parser().parse_args(["demo", "--full", "--model", "tiny-random", "--out", str(tmp_path)])
    assert cli.cmd_demo(args) == 0
    envace, *controls = seen["trained"]
    assert [c.variant for c in controls] == ["caller_only", "real_env"] and envace.variant == "envace"
    for c in controls:  # one budget, one warm-up, one reward; only who answers and what is trained differ
        assert (c.model, c.iterations, c.batch_tasks, c.lr, c.reward, c.seed) == (
            envace.model,
            envace.iterations,
            envace.batch_tasks,
            envace.lr,
            envace.reward,
            envace.seed,
        )
        assert c.group_size == envace.group_size and c.out_dir != envace.out_dir
    policies = [os.path.join(f"RL-{v}", "policy") for v in ("envace", "caller_only", "real_env")]
    assert seen["evaluated"] == ["WARM", *policies]
    assert [m for m, _, _ in seen["fidelity"]] == ["WARM", *policies]  # fidelity of every trained model
    saved = json.loads((tmp_path / "demo_results.json").read_text())
    assert saved["comparisons"] == {
        "sft_vs_envace": ["WARM", policies[0]],
        "envace_vs_caller_only": policies[:2],
        "envace_vs_real_env": [policies[0], policies[2]],
    }
    assert (
        "A = after SFT + EnvACE, B = after SFT + caller-only (Rehearse frozen)" in (tmp_path / "results.md").read_text()
    )
