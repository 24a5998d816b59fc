"""bench/act_shift.py: how far an arm's model moved from its warm-up, per role, on the warm-up's own tokens."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from envace.backends.models import load
from envace.config import to_dict
from envace.core.types import Row
from envace.rollout.engine import RolloutConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import act_shift  # noqa: E402


def test_an_unchanged_arm_has_no_shift_and_a_perturbed_one_a_positive_kl_per_role(tmp_path, tokenizer):
    model, tok = load("tiny-random")
    model.save_pretrained(tmp_path / "warm")
    tok.save_pretrained(tmp_path / "warm")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "moved")
    tok.save_pretrained(tmp_path / "moved")
    rollout = RolloutConfig(max_steps=2)
    rollout.act.max_new_tokens = rollout.rehearse.max_new_tokens = 12
    policy = lambda name: {"models": {"policy": str(tmp_path / name)}}  # noqa: E731
    results = {
        "config": {"suite": "bank", "eval_split": "test", "out_dir": str(tmp_path), "rollout": to_dict(rollout)},
        "arms": ["sft", "same", "moved"],
        "runs": {"sft": {"0": policy("warm")}, "same": {"0": policy("warm")}, "moved": {"0": policy("moved")}},
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    assert act_shift.main([str(path), "--tasks", "2"]) == 0
    shift = json.loads((tmp_path / "act_shift.json").read_text())["shift"]
    same, moved = shift["same"]["0"]["act"], shift["moved"]["0"]["act"]  # the random model calls no tool: Act only
    assert same["tokens"] == moved["tokens"] > 0
    assert abs(same["kl_k3"]) < 1e-6 and abs(same["mean_dlogp"]) < 1e-6
    assert moved["kl_k3"] > 1e-4
    assert "| moved |" in (tmp_path / "act_shift.md").read_text()


def test_the_shift_of_each_role_is_the_k3_kl_of_that_role_s_tokens_alone():
    rows = [Row(r, [1], [2, 3], [0.0, 0.0], "t", f"t/{i}", "g") for i, r in enumerate(("act", "rehearse", "act"))]
    base = [np.log([0.5, 0.5]), np.log([0.2, 0.2]), np.log([0.5, 0.5])]
    arm = [np.log([0.25, 0.5]), np.log([0.2, 0.2]), np.log([0.5, 1.0])]
    out = act_shift.shift(base, arm, rows)
    d = np.log([0.5, 1.0, 1.0, 2.0])  # the act tokens' log-ratios
    assert out["act"] == {"tokens": 4, "kl_k3": pytest.approx(np.mean(np.exp(d) - 1 - d)), "mean_dlogp": 0.0}
    assert out["rehearse"] == {"tokens": 2, "kl_k3": 0.0, "mean_dlogp": 0.0}
