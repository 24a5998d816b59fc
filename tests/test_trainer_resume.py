"""Resuming a training run: the KL reference and the default simulator stay the initial model (not the resumed
policy); a checkpoint of a run configured otherwise is refused, naming the fields, unless forced."""

import json
import os
import subprocess
import sys

import pytest
import numpy as np
import torch

import envace.training.trainer as trainer
from envace.backends.base import SamplingParams
from envace.config import RESUMABLE_FIELDS, config_diff, to_dict
from envace.envs import load_tasks
from envace.core.logging import read_metrics
from envace.backends.models import load
from envace.rewards.functions import REWARDS, RewardResult
from envace.rollout.engine import RolloutConfig
from envace.training.sft import gold_trajectories
from envace.backends.models import load_trainable
from envace.training.trainer import train
from envace.training.update import completion_logprobs, pack_rows
from tiny import tiny_train_config


def _first_of_group(task, traj, ctx):
    """A reward that differs within every group (a random tiny model never earns a real one), so the update moves."""
    return RewardResult(1.0 if traj.id.endswith("/0") else 0.0)


@pytest.fixture
def moving_reward(monkeypatch):
    monkeypatch.setitem(REWARDS._entries, "resume_first_of_group", _first_of_group)  # only for these tests
    return "resume_first_of_group"


def _cfg(out, reward="gold_f1", **kw):
    return tiny_train_config(out, **({"n_train_tasks": 4, "reward": reward} | kw))


def _spy_frozen(monkeypatch) -> dict:
    """Record what train() uses as the KL reference and the simulator."""
    seen: dict = {}
    real = trainer.frozen_models

    def spy(cfg, policy, dist):
        seen["ref"], seen["simulator"] = real(cfg, policy, dist)
        seen["policy"] = policy
        return seen["ref"], seen["simulator"]

    monkeypatch.setattr(trainer, "frozen_models", spy)
    return seen


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ------------------------------------------------------------------------------------------------ item 4


def test_after_a_resume_the_kl_reference_and_the_simulator_are_the_initial_model(tmp_path, moving_reward, monkeypatch):
    cfg = _cfg(tmp_path / "run", moving_reward, variant="simulator", kl_coef=0.1, lr=0.05)
    first = train(cfg)
    initial, _ = load("tiny-random")
    trained, _ = load(os.path.join(first.checkpoint, "policy"))
    assert not _same_weights(trained, initial), "the first iteration should have moved the policy (large lr)"
    seen = _spy_frozen(monkeypatch)
    second = train(_cfg(tmp_path / "run", moving_reward, variant="simulator", kl_coef=0.1, lr=0.05, iterations=2))
    assert second.step == 2 and [m["step"] for m in read_metrics(second.out_dir)] == [1, 2]
    assert (
        _same_weights(seen["policy"], trained) is False
    )  # the resumed policy went on training; it started as `trained`
    assert _same_weights(seen["ref"].model, initial) and not _same_weights(seen["ref"].model, trained)
    assert _same_weights(seen["simulator"].model, initial) and not _same_weights(seen["simulator"].model, trained)
    assert seen["ref"].model is seen["simulator"].model  # one fresh load of the initial model serves both
    assert not any(p.requires_grad for p in seen["ref"].model.parameters())


def test_after_a_lora_resume_the_kl_reference_is_the_base_model_without_the_trained_adapter(
    tmp_path, moving_reward, monkeypatch, tokenizer
):
    cfg = _cfg(tmp_path / "lora", moving_reward, lora_r=4, kl_coef=0.1, lr=0.05)
    first = train(cfg)
    seen = _spy_frozen(monkeypatch)
    train(_cfg(tmp_path / "lora", moving_reward, lora_r=4, kl_coef=0.1, lr=0.05, iterations=2))
    rows = [r for t in gold_trajectories(tokenizer, load_tasks("bank", "train", n=2)) for r in t.rows][:6]
    temps = {"act": 1.0, "rehearse": 1.0}
    initial, _ = load("tiny-random")
    resumed, _ = load_trainable(
        "tiny-random", adapter=os.path.join(first.checkpoint, "policy")
    )  # the checkpoint's policy
    with torch.no_grad():
        want = completion_logprobs(initial, pack_rows(rows), rows, temps)
        ckpt_lp = completion_logprobs(resumed, pack_rows(rows), rows, temps)
    got = seen["ref"].logprobs(pack_rows(rows), rows, temps)
    for i in want:
        torch.testing.assert_close(got[i], want[i], rtol=0, atol=1e-5)
    assert max(float((ckpt_lp[i] - want[i]).abs().max()) for i in want) > 1e-3, (
        "the trained adapter should change the log-probs"
    )
    assert seen["ref"].model is seen["policy"]  # no second copy: the policy with its adapter switched off


# ------------------------------------------------------------------------------------------------ item 8


def test_a_rerun_with_another_config_is_refused_naming_the_fields_unless_forced(tmp_path):
    out = tmp_path / "run"
    train(_cfg(out))
    with pytest.raises(
        ValueError, match=r"another config \(lr: 0\.001 -> 0\.002\).*another out_dir or delete .*resume=force"
    ):
        train(_cfg(out, lr=2e-3, iterations=2))
    with pytest.raises(ValueError, match=r"rollout\.act\.max_new_tokens: 8 -> 9"):  # nested fields by their dotted name
        train(
            _cfg(
                out,
                rollout=RolloutConfig(
                    max_steps=2,
                    act=SamplingParams(max_new_tokens=9),
                    rehearse=SamplingParams(max_new_tokens=8, stop=["</observation>"]),
                ),
            )
        )
    assert [m["step"] for m in read_metrics(str(out))] == [1]  # nothing ran
    res = train(
        _cfg(out, iterations=2, save_every=2, keep_checkpoints=3, progress=True)
    )  # resumable fields: extends the run
    assert res.step == 2 and [m["step"] for m in read_metrics(str(out))] == [1, 2]
    res = train(_cfg(out, iterations=3, lr=2e-3, resume="force"))
    assert res.step == 3 and [m["step"] for m in read_metrics(str(out))] == [1, 2, 3]
    with pytest.raises(ValueError, match="resume=never"):
        train(_cfg(out, iterations=3, resume="never"))
    with pytest.raises(ValueError, match="TrainConfig.resume"):
        _cfg(out, resume="sometimes")


def test_a_checkpoint_saved_without_a_newer_field_resumes_when_that_field_has_its_default(tmp_path):
    out = tmp_path / "run"
    first = train(_cfg(out))
    state_path = os.path.join(first.checkpoint, "state.json")
    state = json.load(open(state_path))
    del (
        state["config"]["judge"],
        state["config"]["resume"],
        state["config"]["rollout"]["progress"],
    )  # as an older version wrote it
    json.dump(state, open(state_path, "w"))
    assert train(_cfg(out, iterations=2)).step == 2


def test_config_diff_names_nested_fields_and_compares_saved_json(tmp_path):
    a = to_dict(_cfg(tmp_path))
    saved = json.loads(json.dumps(a, default=str))  # tuples became lists
    assert config_diff(saved, a) == []
    b = to_dict(_cfg(tmp_path / "elsewhere", lr=0.5, iterations=9, group_size=3))
    names = [n for n, _, _ in config_diff(saved, b, ignore=RESUMABLE_FIELDS)]
    assert "lr" in names and "group_size" in names and "iterations" not in names and "out_dir" not in names
    assert ("x", "<absent>", 1) in config_diff({}, {"x": 1})


def test_cli_train_prints_a_one_line_error_for_a_changed_config(tmp_path):
    out = tmp_path / "run"
    sets = {
        "model": "tiny-random",
        "suite": "bank",
        "iterations": 1,
        "batch_tasks": 1,
        "n_train_tasks": 4,
        "group_size": 2,
        "rollout.max_steps": 2,
        "rollout.act.max_new_tokens": 8,
        "rollout.rehearse.max_new_tokens": 8,
        "tensorboard": "false",
        "progress": "false",
        "out_dir": str(out),
        "lr": "1e-3",
    }
    args = [sys.executable, "-m", "envace.cli", "train"] + [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    env = os.environ | {"PYTHONPATH": os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")}
    subprocess.run(args, check=True, capture_output=True, timeout=300, env=env)
    p = subprocess.run(args + ["--set", "lr=3e-3"], capture_output=True, text=True, timeout=300, env=env)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert (
        lines[0].startswith("envace train: error: ") and "lr: 0.001 -> 0.003" in lines[0] and "resume=force" in lines[0]
    )


# ------------------------------------------------------------------------------------------------ issue 32, item 6


def test_the_task_stream_of_a_longer_run_begins_with_the_stream_of_a_shorter_one():
    """The task at each position of the stream depends on the pool size, the seed and the position only: the order
    for iterations 0..n is a prefix of the order for more iterations, and any window of it is that part of it."""
    for n, seed in [(1, 0), (5, 3), (64, 0), (80, 7)]:
        full = trainer.task_stream(n, seed, 0, 3 * n + 2)
        for k in (0, 1, n, 2 * n + 1):
            assert trainer.task_stream(n, seed, 0, k) == full[:k]
        assert trainer.task_stream(n, seed, n - 1, n + 2) == full[n - 1 : 2 * n + 1]
        for e in range(3):  # every epoch visits each task of the pool once
            assert sorted(full[e * n : (e + 1) * n]) == list(range(n))
    assert trainer.task_stream(64, 0, 0, 64) == np.random.default_rng(0).permutation(64).tolist()  # as before
    assert trainer.task_stream(64, 0, 64, 64) != trainer.task_stream(64, 0, 0, 64)  # a new shuffle each epoch


def _task_ids_by_iteration(out) -> dict[int, list[str]]:
    ids: dict[int, list[str]] = {}
    with open(os.path.join(out, "trajectories.jsonl"), encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            ids.setdefault(rec["iteration"], []).append(rec["task_id"])
    return ids


def test_an_extended_run_goes_on_with_new_tasks_as_a_fresh_run_of_that_length(tmp_path):
    """Raising ``iterations`` on resume continues the same task stream: a run of one iteration of 40 tasks,
    extended to two, trains on 80 different tasks, those of a fresh two-iteration run (the pool used to be sized by
    ``iterations``, max(64, iterations x batch_tasks), so the extension reshuffled it and re-trained seen tasks)."""
    rc = RolloutConfig(
        max_steps=1,
        act=SamplingParams(max_new_tokens=2),
        rehearse=SamplingParams(max_new_tokens=2, stop=["</observation>"]),
    )
    kw = dict(batch_tasks=40, n_train_tasks=None, group_size=1, rollout=rc)
    train(_cfg(tmp_path / "extended", iterations=1, **kw))
    train(_cfg(tmp_path / "extended", iterations=2, **kw))
    train(_cfg(tmp_path / "fresh", iterations=2, **kw))
    extended, fresh = _task_ids_by_iteration(tmp_path / "extended"), _task_ids_by_iteration(tmp_path / "fresh")
    assert sorted(extended) == [0, 1] and len(set(extended[0]) | set(extended[1])) == 80
    assert extended == fresh
