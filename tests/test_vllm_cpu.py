"""The real vLLM engine on this machine's CPU (or GPU): the trainer's rollout engine, a rehearsal rollout, an
evaluation, and log-probs that match the trainer's recomputation before and after a weight sync.

Skipped, with the probe's reason, where vLLM cannot run (not installed, a broken wheel, no kernels for this CPU);
``-m "not vllm"`` deselects them locally (they start one engine, ~30 s on 2 cores). The model is a small random-init
Llama with the SmolLM2 tokenizer whose head size (64) vLLM's CPU attention supports (``tiny-random``'s 16 is not):
conftest's ``small_folder``.
"""

import copy
import dataclasses

import pytest
import torch

from envace.chat.parsing import render_act
from envace.backends.base import SamplingParams
from envace.backends.scripted import ScriptedBackend
from envace.backends.vllm import VLLMBackend, vllm_probe
from envace.config import TrainConfig
from envace.envs import load_tasks
from envace.evaluation.trials import evaluate
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.training.distributed import Dist
from envace.training.trainer import rollout_backend
from envace.training.update import recompute_old_logprobs
from numerics import assert_logprobs_close

PROBE = vllm_probe()
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not PROBE.runs, reason=f"vLLM cannot run here: {PROBE.problem}"),
]

# float32 on both sides, other kernels: rounding of the logits' log-sum-exp, well under what a weight change moves
LP_REL, LP_ELEM = 1e-4, 1e-4


@pytest.fixture(scope="module")
def small(small_folder):
    """(folder, float32 model, tokenizer): the seeded random-init Llama of conftest's ``small_folder``, loaded."""
    from envace.backends.models import load

    model, tok = load(small_folder)
    return small_folder, model, tok


@pytest.fixture(scope="module")
def engine(small):
    """The trainer's rollout engine for ``rollout_backend: vllm`` (one per module: starting one takes ~20 s)."""
    folder, model, tok = small
    cfg = TrainConfig(
        model=folder,
        rollout_backend="vllm",
        # float32 on every CPU: where bf16 is fast, "auto" would pick it and the log-prob tolerances assume float32
        rollout_backend_options={"cpu_kv_cache_gib": 0.25, "max_model_len": 4096, "dtype": "float32"},
        progress=False,
        tensorboard=False,
    )
    be = rollout_backend(cfg, model, tok, Dist())
    assert isinstance(be, VLLMBackend)
    return be


@pytest.fixture(scope="module")
def bank_tasks():
    return load_tasks("bank", "train", n=2)


def _prompt(tok, text="Which accounts do I have?"):
    from envace.chat.prompts import ChatFormat

    return ChatFormat.for_tokenizer(tok).render([{"role": "user", "content": text}], add_generation_prompt=True)


RUN = dict(group_size=2, seed=3)
"""K and the seed of the rollouts of :func:`_rollout_cfg` (``RolloutEngine.run``'s arguments)."""


def _rollout_cfg():
    return RolloutConfig(
        max_steps=2,
        act=SamplingParams(max_new_tokens=12),
        rehearse=SamplingParams(temperature=0.6, max_new_tokens=12, stop=["</observation>"]),
    )


def _recomputed(model, rows, cfg):
    """The rows' log-probs as the trainer recomputes them before an update (copies: the rows keep vLLM's)."""
    rows = copy.deepcopy(rows)
    temps = {"act": cfg.act.temperature, "rehearse": cfg.rehearse.temperature}
    recompute_old_logprobs(model, rows, micro_batch_tokens=4096, temperatures=temps)
    return [lp for r in rows for lp in r.old_logprobs]


def test_generations_keep_the_hf_backends_contract(engine, small):
    _, _, tok = small
    p = _prompt(tok)
    a, b = (engine.generate([p, p], SamplingParams(max_new_tokens=10, seed=5)) for _ in range(2))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]  # a seed fixes the call's draws
    assert a[0].token_ids != a[1].token_ids  # equal prompts of one call are sampled apart
    other = engine.generate([p, p], SamplingParams(max_new_tokens=10, seed=6))
    assert [g.token_ids for g in other] != [g.token_ids for g in a]
    for g in a:
        assert g.text == tok.decode(g.token_ids, skip_special_tokens=True) and g.prompt_tokens == len(p)
        assert len(g.logprobs) == len(g.token_ids) and g.finish_reason in ("length", "eos")
    greedy = engine.generate([p], SamplingParams(temperature=0.0, max_new_tokens=8))[0]
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 8
    stop = tok.decode(greedy.token_ids[:3], skip_special_tokens=True)
    cut = engine.generate([p], SamplingParams(temperature=0.0, max_new_tokens=8, stop=[stop]))[0]
    assert cut.finish_reason == "stop" and cut.token_ids == greedy.token_ids[: len(cut.token_ids)]
    assert stop in cut.text and len(cut.token_ids) <= 3


def gold_act(tasks):
    """Act as a script: the task's gold calls, one per step, then a reply (the random model never calls a tool,
    so it would never reach Rehearse)."""
    by_user = {t.user_turns[0]: t for t in tasks}

    def respond(prompt: str) -> str:
        task = next(t for u, t in by_user.items() if u in prompt)
        n, gold = prompt.count("<|im_start|>tool"), task.flat_gold()
        return render_act([gold[n]]) if n < len(gold) else "All done."

    return respond


def test_a_rollout_through_vllm_is_seeded_and_served_from_the_prefix_cache(engine, small, bank_tasks):
    _, model, _ = small
    cached = engine.stats["cached_tokens"]
    cfg = _rollout_cfg()
    a = RolloutEngine(engine, cfg).run(bank_tasks, **RUN)
    b = RolloutEngine(engine, cfg).run(bank_tasks, **RUN)
    assert len(a) == 4
    assert [r.completion_ids for t in a for r in t.rows] == [r.completion_ids for t in b for r in t.rows]
    rows = [r for t in a for r in t.rows]
    assert rows and all(len(r.completion_ids) == len(r.old_logprobs) > 0 and max(r.old_logprobs) <= 0 for r in rows)
    assert engine.stats["cached_tokens"] > cached  # a turn's prompt extends the last: served from the prefix cache
    assert_logprobs_close(
        [lp for r in rows for lp in r.old_logprobs], _recomputed(model, rows, cfg), rel=LP_REL, elem=LP_ELEM
    )


def test_rehearse_through_vllm_gives_rehearse_rows_with_the_trainers_log_probs(engine, small, bank_tasks):
    _, model, tok = small
    act = SamplingParams(max_new_tokens=160)  # room for a scripted call
    cfg = dataclasses.replace(_rollout_cfg(), act=act)  # Act scripted, Rehearse generated by vLLM (per_role)
    trajs = RolloutEngine(ScriptedBackend(tok, gold_act(bank_tasks)), cfg, rehearser=engine, mode="per_role").run(
        bank_tasks, **RUN
    )
    rows = [r for t in trajs for r in t.rows if r.role == "rehearse"]
    assert len(rows) >= len(trajs)  # every trajectory's first gold call was rehearsed
    assert all(t.steps[0].sources == ["rehearsed"] for t in trajs)
    assert_logprobs_close(
        [lp for r in rows for lp in r.old_logprobs], _recomputed(model, rows, cfg), rel=LP_REL, elem=LP_ELEM
    )


def test_evaluation_through_vllm(engine, bank_tasks):
    rollout = RolloutConfig(max_steps=2, act=SamplingParams(max_new_tokens=12))
    res = evaluate(engine, bank_tasks, samples=2, rollout=rollout)
    assert len(res.trajectories) == 4
    assert {t.task_id for t in res.trajectories} == {t.id for t in bank_tasks}
    assert all(t.mode == "real" and t.rows for t in res.trajectories)


def test_after_an_update_and_a_weight_sync_vllm_log_probs_match_the_trainers(engine, small, bank_tasks):
    _, model, _ = small
    cfg, run = _rollout_cfg(), {**RUN, "seed": 11}
    before = model.state_dict()
    updated = copy.deepcopy(model)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):  # an update's worth of change on every weight
        torch.manual_seed(1)
        for w in updated.parameters():
            w.add_(0.05 * w.std() * torch.randn_like(w))
    try:
        stale = [r for t in RolloutEngine(engine, cfg).run(bank_tasks, **run) for r in t.rows]
        stale_lp = [lp for r in stale for lp in r.old_logprobs]
        assert max(abs(x - y) for x, y in zip(stale_lp, _recomputed(updated, stale, cfg))) > 1e-2
        engine.sync_weights(updated)
        rows = [r for t in RolloutEngine(engine, cfg).run(bank_tasks, **run) for r in t.rows]
        vllm_lp = [lp for r in rows for lp in r.old_logprobs]
        assert_logprobs_close(vllm_lp, _recomputed(updated, rows, cfg), rel=LP_REL, elem=LP_ELEM)
    finally:
        engine.sync_weights(before)  # the module's other tests see the saved weights
