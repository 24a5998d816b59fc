"""Trainer: masks by role, one step changes the parameters, every variant runs, kill and resume continues."""

import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from envace.chat.parsing import render_act
from envace.backends.scripted import ScriptedBackend
from envace.config import VARIANTS, TrainConfig, load_config
from envace.envs import load_tasks
from envace.core.logging import read_metrics
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.training.sft import gold_trajectories
from envace.training.trainer import rows_with_advantages, train, update_parts
from envace.training.update import completion_logprobs, optimizer_step, pack_rows, pad_rows
from envace.math import algos
from tiny import tiny_train_config
from numerics import assert_logprobs_close


def _scored_group(tokenizer, mode):
    tasks = load_tasks("bank", "train", n=2)
    trajs = gold_trajectories(tokenizer, tasks)
    if mode == "real":
        for t in trajs:
            t.rows = [r for r in t.rows if r.role == "act"]
    for i, t in enumerate(trajs):
        t.group_id = "g"
        t.reward = float(i % 2)
    return trajs


def test_loss_rows_hold_both_roles_in_rehearsal_and_only_act_in_real_mode(tokenizer):
    trajs = _scored_group(tokenizer, "rehearsal")
    rows, adv, _ = rows_with_advantages(trajs, "rolewise", VARIANTS.get("envace").train_roles)
    assert {r.role for r in rows} == {"act", "rehearse"} and len(adv) == len(rows)
    rows, _, _ = rows_with_advantages(trajs, "rolewise", VARIANTS.get("real_env").train_roles)
    assert {r.role for r in rows} == {"act"}
    rows, _, _ = rows_with_advantages(trajs, "rolewise", VARIANTS.get("caller_frozen").train_roles)
    assert {r.role for r in rows} == {"rehearse"}


def test_unscored_trajectories_are_left_out_of_the_update(tokenizer):
    trajs = _scored_group(tokenizer, "rehearsal")
    trajs[0].reward = None
    rows, _, _ = rows_with_advantages(trajs, "rolewise", ("act", "rehearse"))
    assert trajs[0].id not in {r.traj_id for r in rows}


def test_packed_logprobs_equal_row_by_row_logprobs(tiny):
    model, tok = tiny
    rows = [r for t in gold_trajectories(tok, load_tasks("bank", "train", n=2)) for r in t.rows]
    packs = pack_rows(rows)
    assert len(packs) < len(rows)  # chains of one context share one sequence
    packed = completion_logprobs(model, packs, rows, {"act": 1.0, "rehearse": 0.6})
    for i, r in enumerate(rows):
        with torch.no_grad():
            logits = model(torch.tensor([r.prompt_ids + r.completion_ids])).logits[0].float()
        t = 1.0 if r.role == "act" else 0.6
        lp = (
            torch.log_softmax(logits[len(r.prompt_ids) - 1 : -1] / t, -1)
            .gather(-1, torch.tensor(r.completion_ids)[:, None])
            .squeeze(-1)
        )
        assert_logprobs_close(packed[i], lp, what=f"{r.role} row {i}")


def test_one_update_step_changes_the_trainable_parameters(tiny):
    import copy

    model, tok = tiny
    model = copy.deepcopy(model)
    trajs = gold_trajectories(tok, load_tasks("bank", "train", n=2))
    for i, t in enumerate(trajs):
        t.group_id, t.reward = "g", float(i)
    rows, adv, _ = rows_with_advantages(trajs, "rolewise", ("act", "rehearse"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_fn(logp, mask, idxs, normalizer):
        old, _ = pad_rows([logp[j].detach()[: mask[j].sum()] for j in range(len(idxs))])
        return algos.policy_loss(logp, old, adv[idxs], mask, normalizer=normalizer)

    m = optimizer_step(
        model, opt, rows, loss_fn, agg="token_mean", micro_batch_tokens=256, temperatures={}, max_grad_norm=1.0
    )
    assert m["micro_batches"] > 1  # gradient accumulation over several micro-batches
    changed = [n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed and m["grad_norm"] > 0


def _row(traj_id, prompt, completion):
    from envace.core.types import Row

    return Row("act", list(prompt), list(completion), [0.0] * len(completion), "t", traj_id, "g")


def _sft_step(model, rows, micro_batch_tokens=40):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_fn(logp, mask, idxs, normalizer):
        return algos.sft_loss(logp, mask, "token_mean", normalizer)

    return optimizer_step(
        model,
        opt,
        rows,
        loss_fn,
        agg="token_mean",
        micro_batch_tokens=micro_batch_tokens,
        temperatures={},
        max_grad_norm=1.0,
    )


def test_rows_without_completion_tokens_join_no_micro_batch_and_change_nothing(tiny):
    """A row with no completion token (an empty generation) alone in its micro-batch used to reach the forward
    with no position to score (an IndexError); it is left out, and the step is the one without it."""
    import copy

    scored = _row("a", range(1, 30), [5, 6, 7, 8])
    empty = _row("b", range(40, 70), [])  # another context: too long to share a 40-token micro-batch with `scored`
    with_empty, without = copy.deepcopy(tiny[0]), copy.deepcopy(tiny[0])
    m = _sft_step(with_empty, [scored, empty])
    m_ref = _sft_step(without, [scored])
    assert m["micro_batches"] == m_ref["micro_batches"] == 1.0 and m["nll"] == pytest.approx(m_ref["nll"])
    for (n, p), q in zip(with_empty.named_parameters(), without.parameters()):
        assert torch.equal(p, q), n
    assert completion_logprobs(tiny[0], pack_rows([empty]), [empty], {}) == {}
    assert completion_logprobs(tiny[0], [], [], {}) == {}


def test_old_logprobs_are_recomputed_around_rows_without_completion_tokens(tiny):
    from envace.training.update import recompute_old_logprobs

    rows = [_row("a", range(1, 30), [5, 6, 7]), _row("b", range(40, 70), [])]
    recompute_old_logprobs(tiny[0], rows, micro_batch_tokens=40, temperatures={})
    assert len(rows[0].old_logprobs) == 3 and rows[0].old_logprobs != [0.0] * 3 and rows[1].old_logprobs == []


def test_a_step_with_nothing_to_learn_updates_nothing_and_says_so(tiny):
    import copy

    model = copy.deepcopy(tiny[0])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for rows in ([], [_row("b", range(40, 70), [])]):
        assert _sft_step(model, rows) == {"micro_batches": 0.0}
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())


def _tiny_cfg(tmp_path, variant, **kw):
    return tiny_train_config(tmp_path / variant, variant=variant, **kw)


@pytest.mark.parametrize("variant", VARIANTS.names())
def test_every_variant_runs_a_short_cpu_training(tmp_path, variant):
    res = train(_tiny_cfg(tmp_path, variant))
    assert res.step == 1 and os.path.isdir(os.path.join(res.checkpoint, "policy"))
    m = read_metrics(res.out_dir)[-1]
    assert m["step"] == 1 and "reward/mean" in m and "perf/iteration_s" in m
    assert m["rehearse/rows"] == 0 or VARIANTS.get(variant).mode in ("rehearsal", "per_role")
    world = "real" if VARIANTS.get(variant).mode == "real" else "imagined"  # success is named by its world
    assert {k for k in m if k.endswith("success_rate")} == {f"reward/{world}_success_rate"}


def test_success_of_imagined_rollouts_is_never_logged_as_real_success(tokenizer):
    """A rehearsal batch whose imagined calls all match the gold logs imagined success 1 and no plain or real
    success key; a real batch logs real success by the environment's own check (here: not reached, since the
    policy never replies with the expected outputs), whatever the gold-call reward says."""
    from envace.rewards.functions import RewardContext, make_reward, score_trajectories
    from envace.training.trainer import _summarise

    tasks = [t for t in load_tasks("bank", "train", n=40) if len(t.user_turns) == 1 and t.expected_outputs][:2]
    by_user = {t.user_turns[0]: t for t in tasks}

    def gold_calls_then_ok(prompt):
        if "tool simulator" in prompt:
            return '<observation>{"ok": true}</observation>'
        task = next(t for u, t in by_user.items() if u in prompt)
        n = prompt.count("<|im_start|>tool")
        return render_act([task.flat_gold()[n]]) if n < len(task.flat_gold()) else "ok"

    out = {}
    for mode in ("rehearsal", "real"):
        be = ScriptedBackend(tokenizer, gold_calls_then_ok)
        trajs = RolloutEngine(be, RolloutConfig(max_steps=8), mode=mode).run(tasks, group_size=2)
        score_trajectories({t.id: t for t in tasks}, trajs, make_reward("gold_exact"), RewardContext())
        assert all(t.reward == 1.0 for t in trajs)  # the calls are the gold ones either way
        out[mode] = _summarise(trajs, 0)
    assert out["rehearsal"]["reward/imagined_success_rate"] == 1.0
    assert {k for k in out["rehearsal"] if "success" in k} == {"reward/imagined_success_rate"}
    assert {k for k in out["real"] if "success" in k} == {"reward/real_success_rate"}
    assert out["real"]["reward/real_success_rate"] == 0.0  # the real check wants the expected outputs in a reply


def test_bf16_rollouts_decode_through_packed_weights_while_the_update_stays_float32(tmp_path, tiny):
    from envace.training.distributed import Dist
    from envace.training.trainer import recomputes_old_logprobs, rollout_backend

    ONE_PROCESS = Dist()

    cfg = _tiny_cfg(tmp_path, "envace", rollout_bf16=True)
    assert recomputes_old_logprobs(cfg) and not recomputes_old_logprobs(_tiny_cfg(tmp_path, "envace"))
    assert not recomputes_old_logprobs(_tiny_cfg(tmp_path, "envace", rollout_bf16=True, recompute_old_logprobs=False))
    be = rollout_backend(cfg, tiny[0], tiny[1], ONE_PROCESS)
    assert be.bf16 and be._decoder is not None and be._decoder.dtype == torch.bfloat16 and not cfg.bf16
    assert (
        rollout_backend(_tiny_cfg(tmp_path, "envace"), tiny[0], tiny[1], ONE_PROCESS)._decoder is None
    )  # float32 default: the model itself
    res = train(cfg)
    m = read_metrics(res.out_dir)[-1]
    assert m["step"] == 1 and m["act/rows"] > 0


def _rewarded_and_perturbed(monkeypatch, shift):
    """Trajectories rewarded 0, 1, 0, 1, ... (an update with signal), whose recorded sampler log-probs are lowered
    by ``shift`` on every other completion token: a sampler that is not the trainer, ratio e**shift there."""
    import envace.training.trainer as trainer

    rollout, score = trainer.rollout_batch, trainer.score_trajectories

    def perturbed(run, it):
        trajs = rollout(run, it)
        for t in trajs:
            for r in t.rows:
                r.old_logprobs = [lp - shift * (j % 2) for j, lp in enumerate(r.old_logprobs)]
        return trajs

    def rewarded(tasks, trajs, *a, **kw):
        score(tasks, trajs, *a, **kw)
        for i, t in enumerate(trajs):
            t.reward = float(i % 2)

    monkeypatch.setattr(trainer, "rollout_batch", perturbed)
    monkeypatch.setattr(trainer, "score_trajectories", rewarded)


def test_a_perturbed_sampler_moves_the_mismatch_metrics_and_through_the_correction_the_weights(tmp_path, monkeypatch):
    """Float32 rollouts with recompute_old_logprobs: the sampler is the trainer (mismatch ~0). Lowering the recorded
    log-probs by 1 on every other token shows up in mismatch/* and, with the correction on, changes the trained
    weights; with it off (tis_cap None) the sampler's numbers never reach the loss: the weights are bit-equal."""
    from safetensors.torch import load_file

    def run(name, shift, tis_cap):
        _rewarded_and_perturbed(monkeypatch, shift)
        res = train(_tiny_cfg(tmp_path / name, "envace", recompute_old_logprobs=True, tis_cap=tis_cap))
        monkeypatch.undo()
        return res.metrics[-1], load_file(os.path.join(res.checkpoint, "policy", "model.safetensors"))

    (same, w_same), (moved, w_moved) = run("same", 0.0, 2.0), run("moved", 1.0, 2.0)
    (_, w_off), (moved_off, w_moved_off) = run("off", 0.0, None), run("moved_off", 1.0, None)
    assert same["adv/adv_abs_mean"] > 0 and same["loss/policy/grad_norm"] > 0
    assert same["mismatch/kl"] < 1e-5 and same["mismatch/clipped_share"] == 0.0
    assert same["mismatch/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    # every other token at r = e > 2: k3 = e - 2 there, about half of the tokens clipped
    assert 0.25 < moved["mismatch/kl"] < (math.e - 2) / 2 + 1e-3 and 0.3 < moved["mismatch/clipped_share"] <= 0.5
    assert moved["mismatch/ratio_max"] == pytest.approx(math.e, rel=1e-3)
    assert moved_off["mismatch/kl"] == pytest.approx(moved["mismatch/kl"])  # logged without the correction too
    assert any(not torch.equal(w_same[k], w_moved[k]) for k in w_same)
    assert all(torch.equal(w_off[k], w_moved_off[k]) for k in w_off)


def test_the_rollout_correction_is_on_where_the_sampler_is_not_the_trainer(tmp_path):
    """Float32 rollouts and update: nothing recomputed, no mismatch/* logged; bf16 rollouts, float32 update: the old
    log-probs are recomputed, so the correction (default cap 2) applies and the mismatch is logged."""
    assert TrainConfig().tis_cap == 2.0
    assert not [k for k in train(_tiny_cfg(tmp_path / "f32", "envace")).metrics[-1] if k.startswith("mismatch/")]
    m = train(_tiny_cfg(tmp_path / "bf16", "envace", rollout_bf16=True)).metrics[-1]
    assert {"mismatch/kl", "mismatch/clipped_share", "mismatch/ratio_mean", "mismatch/ratio_max"} <= set(m)
    assert 0.0 <= m["mismatch/kl"] < 0.1 and 0.0 <= m["mismatch/clipped_share"] < 0.1


def test_mismatch_metrics_of_two_processes_are_those_of_the_whole_batch():
    """Each process holds its own rows; the merged mismatch/* (token-weighted means, max of the maxima: the largest
    ratio, e**2, is process 1's) equal one process's over all rows."""
    from envace.training.distributed import Dist
    from envace.training.trainer import mismatch_metrics

    rows = [_row(f"t{i}", [1, 2], list(range(n))) for i, n in enumerate((3, 1, 4, 2))]
    for r, old in zip(rows, ([-1.0, -2.0, -0.5], [-0.1], [-3.0, -1.0, -1.0, -2.0], [-0.7, -0.2])):
        r.old_logprobs = old
    sampler = [[-1.5, -1.0, -0.5], [-0.1], [-2.0, -1.5, -3.0, -2.0], [-0.2, -0.9]]

    class Gathered(Dist):
        world_size = 2

        def __init__(self, other=None):
            super().__init__()
            self.other, self.sent = other, None

        def all_gather(self, obj):
            self.sent = obj
            return [obj, self.other]

    second = Gathered({})
    mismatch_metrics(rows[2:], sampler[2:], 2.0, second)  # what process 1 sends
    merged = mismatch_metrics(rows[:2], sampler[:2], 2.0, Gathered(second.sent))
    whole = mismatch_metrics(rows, sampler, 2.0, Dist())
    assert merged == pytest.approx(whole) and whole["mismatch/clipped_share"] == pytest.approx(2 / 10)
    assert whole["mismatch/ratio_max"] == pytest.approx(math.exp(2.0)) and whole["mismatch/kl"] > 0
    assert mismatch_metrics([], [], 2.0, Dist()) == {}


def test_tis_cap_round_trips_through_yaml_and_the_command_line(tmp_path):
    import yaml

    from envace.config import from_dict, to_dict

    cfg = TrainConfig(tis_cap=3.5)
    assert from_dict(TrainConfig, yaml.safe_load(yaml.safe_dump(to_dict(cfg)))) == cfg
    p = tmp_path / "c.yaml"
    p.write_text("tis_cap: null\n")
    assert load_config(TrainConfig, str(p), []).tis_cap is None
    assert load_config(TrainConfig, str(p), ["tis_cap=4"]).tis_cap == 4.0
    with pytest.raises(ValueError, match="tis_cap"):
        load_config(TrainConfig, None, ["tis_cap=0.5"])


def test_update_parts_cover_every_row_once_per_epoch_and_default_to_one_step_in_order():
    assert update_parts(5, 1, 1, seed=0) == [(0, [0, 1, 2, 3, 4])]
    parts = update_parts(7, 3, 2, seed=1)
    assert [e for e, _ in parts] == [0, 0, 1, 1, 2, 2]
    for epoch in range(3):
        rows = sorted(i for e, p in parts if e == epoch for i in p)
        assert rows == list(range(7))
    assert parts == update_parts(7, 3, 2, seed=1) and parts != update_parts(7, 3, 2, seed=2)
    assert update_parts(1, 1, 2, seed=0) == [(0, [0]), (0, [])]  # a process with fewer rows than parts still steps


def test_update_epochs_and_mini_batches_take_that_many_optimizer_steps_per_iteration(tmp_path):
    res = train(_tiny_cfg(tmp_path, "envace", update_epochs=2, mini_batches=2))
    opt = torch.load(os.path.join(res.checkpoint, "optimizer.pt"), weights_only=False)["policy"]
    assert {int(s["step"]) for s in opt["state"].values()} == {4}
    with pytest.raises(ValueError, match="update_epochs"):
        _tiny_cfg(tmp_path, "envace", update_epochs=0)


def test_loss_metrics_are_the_last_updating_step_s_and_say_when_nothing_was_updated(tmp_path, monkeypatch):
    """More mini-batches than rows leaves the last parts empty: the logged loss is still the last step that ran.
    A batch with no scored trajectory updates nothing and logs micro_batches 0 (not a loss)."""
    import envace.training.trainer as trainer

    m = train(_tiny_cfg(tmp_path, "envace", mini_batches=64)).metrics[-1]
    assert m["loss/policy/micro_batches"] >= 1 and "loss/policy/loss" in m and "loss/policy/first_pass/loss" in m
    real = trainer.score_trajectories

    def unscored(tasks, trajs, *a, **kw):
        real(tasks, trajs, *a, **kw)
        for t in trajs:
            t.reward = None

    monkeypatch.setattr(trainer, "score_trajectories", unscored)
    m = train(_tiny_cfg(tmp_path / "unscored", "envace")).metrics[-1]
    assert m["reward/unscored"] > 0 and m["loss/policy/micro_batches"] == 0
    assert not [k for k in m if k.startswith("loss/") and k != "loss/policy/micro_batches"]


def test_lora_and_pooled_baseline_and_kl_are_config_values(tmp_path):
    res = train(_tiny_cfg(tmp_path, "envace", lora_r=4, advantage="pooled", kl_coef=1e-4))
    assert os.path.exists(os.path.join(res.checkpoint, "policy", "adapter_config.json"))


def test_config_loads_from_yaml_with_cli_overrides_and_rejects_unknown_fields(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("variant: real_env\ngroup_size: 3\nrollout:\n  act: {temperature: 0.7}\n")
    cfg = load_config(TrainConfig, str(p), ["lr=1e-5", "rollout.max_steps=3"])
    assert cfg.variant == "real_env" and cfg.group_size == 3
    assert cfg.rollout.act.temperature == 0.7 and cfg.lr == 1e-5 and cfg.rollout.max_steps == 3
    assert load_config(TrainConfig, None, ["rollout_bf16=true"]).rollout_bf16 is True
    with pytest.raises(ValueError, match="unknown TrainConfig field"):
        load_config(TrainConfig, None, ["learning_rate=1"])
    with pytest.raises(KeyError, match="valid names"):
        load_config(TrainConfig, None, ["variant=magic"])


def test_killed_training_resumes_from_the_last_checkpoint_without_gaps(tmp_path):
    out = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "envace.cli",
        "train",
        "--set",
        "model=tiny-random",
        "--set",
        "suite=bank",
        "--set",
        "iterations=4",
        "--set",
        "batch_tasks=1",
        "--set",
        "save_every=1",
        "--set",
        "group_size=2",
        "--set",
        "rollout.max_steps=2",
        "--set",
        "rollout.act.max_new_tokens=8",
        "--set",
        "rollout.rehearse.max_new_tokens=8",
        "--set",
        "tensorboard=false",
        "--set",
        "progress=false",
        "--set",
        f"out_dir={out}",
        "--set",
        "lr=1e-3",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = out / "checkpoints" / "latest"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if latest.exists() and latest.read_text().strip() >= "step-000002":
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = int(latest.read_text().strip().split("-")[1])
    assert 2 <= killed_at < 4, "the run should be killed mid-way (raise the iteration count if it finished)"
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    steps = [m["step"] for m in read_metrics(str(out))]
    assert steps == [1, 2, 3, 4]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-000004"


def test_old_logprobs_taken_in_the_single_step_train_as_a_separate_recomputation_does(tmp_path, monkeypatch):
    """With one optimizer step the old log-probs come from the step's own forward; a separate pass before it gives
    the same mismatch metrics and the same trained weights (a perturbed sampler, the correction on)."""
    from safetensors.torch import load_file

    import envace.training.trainer as trainer

    def run(name, in_step):
        _rewarded_and_perturbed(monkeypatch, 1.0)
        monkeypatch.setattr(trainer, "old_logprobs_in_the_step", lambda cfg: in_step)
        res = train(_tiny_cfg(tmp_path / name, "envace", recompute_old_logprobs=True, tis_cap=2.0))
        monkeypatch.undo()
        return res.metrics[-1], load_file(os.path.join(res.checkpoint, "policy", "model.safetensors"))

    (m_step, w_step), (m_pass, w_pass) = run("in_step", True), run("separate", False)
    assert trainer.old_logprobs_in_the_step(_tiny_cfg(tmp_path, "envace"))
    assert not trainer.old_logprobs_in_the_step(_tiny_cfg(tmp_path, "envace", update_epochs=2))
    for k in ("mismatch/kl", "mismatch/clipped_share", "mismatch/ratio_mean", "loss/policy/grad_norm"):
        assert m_step[k] == pytest.approx(m_pass[k], rel=1e-4, abs=1e-6), k
    assert m_step["mismatch/kl"] > 0.25  # the perturbation reached the metrics through the in-step old log-probs
    for k in w_step:
        torch.testing.assert_close(w_step[k], w_pass[k], rtol=1e-4, atol=1e-6)
