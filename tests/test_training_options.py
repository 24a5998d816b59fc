"""Training options beyond the paper, one setting each (issue 29): clip-higher, dynamic sampling, and the
cross-entropy on real observations; each is off by default and an experiment arm of its own beside EnvACE."""

import json
import math
import os

import pytest
import torch

from envace.chat.parsing import format_observation
from envace.config import TrainConfig, load_config, to_dict
from envace.core.types import Row, Trajectory
from envace.envs import load_tasks
from envace.math import algos
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.training import trainer
from envace.training.distributed import Dist
from envace.training.sft import GoldTeacher, gold_trajectories, real_observations, replayed_trajectories
from envace.training.trainer import OBS_ROLE, informative_trajectories, train, with_obs_loss
from tiny import tiny_train_config

ONE = Dist()


def _cfg(tmp_path, name, **kw):
    return tiny_train_config(tmp_path / name, **({"variant": "envace", "batch_tasks": 2, "n_train_tasks": 6} | kw))


def _weights(res):
    from safetensors.torch import load_file

    return load_file(os.path.join(res.checkpoint, "policy", "model.safetensors"))


# --------------------------------------------------------------------------------------------------------
# Clip-higher
# --------------------------------------------------------------------------------------------------------


def _rising_token(lift: float = 1.3):
    """One row, one token whose probability rose by ``lift`` since sampling, with a positive advantage."""
    old = torch.tensor([[math.log(0.2)]])
    logp = (old + math.log(lift)).clone().requires_grad_(True)
    return logp, old, torch.tensor([1.0]), torch.ones(1, 1, dtype=torch.bool)


def test_clip_higher_keeps_the_gradient_of_a_rising_token_that_the_symmetric_clip_stops():
    """ratio 1.3 with A > 0: above 1 + 0.2, below 1 + 0.28 ... 0.5: the symmetric clip has cut its gradient off,
    clip-higher keeps it (d/dlogp of -rho * A = -1.3)."""
    for high, grad in ((None, 0.0), (0.2, 0.0), (0.5, -1.3)):
        logp, old, adv, mask = _rising_token()
        loss, m = algos.policy_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=high)
        loss.backward()
        assert logp.grad.item() == pytest.approx(grad, abs=1e-6)
        assert m["clip_frac"] == (1.0 if grad == 0.0 else 0.0)


def test_the_trainer_passes_clip_eps_high_to_the_loss(tmp_path):
    """The loss of a micro-batch that the trainer builds (``_grpo_loss``) keeps the rising token's gradient only
    with ``clip_eps_high``: the setting reaches the loss (dropping it on the way fails this test)."""
    row = Row("act", [1, 2], [3], [math.log(0.2)], "t", "t/0", "g")
    grads = {}
    for high in (None, 0.5):
        cfg = _cfg(tmp_path, "clip", clip_eps_high=high)
        logp, _, adv, mask = _rising_token()
        loss, _ = trainer._grpo_loss([row], adv, cfg, None, {})(logp, mask, [0], 1.0)
        loss.backward()
        grads[high] = logp.grad.item()
    assert grads[None] == 0.0 and grads[0.5] == pytest.approx(-1.3, abs=1e-6)
    assert TrainConfig().clip_eps_high is None
    with pytest.raises(ValueError, match="clip_eps_high"):
        TrainConfig(clip_eps_high=-0.1)


# --------------------------------------------------------------------------------------------------------
# Dynamic sampling
# --------------------------------------------------------------------------------------------------------


def test_informative_groups_by_hand():
    """Group 0: rewards 1, 1, 1 (no signal); 1: 0, 1; 2: 0.5 and an unscored one (one scored: no signal); 3: all
    unscored; 4: 0, 0 within the tolerance of 0.1 ... but 0 and 0.3 are apart."""
    nan = float("nan")
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.5, nan, nan, 0.0, 0.3])
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3, 4, 4])
    keep, m = algos.informative_groups(rewards, groups, ~torch.isnan(rewards))
    assert keep.tolist() == [False, True, False, False, True]
    assert m == {"groups": 5.0, "informative": 2.0, "degenerate": 3.0}
    keep, _ = algos.informative_groups(rewards, groups, ~torch.isnan(rewards), tol=0.5)
    assert keep.tolist() == [False, True, False, False, False]
    keep, m = algos.informative_groups(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert keep.numel() == 0 and m["groups"] == 0.0


def test_a_degenerate_group_has_zero_advantage_on_every_row_of_both_roles(tokenizer):
    """Why the groups are dropped: equal rewards give advantage 0 on every row (role-wise and pooled); a group whose
    rewards differ is kept."""
    a, b = load_tasks("bank", "train", n=2)
    trajs = gold_trajectories(tokenizer, [a, a, b, b])
    for t, g, r in zip(trajs, ("g0", "g0", "g1", "g1"), (1.0, 1.0, 0.0, 1.0)):
        t.group_id, t.reward = g, r
    kept, dropped = informative_trajectories(trajs)
    assert kept == trajs[2:] and dropped == trajs[:2]
    for estimator in ("rolewise", "pooled"):
        rows, adv, _ = trainer.rows_with_advantages(trajs[:2], estimator, ("act", "rehearse"))
        assert {r.role for r in rows} == {"act", "rehearse"} and bool((adv == 0).all())
        _, adv, _ = trainer.rows_with_advantages(trajs[2:], estimator, ("act", "rehearse"))
        assert bool((adv != 0).all())


def _constant_on(tasks_ids: set[str], monkeypatch, calls: list | None = None):
    """Rewards: 1.0 for every trajectory of the tasks in ``tasks_ids`` (no signal), 0 / 1 by trajectory index for the
    others; ``calls`` collects the task ids of each rollout_batch call."""
    real_rollout = trainer.rollout_batch

    def rewarded(tasks, trajs, *a, **kw):
        for t in trajs:
            t.reward = 1.0 if t.task_id in tasks_ids else float(int(t.id.rsplit("/", 1)[1]) % 2)

    def recorded(run, it, *a, **kw):
        out = real_rollout(run, it, *a, **kw)
        if calls is not None:
            calls.append(sorted({t.task_id for t in out}))
        return out

    monkeypatch.setattr(trainer, "score_trajectories", rewarded)
    monkeypatch.setattr(trainer, "rollout_batch", recorded)


def test_dynamic_sampling_drops_groups_without_signal_and_refills_the_batch(tmp_path, monkeypatch):
    """Both tasks of the first batch get one reward for all their trajectories: both groups are dropped (logged as
    dropped), further tasks are rolled out until two groups with a signal are kept, and only those are trained."""
    pool = trainer.train_tasks(_cfg(tmp_path, "x"))
    first = [pool[i].id for i in trainer.task_stream(len(pool), 0, 0, 2)]
    calls: list = []
    _constant_on(set(first), monkeypatch, calls)
    seen_rows: list = []
    real_update = trainer.update
    monkeypatch.setattr(trainer, "update", lambda run, rows, *a: seen_rows.extend(rows) or real_update(run, rows, *a))
    res = train(_cfg(tmp_path, "dyn", dynamic_sampling=3))
    m = res.metrics[-1]
    assert calls[0] == sorted(first) and len(calls) >= 2  # the batch, then refill rounds
    assert m["sampling/extra_rounds"] == len(calls) - 1 >= 1
    assert m["sampling/groups_dropped"] >= 2 and m["sampling/groups_short"] == 0.0
    rolled = m["sampling/groups_dropped"] + 2
    assert m["sampling/kept_share"] == pytest.approx(2 / rolled)
    assert seen_rows and not {r.task_id for r in seen_rows} & set(first)  # nothing of the dropped groups trained
    with open(os.path.join(res.out_dir, "trajectories.jsonl"), encoding="utf-8") as f:
        logged = [json.loads(line) for line in f]
    dropped = [r for r in logged if r.get("dropped")]
    assert {r["task_id"] for r in dropped} >= set(first)
    kept = [r for r in logged if not r.get("dropped")]
    assert len({r["group_id"] for r in kept}) == 2 and all(r["iteration"] == 0 for r in logged)


def test_dynamic_sampling_goes_on_with_what_it_kept_after_its_rounds(tmp_path, monkeypatch):
    """Every task without a signal: the extra rounds run out, the batch is trained with no group (counted short)."""
    pool = trainer.train_tasks(_cfg(tmp_path, "x"))
    _constant_on({t.id for t in pool}, monkeypatch)
    m = train(_cfg(tmp_path, "none", dynamic_sampling=2)).metrics[-1]
    assert m["sampling/extra_rounds"] == 2 and m["sampling/groups_short"] == 2 and m["sampling/kept_share"] == 0
    assert m["loss/policy/micro_batches"] == 0


def test_dynamic_sampling_off_is_today_s_behaviour_and_with_every_group_informative_it_changes_nothing(
    tmp_path, monkeypatch
):
    _constant_on(set(), monkeypatch)
    off = train(_cfg(tmp_path, "off"))
    on = train(_cfg(tmp_path, "on", dynamic_sampling=2))
    assert not [k for k in off.metrics[-1] if k.startswith("sampling/")]
    assert on.metrics[-1]["sampling/groups_dropped"] == 0 and on.metrics[-1]["sampling/extra_rounds"] == 0
    a, b = _weights(off), _weights(on)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="dynamic_sampling"):
        TrainConfig(dynamic_sampling=-1)


# --------------------------------------------------------------------------------------------------------
# Cross-entropy on real observations
# --------------------------------------------------------------------------------------------------------


def _loss_case():
    """Two policy rows (advantages +1, -1) and two observation rows, padded to 3 tokens."""
    rows = [Row("act", [1], [5, 6], [-1.0, -1.0], "t", "t/0", "g"), Row("rehearse", [1], [7], [-2.0], "t", "t/0", "g")]
    obs = [Row(OBS_ROLE, [1], [8, 9, 10], [0.0] * 3, "t", "o/0", "o"), Row(OBS_ROLE, [1], [11], [0.0], "t", "o/1", "o")]
    logp = torch.tensor([[-1.1, -0.9, 0.0], [-2.0, 0.0, 0.0], [-0.5, -1.5, -2.5], [-3.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    return rows, obs, logp, mask


def test_the_observation_loss_adds_alpha_times_the_token_mean_nll_of_observation_rows_only(tmp_path):
    """The policy part is the policy loss with its own normalizer (alpha 0: loss and gradients exactly those of the
    policy loss alone); the observation part touches only the rows of role observation, -alpha / n_obs_tokens on
    each of their tokens; ``obs_ce`` is their token-mean NLL."""
    rows, obs, logp0, mask = _loss_case()
    cfg = _cfg(tmp_path, "obs")
    adv = torch.tensor([1.0, -1.0])
    plain = trainer._grpo_loss(rows, adv, cfg, None, {})
    lp = logp0[:2, :2].clone().requires_grad_(True)  # as wide as the policy rows alone
    ref_loss, _ = plain(lp, mask[:2, :2], [0, 1], 3.0)  # 3 policy tokens
    ref_loss.backward()
    for alpha in (0.0, 0.5):
        fn, obs_ce = with_obs_loss(plain, rows, obs, alpha, "token_mean", ONE)
        lp_all = logp0.clone().requires_grad_(True)
        loss, _ = fn(lp_all, mask, [0, 1, 2, 3], 7.0)  # the normalizer of all rows is not the policy's
        loss.backward()
        nll = (0.5 + 1.5 + 2.5 + 3.0) / 4
        assert loss.item() == (ref_loss.item() if alpha == 0 else pytest.approx(ref_loss.item() + alpha * nll))
        assert torch.equal(lp_all.grad[:2, :2], lp.grad)  # exactly the policy loss's gradient on the policy rows
        assert not lp_all.grad[:2, 2:].any()
        want = torch.where(mask[2:], torch.tensor(-alpha / 4), torch.tensor(0.0))
        assert torch.allclose(lp_all.grad[2:], want) and obs_ce() == pytest.approx(nll)


def _real_gold_runs(tokenizer, tasks):
    """The gold calls played in the real environment (mode real): trajectories with real observations."""
    cfg = RolloutConfig(max_steps=12, max_steps_per_turn=8, max_context_tokens=1 << 20)
    return RolloutEngine(GoldTeacher(tokenizer, tasks), cfg, mode="real").run(tasks, group_prefix="real", group_size=1)


def test_a_replayed_real_trajectory_gives_the_rehearse_rows_sft_trains_on(tokenizer):
    """Replaying real-mode trajectories of the gold calls gives, call by call, the Rehearse rows of the gold episodes
    (the SFT warm-up's rows): the same prompts and the real observations as completions."""
    tasks = load_tasks("bank", "train", n=3)
    real = _real_gold_runs(tokenizer, tasks)
    assert all(real_observations(t) is not None for t in real)
    replayed = replayed_trajectories(tokenizer, real, {t.id: t for t in tasks})
    gold = gold_trajectories(tokenizer, tasks)
    for r, g, t in zip(replayed, gold, real):
        r_rows = [(x.prompt_ids, x.completion_ids) for x in r.rows if x.role == "rehearse"]
        assert r_rows == [(x.prompt_ids, x.completion_ids) for x in g.rows if x.role == "rehearse"] and r_rows
        texts = [tokenizer.decode(c) for _, c in r_rows]
        assert [format_observation(o) in s for o, s in zip(real_observations(t), texts)] == [True] * len(texts)
    rehearsed = Trajectory(**{**real[0].__dict__, "mode": "rehearsal"})
    assert real_observations(rehearsed) is None  # rehearsed observations are not real, and no shadow was kept


def test_shadow_observations_are_real_observations_and_replay_as_the_gold_does(tokenizer):
    """A rehearsed trajectory with shadow copies holds a real observation for every call: the shadow's, never the
    rehearsed one; replayed, it gives the gold's Rehearse rows."""
    tasks = load_tasks("bank", "train", n=2)
    shadowed = gold_trajectories(tokenizer, tasks, shadow=True)
    for t in shadowed:
        for s in t.steps:
            s.observations = [{"imagined": True}] * len(s.observations)  # what Rehearse said is not what counts
    assert all(real_observations(t) == [o for s in t.steps for o in s.shadow] for t in shadowed)
    assert all({"imagined": True} not in real_observations(t) and real_observations(t) for t in shadowed)
    replayed = replayed_trajectories(tokenizer, shadowed, {t.id: t for t in tasks})
    gold = gold_trajectories(tokenizer, tasks)
    for r, g in zip(replayed, gold):
        assert [x.completion_ids for x in r.rows if x.role == "rehearse"] == [
            x.completion_ids for x in g.rows if x.role == "rehearse"
        ]


def test_observation_rows_are_real_observations_under_the_rehearse_prompt_and_never_get_an_advantage(tmp_path):
    run = trainer.setup(_cfg(tmp_path, "rows", obs_loss_alpha=0.1, variant="real_env"))
    tasks = run.batch(0)
    real = _real_gold_runs(run.tok, tasks)
    for t in real:
        t.reward = 1.0
    rows, m = trainer.observation_rows(run, real)
    gold = [x for t in gold_trajectories(run.tok, tasks) for x in t.rows if x.role == "rehearse"]
    assert {r.role for r in rows} == {OBS_ROLE} and len(rows) == 2 * len(gold)  # gold + replayed, one per call
    assert m["obs/gold_rows"] == m["obs/replayed_rows"] == len(gold) and m["obs/too_long"] == 0
    assert [(r.prompt_ids, r.completion_ids) for r in rows[: len(gold)]] == [
        (g.prompt_ids, g.completion_ids) for g in gold
    ]
    assert all("tool simulator" in run.tok.decode(r.prompt_ids) for r in rows)
    with_obs = [Trajectory(**{**real[0].__dict__, "rows": real[0].rows + rows})]
    adv_rows, _, _ = trainer.rows_with_advantages(with_obs, "rolewise", ("act", "rehearse"))
    assert adv_rows and OBS_ROLE not in {r.role for r in adv_rows}


def _obs_nll(run, rows) -> float:
    from envace.training.update import completion_logprobs, pack_rows

    model = run.models["policy"]
    with torch.no_grad():
        lp = completion_logprobs(model, pack_rows(rows), rows, {})
    return float(-torch.cat([lp[i] for i in sorted(lp)]).mean())


def test_the_observation_loss_lowers_the_nll_of_real_observations_and_alpha_0_changes_nothing(tmp_path, monkeypatch):
    """Rewards all equal (no policy gradient): with alpha > 0 a few iterations on one task lower the NLL of its gold
    observation tokens; alpha 0 leaves the weights bit-equal to the start and builds no observation rows."""
    _constant_on({t.id for t in trainer.train_tasks(_cfg(tmp_path, "x", n_train_tasks=1))}, monkeypatch)
    kw = dict(n_train_tasks=1, batch_tasks=1, iterations=3, save_every=3)
    start = trainer.setup(_cfg(tmp_path, "start", **kw))
    rows = [r for t in gold_trajectories(start.tok, start.batch(0)) for r in t.rows if r.role == "rehearse"]
    before = _obs_nll(start, rows)
    w0 = {k: v.detach().clone() for k, v in start.models["policy"].state_dict().items()}
    on = train(_cfg(tmp_path, "on", obs_loss_alpha=1.0, **kw))
    after = _obs_nll(trainer.setup(_cfg(tmp_path, "on", obs_loss_alpha=1.0, **kw)), rows)
    assert after < before - 0.1
    assert all(m["loss/obs_ce"] > 0 and m["obs/gold_rows"] == len(rows) for m in on.metrics)
    assert on.metrics[-1]["loss/obs_ce"] < on.metrics[0]["loss/obs_ce"]
    monkeypatch.setattr(trainer, "observation_rows", lambda *a: pytest.fail("no observation rows at alpha 0"))
    off = train(_cfg(tmp_path, "off", **kw))
    assert not [k for k in off.metrics[-1] if k.startswith("obs/") or k == "loss/obs_ce"]
    w = _weights(off)
    assert all(torch.equal(w[k], w0[k]) for k in w)


# --------------------------------------------------------------------------------------------------------
# Configs and arms
# --------------------------------------------------------------------------------------------------------


def test_the_three_settings_default_off_and_round_trip_through_yaml_and_the_command_line(tmp_path):
    from envace.config import config_yaml

    d = TrainConfig()
    assert (d.clip_eps_high, d.dynamic_sampling, d.obs_loss_alpha) == (None, 0, 0.0)
    cfg = load_config(TrainConfig, None, ["clip_eps_high=0.28", "dynamic_sampling=3", "obs_loss_alpha=0.1"])
    assert (cfg.clip_eps_high, cfg.dynamic_sampling, cfg.obs_loss_alpha) == (0.28, 3, 0.1)
    p = tmp_path / "c.yaml"
    p.write_text(config_yaml(cfg))
    assert to_dict(load_config(TrainConfig, str(p))) == to_dict(cfg)
    with pytest.raises(ValueError, match="obs_loss_alpha"):
        TrainConfig(obs_loss_alpha=-1.0)


def test_each_option_is_an_arm_of_its_own_beside_an_unchanged_envace_arm(tmp_path, monkeypatch):
    import envace.evaluation.experiment as experiment
    from envace.evaluation.experiment import ARMS, OPTION_ARMS, ExperimentConfig, SeedRun

    seen = {}

    class Stop(Exception):
        pass

    def fake_train(cfg):
        seen[os.path.basename(cfg.out_dir)] = cfg
        raise Stop

    monkeypatch.setattr(trainer, "train", fake_train)
    monkeypatch.setattr(SeedRun, "sft", lambda self: ("tiny-random", []))
    cfg = ExperimentConfig(arms=("envace", *OPTION_ARMS), out_dir=str(tmp_path), train_options={"kl_coef": 1e-4})
    for arm in cfg.arms:
        with pytest.raises(Stop):
            ARMS.get(arm).build(SeedRun(cfg, 0))
    base = to_dict(seen["envace"])
    plain = seen["envace"]
    assert (plain.clip_eps_high, plain.dynamic_sampling, plain.obs_loss_alpha, plain.real_share) == (None, 0, 0.0, 0.0)
    assert plain.notes_attempts == 0 and seen["envace+notes"].notes_format == "agreed-live"
    for arm, o in OPTION_ARMS.items():
        diff = {k for k, v in to_dict(seen[arm]).items() if v != base[k]}
        assert diff == {"out_dir", *o.options} and seen[arm].variant == o.variant == "envace"
        assert seen[arm].kl_coef == o.options.get("kl_coef", 1e-4)  # train_options reach these arms, under their own
    assert "envace" not in OPTION_ARMS and not set(OPTION_ARMS) & set(ExperimentConfig().arms)
    assert experiment.OPTION_ARMS is OPTION_ARMS


def test_the_observation_loss_trains_the_model_that_plays_rehearse(tmp_path, monkeypatch):
    """per_role: the observation rows go to the second model (it plays Rehearse); the policy, with no signal of its
    own (equal rewards), stays bit-equal to a run without the loss."""
    from safetensors.torch import load_file

    _constant_on({t.id for t in trainer.train_tasks(_cfg(tmp_path, "x"))}, monkeypatch)
    runs = {a: train(_cfg(tmp_path, f"per_role{a}", variant="per_role", obs_loss_alpha=a)) for a in (0.0, 1.0)}
    w = {
        (a, name): load_file(os.path.join(r.checkpoint, name, "model.safetensors"))
        for a, r in runs.items()
        for name in ("policy", "rehearser")
    }
    assert all(torch.equal(w[0.0, "policy"][k], w[1.0, "policy"][k]) for k in w[0.0, "policy"])
    assert any(not torch.equal(w[0.0, "rehearser"][k], w[1.0, "rehearser"][k]) for k in w[0.0, "rehearser"])
    assert runs[1.0].metrics[-1]["loss/obs_ce"] > 0
