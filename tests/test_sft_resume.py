"""A warm-up stopped mid-run resumes from its latest checkpoint and ends where one never stopped ends; a finished
one is returned as it is; a checkpoint of another config is refused (as ``envace train`` does)."""

from __future__ import annotations

import os

import pytest
import torch

import envace.training.sft as sft_mod
import envace.training.update as update_mod
from envace.backends.models import load
from envace.config import SFTConfig, _command_rollout
from envace.core.checkpoint import latest_checkpoint, load_state

BASE = dict(model="tiny-random", suite="bank", n_tasks=5, batch_tasks=2, steps=4, save_every=2, progress=False)


def _cfg(out, **kw) -> SFTConfig:
    return SFTConfig(**(BASE | {"tensorboard": False, "out_dir": str(out)} | kw))


def _stop_at(monkeypatch, step: int) -> None:
    """Make the ``step``-th optimizer step of the next run raise KeyboardInterrupt (Ctrl-C in the middle)."""
    inner, calls = update_mod.optimizer_step, []

    def step_or_stop(*a, **k):
        calls.append(1)
        if len(calls) == step:
            raise KeyboardInterrupt
        return inner(*a, **k)

    monkeypatch.setattr(update_mod, "optimizer_step", step_or_stop)


def _weights(res) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in load(res.checkpoint)[0].state_dict().items()}


@pytest.mark.parametrize("lora_r, notes", [(0, 0), (4, 1)], ids=["full", "lora-with-notes"])
def test_a_warm_up_stopped_after_a_checkpoint_resumes_to_the_weights_of_one_never_stopped(
    tmp_path, monkeypatch, lora_r, notes
):
    kw = dict(lora_r=lora_r, memory_attempts=notes, rollout=_command_rollout(max_steps=2, max_new_tokens=8)())
    whole = sft_mod.sft(_cfg(tmp_path / "whole", **kw))
    with monkeypatch.context() as m:
        _stop_at(m, 3)
        with pytest.raises(KeyboardInterrupt):
            sft_mod.sft(_cfg(tmp_path / "stopped", **kw))
    saved = load_state(latest_checkpoint(str(tmp_path / "stopped" / "checkpoints")))
    assert saved["step"] == 2 and set(saved["data"]) == {"generator", "order"} and ("notes" in saved) == bool(notes)
    with monkeypatch.context() as m:  # the notes come from the checkpoint: the resumed model is not the start
        m.setattr(sft_mod, "rehearsal_lessons", lambda *a, **k: pytest.fail("the notes were made again"))
        resumed = sft_mod.sft(_cfg(tmp_path / "stopped", **kw))
    a, b = _weights(whole), _weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in resumed.metrics] == [1, 2, 3, 4]
    assert [r["sft/nll"] for r in resumed.metrics] == pytest.approx([r["sft/nll"] for r in whole.metrics], abs=0)
    ckpts = sorted(d for d in os.listdir(tmp_path / "stopped" / "checkpoints") if d.startswith("step-"))
    assert ckpts == ["step-000004"]  # the last step's checkpoint replaced the resumable one


def test_the_resumed_run_starts_from_its_latest_checkpoint_not_from_scratch(tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        _stop_at(m, 4)
        with pytest.raises(KeyboardInterrupt):
            sft_mod.sft(_cfg(tmp_path))
    steps = []
    inner = update_mod.optimizer_step
    monkeypatch.setattr(update_mod, "optimizer_step", lambda *a, **k: steps.append(1) or inner(*a, **k))
    res = sft_mod.sft(_cfg(tmp_path))
    assert len(steps) == 2 and [r["step"] for r in res.metrics] == [1, 2, 3, 4]
    lines = open(tmp_path / "metrics.jsonl", encoding="utf-8").read().splitlines()
    assert len(lines) == 4  # step 3 of the stopped run never logged; nothing twice


def test_a_finished_warm_up_is_returned_as_it_is_and_cannot_be_extended(tmp_path, monkeypatch):
    first = sft_mod.sft(_cfg(tmp_path, steps=2, save_every=0))
    monkeypatch.setattr(update_mod, "optimizer_step", lambda *a, **k: pytest.fail("a finished warm-up trained again"))
    again = sft_mod.sft(_cfg(tmp_path, steps=2, save_every=0))
    assert again.checkpoint == first.checkpoint
    assert [(r["step"], r["sft/nll"]) for r in again.metrics] == [(r["step"], r["sft/nll"]) for r in first.metrics]
    with pytest.raises(ValueError, match=r"finished warm-up of 2 steps, not 3: .*no optimizer state"):
        sft_mod.sft(_cfg(tmp_path, steps=3, save_every=0))


def test_a_checkpoint_of_another_config_is_refused_unless_forced(tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        _stop_at(m, 3)
        with pytest.raises(KeyboardInterrupt):
            sft_mod.sft(_cfg(tmp_path))
    with pytest.raises(ValueError, match=r"another config \(lr: 0\.0001 -> 0\.0002\).*resume=force"):
        sft_mod.sft(_cfg(tmp_path, lr=2e-4))
    with pytest.raises(ValueError, match="resume=never"):
        sft_mod.sft(_cfg(tmp_path, resume="never"))
    res = sft_mod.sft(_cfg(tmp_path, steps=6, save_every=3))  # steps and save_every may change: resumed
    assert [r["step"] for r in res.metrics] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(ValueError, match="SFTConfig.resume"):
        _cfg(tmp_path, resume="sometimes")
    with pytest.raises(ValueError, match="SFTConfig.save_every"):
        _cfg(tmp_path, save_every=-1)


def test_the_demo_reuses_a_finished_warm_up_and_resumes_a_stopped_one(tmp_path, monkeypatch):
    from envace.evaluation.demo import finished_warmup

    cfg = _cfg(tmp_path)
    with monkeypatch.context() as m:
        _stop_at(m, 3)
        with pytest.raises(KeyboardInterrupt):
            sft_mod.sft(cfg)
    assert finished_warmup(cfg) is None  # a mid-run checkpoint is no warm-up to evaluate and train from
    res = sft_mod.sft(cfg)
    assert finished_warmup(cfg) == res.checkpoint == str(tmp_path / "checkpoints" / "step-000004" / "policy")
