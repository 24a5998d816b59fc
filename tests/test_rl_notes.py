"""TrainConfig.notes_attempts: the rollouts of a seeded share of the training tasks show Act rehearsal notes that the
initial policy distilled before training (as test-time rehearsal's final run sees them)."""

import json

import pytest

import envace.training.trainer as trainer
from envace.config import TrainConfig
from envace.core.types import Trajectory
from envace.rollout.memory import LESSONS_HEADER
from tests.tiny import tiny_train_config


def _train_capturing(cfg, monkeypatch):
    """train(cfg), and the trajectories its iterations rolled out."""
    seen = []
    batch = trainer.rollout_batch
    monkeypatch.setattr(trainer, "rollout_batch", lambda run, it, **k: seen.extend(out := batch(run, it, **k)) or out)
    return trainer.train(cfg), seen


def _noted(traj) -> bool:
    return LESSONS_HEADER in traj.messages[0].content  # Act's system prompt


def test_the_noted_tasks_are_a_seeded_share_of_the_pool():
    ids = [f"t{i}" for i in range(20)]
    half = trainer.noted_tasks(ids, 0.5, seed=0)
    assert len(half) == 10 and half <= set(ids) and half == trainer.noted_tasks(ids, 0.5, seed=0)
    assert half != trainer.noted_tasks(ids, 0.5, seed=1)
    assert trainer.noted_tasks(ids, 0.0, 0) == set() and trainer.noted_tasks(ids, 1.0, 0) == set(ids)
    assert len(trainer.noted_tasks(ids, 0.25, 0)) == 5


def test_notes_metrics_count_the_noted_trajectories_and_average_the_scored_ones_on_each_side():
    trajs = [
        Trajectory(id=str(i), task_id=task, group_id=task, mode="rehearsal", reward=r)
        for i, (task, r) in enumerate([("a", 1.0), ("a", 0.0), ("a", None), ("b", 0.5), ("c", None)])
    ]
    m = trainer._notes_metrics(trajs, {"a": "notes"})
    assert m == {"notes/trajectories": 3.0, "notes/reward_with": 0.5, "notes/reward_without": 0.5}
    assert trainer._notes_metrics(trajs[-1:], {"a": "notes"}) == {
        "notes/trajectories": 0.0,
        "notes/reward_with": 0.0,  # no scored trajectory on either side: 0, not NaN
        "notes/reward_without": 0.0,
    }


def test_rollouts_of_the_noted_tasks_carry_the_notes_in_act_s_prompt_and_the_others_none(tmp_path, monkeypatch):
    cfg = tiny_train_config(tmp_path, batch_tasks=2, n_train_tasks=2, notes_attempts=1, notes_share=0.5)
    res, trajs = _train_capturing(cfg, monkeypatch)
    notes = json.loads((tmp_path / "notes.json").read_text())
    (noted,) = notes  # round(0.5 x 2) tasks of the pool of 2
    assert notes[noted].startswith(LESSONS_HEADER)
    assert len({t.task_id for t in trajs}) == 2 and len(trajs) == 4  # both tasks of the batch, K = 2 each
    for t in trajs:
        assert _noted(t) == (t.task_id == noted), t.task_id
        if t.task_id == noted:
            assert notes[noted] in t.messages[0].content
    m = res.metrics[-1]
    assert m["notes/trajectories"] == 2.0 and {"notes/reward_with", "notes/reward_without"} <= set(m)


def test_with_real_share_the_real_rollouts_of_a_noted_task_carry_its_notes_too(tmp_path, monkeypatch):
    cfg = tiny_train_config(tmp_path, n_train_tasks=1, notes_attempts=1, notes_share=1.0, real_share=0.5)
    _, trajs = _train_capturing(cfg, monkeypatch)
    assert sorted(t.mode for t in trajs) == ["real", "rehearsal"] and all(_noted(t) for t in trajs)


def test_without_notes_attempts_no_rollout_carries_notes_and_none_are_made(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer, "rehearsal_lessons", lambda *a, **k: pytest.fail("notes made with notes_attempts 0"))
    res, trajs = _train_capturing(tiny_train_config(tmp_path, batch_tasks=2, n_train_tasks=2), monkeypatch)
    assert trajs and not any(_noted(t) for t in trajs) and not (tmp_path / "notes.json").exists()
    assert not any(k.startswith("notes/") for k in res.metrics[-1])


def test_a_resumed_run_reads_the_initial_policy_s_notes_and_never_makes_them_again(tmp_path, monkeypatch):
    kw = dict(batch_tasks=1, n_train_tasks=2, notes_attempts=1, notes_share=1.0)
    trainer.train(tiny_train_config(tmp_path, **kw))
    made = json.loads((tmp_path / "notes.json").read_text())
    assert len(made) == 2
    with monkeypatch.context() as m:
        m.setattr(trainer, "rehearsal_lessons", lambda *a, **k: pytest.fail("the notes were made again"))
        res, trajs = _train_capturing(tiny_train_config(tmp_path, iterations=2, **kw), monkeypatch)
    assert res.step == 2 and trajs and all(made[t.task_id] in t.messages[0].content for t in trajs)
    (tmp_path / "notes.json").unlink()
    with pytest.raises(ValueError, match="not notes.json"):
        trainer.train(tiny_train_config(tmp_path, iterations=3, **kw))


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"notes_attempts": -1}, "notes_attempts"),
        ({"notes_share": 1.5}, "notes_share"),
        ({"notes_format": "model"}, "notes_format"),
    ],
)
def test_bad_notes_settings_are_refused_naming_the_field(kw, field):
    with pytest.raises(ValueError, match=f"TrainConfig.{field}"):
        TrainConfig(**kw)
