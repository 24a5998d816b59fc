"""Reward agreement (envace.evaluation.agreement): the metrics by hand and against loop references, the report, a
scripted end-to-end measurement on bank tasks where Rehearse invents balances, and a smoke run of the bench script."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envace.backends.scripted import ScriptedBackend
from envace.envs import load_tasks, make_env
from envace.chat.parsing import format_observation, render_act
from envace.chat.prompts import REHEARSE_SYSTEM
from envace.evaluation.agreement import (
    Record,
    agreement,
    agreement_report,
    auc,
    bootstrap_difference,
    format_report,
    full_value,
    group_auc,
    measure_reward_agreement,
    point_biserial,
    real_success,
    shadow_rollouts,
    spec_label,
)
from envace.rollout.engine import RolloutConfig
from envace.core.types import Trajectory

ROOT = Path(__file__).resolve().parents[1]


def _auc_loop(s, y):
    pairs = [(p, n) for p, yp in zip(s, y) if yp for n, yn in zip(s, y) if not yn]
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)


def test_auc_hand_value_ties_count_half_and_one_class_is_undefined():
    # pairs (pos, neg): (0.9,0.4)=1 (0.9,0.1)=1 (0.4,0.4)=0.5 (0.4,0.1)=1 -> 3.5/4
    assert auc([0.9, 0.4, 0.4, 0.1], [True, True, False, False]) == pytest.approx(0.875)
    assert auc([1, 1, 1], [True, False, True]) == pytest.approx(0.5)  # a constant reward says nothing
    assert auc([0.0, 1.0], [True, False]) == 0.0
    assert auc([0.3, 0.5], [True, True]) is None and auc([], []) is None


def test_auc_matches_the_pairwise_loop_on_many_tied_inputs():
    values = [0.0, 0.25, 0.5, 1.0]
    for s in itertools.product(values, repeat=5):
        y = [i % 2 == 0 for i in range(5)]
        assert auc(s, y) == pytest.approx(_auc_loop(s, y))


def test_group_auc_pairs_only_trajectories_of_the_same_task():
    s = [1.0, 0.0, 0.5, 0.5, 0.9, 0.1]
    y = [True, False, True, False, False, False]
    g = ["a", "a", "b", "b", "c", "c"]
    # a: 1 win; b: one tie -> 0.5; c: no success, no pair
    assert group_auc(s, y, g) == (pytest.approx(0.75), 2)
    # across tasks there are 8 pairs: 1.0 beats all 4 failures; 0.5 beats 0.0 and 0.1, ties 0.5, loses to c's 0.9
    assert auc(s, y) == pytest.approx(6.5 / 8) == _auc_loop(s, y)
    assert group_auc([1, 0], [True, True], ["a", "a"]) == (None, 0)


def test_point_biserial_hand_value_and_constant_inputs():
    # s mean .5, y mean .25: cov .125, var s .25, var y .1875 -> 1/sqrt(3)
    assert point_biserial([1, 0, 1, 0], [True, False, False, False]) == pytest.approx(3**-0.5)
    assert point_biserial([1, 1, 1], [True, False, False]) is None
    assert point_biserial([1, 0], [True, True]) is None


def test_agreement_counts_rewarded_failures_and_leaves_unscored_out():
    s = [1.0, 1.0, 1.0, 0.0, 0.5, None]
    y = [True, False, False, True, False, True]
    m = agreement(s, y, ["a", "a", "b", "b", "c", "c"])
    assert m["n"] == 5 and m["n_unscored"] == 1
    assert m["mean"] == pytest.approx(3.5 / 5) and m["success_rate"] == pytest.approx(2 / 5)
    assert m["full_rate"] == pytest.approx(3 / 5)
    assert m["rewarded_failure_rate"] == pytest.approx(2 / 5)  # two full rewards on real failures
    assert m["fail_given_full"] == pytest.approx(2 / 3)
    assert m["zero_success_rate"] == pytest.approx(1 / 5)  # the 0 on a real success
    assert m["group_auc"] == pytest.approx(0.25) and m["n_group_pairs"] == 2  # a: 1 tie; b: 1 loss -> (0.5+0)/2
    assert m["auc"] == pytest.approx(_auc_loop([1, 1, 1, 0, 0.5], [True, False, False, True, False]))
    none = agreement([None, None], [True, False], ["a", "a"])
    assert none["n"] == 0 and none["n_unscored"] == 2 and none["auc"] is None
    # a weighted sum whose weights add up to 2 is "full" at 2
    assert (
        agreement([1.0, 2.0], [False, True], ["a", "a"], full=full_value({"gold_f1": 1, "reply_facts": 1}))["full_rate"]
        == 0.5
    )


def test_spec_labels_and_full_values():
    assert spec_label("gold_f1") == "gold_f1" and spec_label("gold_f1 * reply_facts") == "gold_f1*reply_facts"
    assert spec_label({"gold_f1": 0.5, "reply_facts": 0.5}) == "0.5 gold_f1 + 0.5 reply_facts"
    assert full_value({"gold_f1": 0.5, "reply_facts": 0.5}) == 1.0 and full_value("gold_f1*reply_facts") == 1.0


def _records(good, bad, base, n_tasks=6):
    """Two trajectories per task, one real success and one real failure, with the rewards' values."""
    out = []
    for i in range(n_tasks):
        kind = "read_only_report" if i % 2 else "simple"
        out.append(Record(f"t{i}", kind, True, {"good": good[0], "bad": bad[0], "gold_f1": base[0]}))
        out.append(Record(f"t{i}", kind, False, {"good": good[1], "bad": bad[1], "gold_f1": base[1]}))
    return out


def test_bootstrap_difference_is_zero_for_the_same_reward_and_positive_for_a_better_one():
    recs = _records(good=(1.0, 0.0), bad=(1.0, 1.0), base=(1.0, 1.0))
    same = bootstrap_difference(recs, "bad", "gold_f1", "auc", resamples=200)
    assert same["diff"] == 0.0 and same["ci95"] == [0.0, 0.0]
    better = bootstrap_difference(recs, "good", "gold_f1", "group_auc", resamples=200)
    assert better["diff"] == pytest.approx(0.5) and better["ci95"] == [pytest.approx(0.5), pytest.approx(0.5)]


def test_report_has_every_reward_overall_and_by_kind_and_leaves_out_records_without_an_outcome():
    recs = _records(good=(1.0, 0.0), bad=(1.0, 1.0), base=(1.0, 1.0)) + [
        Record("t9", "simple", None, {"good": 1.0, "bad": 1.0, "gold_f1": 1.0})
    ]
    specs = ["good", "bad", "gold_f1"]
    from envace.rewards.functions import REWARDS

    added = [name for name in ("good", "bad") if name not in REWARDS]  # the report parses specs: two throwaway
    for name in added:  # names for this test only (the registry is global; test_rewards lists the built-ins)
        REWARDS.add(name, lambda t, tr, c: None)
    try:
        rep = agreement_report(recs, specs, baseline="gold_f1", resamples=50)
        assert rep["n_no_outcome"] == 1 and rep["n_tasks"] == 6 and rep["kinds"] == {"read_only_report": 6, "simple": 6}
        assert (
            rep["rewards"]["good"]["overall"]["auc"] == 1.0
            and rep["rewards"]["bad"]["overall"]["rewarded_failure_rate"] == 0.5
        )
        assert rep["rewards"]["good"]["by_kind"]["simple"]["n"] == 6
        assert (
            "vs_baseline" not in rep["rewards"]["gold_f1"]
            and rep["rewards"]["good"]["vs_baseline"]["auc"]["diff"] == 0.5
        )
        table = format_report(rep)
        assert "| `good` | 12 |" in table and "AUC − gold_f1" in table and "| `bad` | read_only_report |" in table
        json.dumps(rep)  # JSON-able
    finally:
        for name in added:
            REWARDS.remove(name)


def test_real_success_reads_env_outcome():
    t = Trajectory(id="x", task_id="t", group_id="g", mode="rehearsal")
    assert real_success(t) is None
    t.env_outcome = {"error": "scorer crashed"}
    assert real_success(t) is None
    t.env_outcome = {"success": True, "reward": 1.0, "details": {}, "n_calls": 1}
    assert real_success(t) is True


# ------------------------------------------------------------------------------- end to end (scripted policy)


def _read_only_bank_tasks(n):
    tasks = [
        t
        for t in load_tasks("bank", "train", n=64)
        if t.metadata["kind"] == "read_only_report" and len(t.flat_gold()) == 1
    ]
    return tasks[:n]


def _policy(tasks, honest_ids):
    """Act: the gold call, then a reply that repeats the observation it was shown. Rehearse: the real observation
    for tasks in ``honest_ids``, an invented balance / transaction for the others."""
    by_user = {t.user_turns[0]: t for t in tasks}

    def respond(prompt: str) -> str:
        task = next(t for u, t in by_user.items() if u in prompt)
        if REHEARSE_SYSTEM[:40] in prompt:
            if task.id in honest_ids:
                env = make_env(task)
                return format_observation(env.call(task.flat_gold()[0]))
            return (
                '<observation>{"balance": "99999.99", "transactions": '
                '[{"amount": "-1.11", "memo": "nothing"}]}</observation>'
            )
        if prompt.count("<|im_start|>tool") == 0:
            return render_act([task.flat_gold()[0]])
        last_tool = prompt.rsplit("<|im_start|>tool", 1)[1].split("<|im_end|>", 1)[0]
        return "Here is what I found: " + last_tool.strip()

    return respond


def test_measurement_finds_gold_f1_rewards_invented_facts_and_reply_facts_does_not(tokenizer):
    tasks = _read_only_bank_tasks(4)
    honest = {tasks[0].id, tasks[1].id}
    be = ScriptedBackend(tokenizer, _policy(tasks, honest))
    cfg = RolloutConfig(max_steps=4)
    rep, recs, trajs = measure_reward_agreement(
        be, tasks, ["gold_f1", "reply_facts", "gold_f1*reply_facts", "checklist"], cfg, resamples=100, group_size=2
    )
    assert [r.real_success for r in recs] == [t.task_id in honest for t in trajs]  # invented facts fail in the world
    assert all(len(s.shadow) == len(s.calls) for t in trajs for s in t.steps)
    g, f = rep["rewards"]["gold_f1"]["overall"], rep["rewards"]["reply_facts"]["overall"]
    assert g["mean"] == 1.0 and g["auc"] == 0.5 and g["rewarded_failure_rate"] == 0.5 and g["fail_given_full"] == 0.5
    assert f["auc"] == 1.0 and f["rewarded_failure_rate"] == 0.0 and f["point_biserial"] == pytest.approx(1.0)
    assert rep["rewards"]["gold_f1*reply_facts"]["overall"]["rewarded_failure_rate"] == 0.0
    c = rep["rewards"]["checklist"]["overall"]
    assert c["auc"] == 1.0 and c["full_rate"] == 0.5  # partial credit for an invented balance, never full
    assert rep["rewards"]["reply_facts"]["vs_baseline"]["auc"]["diff"] == pytest.approx(0.5)
    assert set(rep["kinds"]) == {"read_only_report"}


def test_shadow_rollouts_always_record_the_real_outcome_and_refuse_another_mode(tokenizer):
    be = ScriptedBackend(tokenizer, lambda p: "hi")
    (t,) = shadow_rollouts(be, _read_only_bank_tasks(1), RolloutConfig(max_steps=1), group_size=1)
    assert t.mode == "rehearsal" and t.env_outcome is not None  # the shadow environment ran (engine shadow=True)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="shadow=True"):
        shadow_rollouts(be, [], RolloutConfig(mode="real", shadow=True))


# ------------------------------------------------------------------------------- the bench script


def test_bench_script_smoke_on_tiny_random(tmp_path):
    env = dict(
        os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1"
    )
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "reward_agreement.py"),
        "--model",
        "tiny-random",
        "--n",
        "2",
        "--k",
        "2",
        "--resamples",
        "20",
        "--bf16",
        "false",
        "--out-dir",
        str(tmp_path),
        "--name",
        "ra",
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads((tmp_path / "ra.json").read_text())
    assert d["setup"]["n_tasks"] == 2 and d["setup"]["K"] == 2 and len(d["records"]) == 4
    assert set(d["report"]["rewards"]) >= {"gold_f1", "reply_facts", "outcome_checklist", "gold_f1*reply_facts"}
    assert "| `gold_f1` |" in (tmp_path / "ra.md").read_text()
    refused = subprocess.run(cmd + ["--split", "test"], env=env, capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "refusing the test split" in refused.stderr
