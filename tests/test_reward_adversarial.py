"""Training rewards against adversarial trajectories (envace.rewards.adversarial; METHOD.md section 6). A training
reward must give less than full reward to every trajectory the real environment's own check fails, on >= 100 test
tasks of every built-in suite (fresh and persistent), score each adversarial case below the correct episode, and
lose reward when Rehearse imagines a convenient world. ``consistent_f1*consistent_facts`` and
``gold_f1*reply_facts`` fail the first check (the last test shows it), so neither is a training default."""

from __future__ import annotations

from typing import Any

import pytest

from envace.envs import load_tasks
from envace.envs.base import SUITES
from envace.envs.builtin import ALL_DOMAINS
from envace.rewards.adversarial import (
    CASES,
    IMAGINED,
    ORDER_ONLY,
    audit,
    gold_turns,
    real_cases,
    rehearsed_trajectory,
)
from envace.rewards.functions import DEFAULT_REWARD, TRAINING_REWARDS, RewardContext, make_reward

NAMED: dict[str, Any] = {"default": DEFAULT_REWARD, "grounded": "grounded"}
BUILTIN_SUITES = sorted(ALL_DOMAINS)
assert set(BUILTIN_SUITES) <= set(SUITES.names())
N_TASKS = 100
_CASES: dict[str, list] = {}


def cases(suite: str) -> list:
    if suite not in _CASES:
        _CASES[suite] = real_cases(suite, N_TASKS)
    return _CASES[suite]


def full_on_failure(reward: Any, suite: str) -> dict[str, list[str]]:
    return {k: r["examples"] for k, r in audit(reward, cases(suite)).items() if r["full_on_failure"]}


def test_the_audited_rewards_are_the_registered_training_rewards():
    assert list(NAMED.values()) == list(TRAINING_REWARDS)


@pytest.mark.parametrize("suite", BUILTIN_SUITES)
def test_gold_episodes_succeed_and_the_cases_do_fail(suite):
    rows = audit("grounded", cases(suite))
    assert rows["gold"]["n"] == N_TASKS and rows["gold"]["real_failures"] == 0
    assert sum(r["real_failures"] for r in rows.values()) >= N_TASKS


@pytest.mark.parametrize("reward", sorted(NAMED))
@pytest.mark.parametrize("suite", BUILTIN_SUITES)
def test_no_failing_real_trajectory_gets_full_training_reward(reward, suite):
    assert full_on_failure(NAMED[reward], suite) == {}


@pytest.mark.parametrize("reward", sorted(NAMED))
def test_each_adversarial_case_scores_below_the_correct_episode(reward):
    mean = {k: r["mean"] for k, r in audit(NAMED[reward], cases("bank-world")).items()}
    assert mean["gold"] == 1.0
    assert all(mean[k] < 1.0 for k in CASES if k not in ORDER_ONLY), mean


@pytest.mark.parametrize("reward", sorted(NAMED))
@pytest.mark.parametrize("case", sorted(IMAGINED))
def test_a_convenient_imagined_world_costs_reward(reward, case):
    """The coupling of METHOD.md section 2: Rehearse inventing a flattering observation must lower the reward of
    the trajectory (and so Rehearse's advantage), on every such bank-world test task."""
    kind, imagine, reply = IMAGINED[case]
    fn, ctx = make_reward(NAMED[reward]), RewardContext()
    tasks = [t for t in load_tasks("bank-world", "test", n=N_TASKS) if t.metadata["kind"] == kind]
    if "balance" in case:
        tasks = [t for t in tasks if any(c.name == "get_balance" for c in t.flat_gold())]
    assert tasks
    for task in tasks:
        traj = rehearsed_trajectory(task, [(c, reply) for c, _ in gold_turns(task)], imagine)
        value = fn(task, traj, ctx).value
        assert value is not None and value < 1.0, (task.id, case, value)


def test_the_gameable_rewards_are_not_the_default():
    from envace.config import TrainConfig

    assert "evasive reply" in full_on_failure("consistent_f1*consistent_facts", "bank")
    assert "calls reversed" in full_on_failure("gold_f1*reply_facts", "files")  # the same calls, an order that fails
    assert TrainConfig().reward == DEFAULT_REWARD


def test_training_with_a_reward_that_has_no_real_anchor_is_warned_in_one_line_and_the_training_rewards_are_not():
    from envace.rewards.functions import unanchored_note

    for spec in TRAINING_REWARDS:
        assert unanchored_note(spec) is None, spec
    for spec in ("consistent_f1*consistent_facts", "gold_f1*reply_facts", {"gold_f1": 1.0, "grounded": 0.0}):
        note = unanchored_note(spec)
        assert note is not None and "\n" not in note and "grounded" in note and "reward_audit.md" in note
    # the gameable specs do earn full reward on failing trajectories (the audit), so the note is never a false alarm
    assert full_on_failure("gold_f1*reply_facts", "files") and full_on_failure("consistent_f1*consistent_facts", "bank")
