"""TrainConfig.real_share: a share of each GRPO group rolled out in the real environment, the rest rehearsed."""

import pytest

import envace.training.trainer as trainer
from envace.chat.parsing import render_act
from envace.backends.base import SamplingParams
from envace.backends.scripted import ScriptedBackend
from envace.config import TrainConfig, config_help
from envace.core.logging import read_metrics
from envace.core.seeding import derive_seed
from envace.rollout.engine import RolloutConfig, RolloutEngine


def _cfg(tmp_path, group_size=4, **kw):
    rc = RolloutConfig(
        max_steps=2,
        act=SamplingParams(max_new_tokens=8),
        rehearse=SamplingParams(max_new_tokens=8, stop=["</observation>"]),
    )
    kw = {"variant": "envace", "batch_tasks": 2} | kw
    return TrainConfig(
        model="tiny-random",
        suite="bank",
        iterations=1,
        lr=1e-3,
        group_size=group_size,
        rollout=rc,
        out_dir=str(tmp_path),
        tensorboard=False,
        progress=False,
        save_every=1,
        **kw,
    )


def _train_capturing(cfg, monkeypatch):
    """train(cfg), and the trajectories (with their rows) that its one iteration rolled out."""
    seen = []
    batch = trainer.rollout_batch

    def capture(run, it):
        trajs = batch(run, it)
        seen.extend(trajs)
        return trajs

    monkeypatch.setattr(trainer, "rollout_batch", capture)
    return trainer.train(cfg), seen


class _GoldCalls(ScriptedBackend):
    """Act makes the gold calls of the task its prompt is about, then replies; Rehearse answers ``{"ok": true}``."""

    def __init__(self, tokenizer, tasks):
        super().__init__(tokenizer, self._respond)
        self.by_user = {t.user_turns[0]: t for t in tasks if t.user_turns}
        self.stats = {"generated_tokens": 0}

    def _respond(self, prompt):
        if "tool simulator" in prompt:
            return '<observation>{"ok": true}</observation>'
        task = next(t for u, t in self.by_user.items() if u in prompt)
        n = prompt.count("<|im_start|>tool")
        return render_act([task.flat_gold()[n]]) if n < len(task.flat_gold()) else "done"


def test_half_real_share_makes_one_group_of_two_real_and_two_rehearsed_trajectories_per_task(tmp_path, monkeypatch):
    made = trainer.setup

    def scripted_policy(cfg):  # the trained model, but a policy that calls tools (tiny-random never does)
        run = made(cfg)
        run.engines["policy"] = _GoldCalls(run.tok, run.tasks)
        return run

    monkeypatch.setattr(trainer, "setup", scripted_policy)
    cfg = _cfg(tmp_path, real_share=0.5)
    cfg.rollout.act = SamplingParams(max_new_tokens=96)
    res, trajs = _train_capturing(cfg, monkeypatch)
    groups = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t)
    assert len(groups) == 2  # one group per task of the batch
    for gid, group in groups.items():
        assert len(group) == 4 and len({t.task_id for t in group}) == 1
        assert sorted(t.mode for t in group) == ["real", "real", "rehearsal", "rehearsal"]
        assert sorted(t.id for t in group) == [f"{gid}/{k}" for k in range(4)]  # distinct ids 0..K-1
        assert {t.id.rsplit("/", 1)[1] for t in group if t.mode == "real"} == {"2", "3"}  # real ones continue at K-m
        for t in group:
            assert all(r.traj_id == t.id and r.group_id == gid for r in t.rows)
            if t.mode == "real":
                assert {r.role for r in t.rows} <= {"act"} and t.env_outcome is not None
    rehearse_from = {r.traj_id for t in trajs for r in t.rows if r.role == "rehearse"}
    assert rehearse_from and rehearse_from <= {t.id for t in trajs if t.mode == "rehearsal"}
    assert all(t.reward is not None for t in trajs)  # the same reward scored both worlds
    m = read_metrics(res.out_dir)[-1]
    assert m["rollout/real_trajectories"] == 4.0
    rehearsed = [t.reward for t in trajs if t.mode == "rehearsal"]
    assert m["reward/rehearsed_mean"] == pytest.approx(sum(rehearsed) / len(rehearsed))
    assert "reward/real_mean" in m and "reward/real_success_rate" in m and "reward/imagined_success_rate" in m


def test_real_share_outside_0_1_or_with_a_variant_that_does_not_rehearse_is_refused(tmp_path):
    for bad in (-0.1, 1.5, float("nan"), "half"):
        with pytest.raises(ValueError, match=r"real_share.*\[0, 1\]"):
            _cfg(tmp_path, real_share=bad)
    for variant in ("real_env", "simulator", "per_role"):
        with pytest.raises(ValueError, match=r"real_share.*rehearsal \(caller_frozen, caller_only, envace\)"):
            _cfg(tmp_path, real_share=0.5, variant=variant)
    with pytest.raises(ValueError, match="real_share=0.1 gives .* 0 real trajectories"):
        _cfg(tmp_path, real_share=0.1)  # round(0.1 * 4) = 0: the setting would do nothing
    for ok in (0.0, 0.25, 1.0):
        assert _cfg(tmp_path, real_share=ok, variant="caller_only").real_share == ok
    assert "real_share = 0.0" in config_help(TrainConfig)  # envace train --help lists it


def test_zero_real_share_rolls_out_exactly_the_rehearsal_batch_of_before(tmp_path, monkeypatch):
    """real_share 0 takes the one-engine path: the batch equals one rehearsal engine's, seeded by the iteration
    seed, with group prefix ``i0-`` (as rollout_batch rolled out before the setting existed)."""
    batch, now, before = trainer.rollout_batch, [], []

    def with_reference(run, it):  # both as rolled out, before scoring and the update
        trajs = batch(run, it)
        now.extend(t.to_dict() for t in trajs)
        tasks = [run.tasks[i] for i in trainer.task_stream(len(run.tasks), run.cfg.seed, it * 2, 2)]
        seed = derive_seed(run.cfg.seed, it, prime=trainer.ITERATION_PRIME)
        engine = RolloutEngine(run.engines["policy"], run.cfg.rollout)
        ref = engine.run(tasks, group_prefix=f"i{it}-", group_size=run.cfg.group_size, seed=seed)
        before.extend(t.to_dict() for t in ref)
        return trajs

    monkeypatch.setattr(trainer, "rollout_batch", with_reference)
    res = trainer.train(_cfg(tmp_path, real_share=0.0, group_size=2))
    assert len(now) == 4 and now == before
    assert {t["mode"] for t in now} == {"rehearsal"}
    assert "rollout/real_trajectories" not in read_metrics(res.out_dir)[-1]
