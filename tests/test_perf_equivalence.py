"""The speed-ups are exact: reuse paths give the same tokens, and log-probs and gradients equal up to float32
rounding (tests/numerics.py: relative to each tensor's magnitude), as plain computation.

HF backend: per-session KV reuse, shared-prefix prefill and the preallocated batch cache against encoding every
prompt whole, and a lockstep batch against one prompt at a time. Update: running the common prefix of a
micro-batch once against running every pack whole (log-probs, gradients, the optimizer step), and micro-batches
that cover every pack once within the token budget.
"""

import copy

import pytest
import torch

from envace.chat.parsing import render_act
from envace.backends.base import SamplingParams
from envace.backends.hf import HFBackend
from envace.backends.models import enable_gradient_checkpointing
from envace.backends.scripted import ScriptedBackend
from envace.envs import load_tasks
from envace.chat.prompts import REHEARSE_SYSTEM
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.training.update import (
    MIN_SHARED_PREFIX,
    completion_logprobs,
    micro_batches,
    optimizer_step,
    pack_rows,
    shared_prefix_len,
)
from lifetimes import Made, no_cyclic_gc
from numerics import assert_all_close_rel, assert_close_rel, assert_logprobs_close

TEMPS = {"act": 1.0, "rehearse": 0.6}


def _chat(tok, system: str, user: str) -> list[int]:
    return tok.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": user}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )


def _prompts(tok, n: int = 5) -> list[list[int]]:
    """Two clusters with long common prefixes (two system prompts) and different user turns."""
    systems = [
        "You are a careful banking assistant. Use the tools when needed. " * 4,
        "You manage files in a sandbox; answer briefly. " * 4,
    ]
    return [list(_chat(tok, systems[i % 2], f"request number {i}: " + "please help " * (i + 1))) for i in range(n)]


def _three_turns(be: HFBackend, tok, params: SamplingParams) -> list:
    """Three calls per session, each prompt extending the previous prompt + completion (as the rollout does)."""
    prompts = _prompts(tok)
    sessions = [f"s{i}" for i in range(len(prompts))]
    out = []
    for turn in range(3):
        gens = be.generate(prompts, params.with_(seed=10 + turn), sessions)
        out += gens
        prompts = [
            p + g.token_ids + tok.encode(f" tool result {turn} for {i}") for i, (p, g) in enumerate(zip(prompts, gens))
        ]
    return out


def _same(a, b) -> None:
    """The same tokens; their log-probs equal up to float32 rounding."""
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    for k, (x, y) in enumerate(zip(a, b)):
        assert_logprobs_close(x.logprobs, y.logprobs, what=f"log-probs of generation {k}")


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_new_tokens=12),
        SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=12, stop=["."]),
    ],
    ids=["greedy", "sampled"],
)
def test_session_reuse_and_shared_prefixes_match_encoding_every_prompt_whole(tiny, params):
    model, tok = tiny
    fast = HFBackend(model, tok)
    plain = HFBackend(model, tok, keep_sessions=False, share_prefixes=False)
    a, b = _three_turns(fast, tok, params), _three_turns(plain, tok, params)
    _same(a, b)
    assert fast.stats["shared_prefix_tokens"] >= 2 * MIN_SHARED_PREFIX  # both clusters were prefilled once
    assert sum(g.cached_tokens for g in a[5:]) > 0.8 * sum(
        g.prompt_tokens for g in a[5:]
    )  # later turns: only new tokens
    assert fast.stats["prompt_tokens"] == plain.stats["prompt_tokens"] and plain.stats["cached_tokens"] == 0


def test_a_lockstep_batch_matches_one_prompt_at_a_time(tiny):
    model, tok = tiny
    params = SamplingParams(temperature=0, max_new_tokens=10)
    prompts = _prompts(tok, 4)
    batched = HFBackend(model, tok, share_prefixes=False).generate(prompts, params)
    alone = [HFBackend(model, tok, share_prefixes=False).generate([p], params)[0] for p in prompts]
    _same(batched, alone)


def test_kept_sessions_are_reused_after_rows_finish_at_different_steps(tiny):
    model, tok = tiny
    be = HFBackend(model, tok)
    prompts = _prompts(tok, 3)
    lens = [3, 9, 6]  # rows leave the batch at different steps; their kept KV must still be theirs
    first = []
    for p, n in zip(prompts, lens):
        first += be.generate([p], SamplingParams(temperature=0, max_new_tokens=n), [f"k{len(first)}"])
    be2 = HFBackend(model, tok, share_prefixes=False)
    first2 = be2.generate(prompts, SamplingParams(temperature=0, max_new_tokens=9), ["k0", "k1", "k2"])
    nxt = [p + g.token_ids + tok.encode(" ok") for p, g in zip(prompts, first2)]
    reuse = be2.generate(nxt, SamplingParams(temperature=0, max_new_tokens=6), ["k0", "k1", "k2"])
    whole = HFBackend(model, tok, keep_sessions=False, share_prefixes=False).generate(
        nxt, SamplingParams(temperature=0, max_new_tokens=6)
    )
    assert [g.cached_tokens for g in reuse] == [len(p) + len(g.token_ids) - 1 for p, g in zip(prompts, first2)]
    _same(reuse, whole)


def test_kept_contexts_past_their_memory_budget_are_dropped_oldest_first_with_the_same_tokens(tiny):
    """max_kept_gib bounds the contexts kept between calls: the least recently used go first, and a session whose
    context was dropped is encoded whole again, to the same tokens."""
    model, tok = tiny
    params = SamplingParams(temperature=0, max_new_tokens=6)
    prompts = _prompts(tok, 3)
    free = HFBackend(model, tok, share_prefixes=False, max_kept_gib=None)
    first = free.generate(prompts, params, ["a", "b", "c"])
    one = max(k.kv.numel() * k.kv.element_size() for k in free._kept.values())
    tight = HFBackend(model, tok, share_prefixes=False, max_kept_gib=1.5 * one / 2**30)  # room for one context
    for p, s in zip(prompts, ["a", "b", "c"]):  # one call each: "c" is the most recent
        tight.generate([p], params, [s])
    assert list(tight._kept) == ["c"] and tight.stats["kept_dropped"] == 2
    assert tight._kept_bytes == sum(k.kv.numel() * k.kv.element_size() for k in tight._kept.values())
    nxt = [p + g.token_ids + tok.encode(" ok") for p, g in zip(prompts, first)]
    again_free = free.generate(nxt, params, ["a", "b", "c"])
    again_tight = [tight.generate([p], params, [s])[0] for p, s in zip(nxt, ["a", "b", "c"])]
    _same(again_tight, again_free)
    assert [g.cached_tokens > 0 for g in again_tight] == [False, False, False]  # "c" was dropped by "a" and "b"
    assert all(g.cached_tokens > 0 for g in again_free)
    tight.release(["c", "b", "a"])
    assert tight._kept_bytes == 0 and not tight._kept
    with pytest.raises(ValueError, match="max_kept_gib"):
        HFBackend(model, tok, max_kept_gib=0)


class _RowsSeen(HFBackend):
    """HFBackend that records how many sequences every admission into the running batch prefilled, and the running
    rows of every decode step."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.batches, self.stream_rows = [], []

    def _prefill(self, prompts, sessions):
        self.batches.append(len(prompts))
        return super()._prefill(prompts, sessions)

    def _stream_step(self, st, tok):
        self.stream_rows.append(len(st.rows))
        return super()._stream_step(st, tok)


def _budget_for_rows(be: HFBackend, rows: int, columns: int) -> float:
    """A max_kv_gib that fits ``rows`` sequences of ``columns`` cache columns (and not one more)."""
    return (rows + 0.5) * columns * be.kv_bytes_per_token() / 2**30


def test_a_memory_budget_runs_fewer_sequences_at_once_with_the_same_tokens(tiny):
    """max_kv_gib bounds how many sequences share one cache (each row takes the columns of the longest context and
    generation, and the slab's margins); greedy tokens do not depend on how the prompts were split into batches."""
    from envace.backends.base import Request
    from envace.backends.hf import _Stream

    model, tok = tiny
    params = SamplingParams(temperature=0, max_new_tokens=10)
    prompts = _prompts(tok, 6)
    columns = max(map(len, prompts)) + params.max_new_tokens + 2 * _Stream.MARGIN
    free = _RowsSeen(model, tok, max_kv_gib=None)
    tight = _RowsSeen(model, tok, max_kv_gib=_budget_for_rows(free, 2, columns))
    _same(tight.generate(prompts, params), free.generate(prompts, params))
    assert free.batches == [6] and tight.batches == [2, 2, 2]
    assert max(free.stream_rows) == 6 and max(tight.stream_rows) == 2

    out = {}
    free.stream_rows, tight.stream_rows = [], []
    for be in (free, tight):
        be.max_kv_bytes = None if be is free else _budget_for_rows(be, 2, columns) * 2**30
        got = {}
        be.generate_stream(
            [Request(p, params, tag=i) for i, p in enumerate(prompts)],
            lambda r, g, got=got: got.__setitem__(r.tag, g) or [],
            seed=0,
        )
        out[be is free] = [got[i] for i in range(len(prompts))]
    _same(out[False], out[True])
    assert max(free.stream_rows) == 6 and max(tight.stream_rows) == 2
    with pytest.raises(ValueError, match="max_kv_gib"):
        HFBackend(model, tok, max_kv_gib=0)


def test_a_prefill_budget_encodes_long_new_prompts_a_few_at_a_time_with_the_same_tokens(tiny):
    """max_prefill_gib bounds one prefill's attention scores (rows x heads x new tokens x context, float32, a few
    copies): long prompts are encoded in smaller groups, in a lockstep call and in a stream; a session's kept
    tokens do not count as new; the greedy tokens are the same."""
    from envace.backends.base import Request

    model, tok = tiny
    params = SamplingParams(temperature=0, max_new_tokens=6)
    prompts = _prompts(tok, 6)
    L, heads = max(map(len, prompts)), model.config.num_attention_heads
    two = 3 * 4 * 2.5 * heads * L * L / 2**30  # room for two such prompts' scores, not three
    free = _RowsSeen(model, tok, max_prefill_gib=None)
    tight = _RowsSeen(model, tok, max_prefill_gib=two)
    _same(tight.generate(prompts, params), free.generate(prompts, params))
    assert free.batches == [6] and tight.batches == [2, 2, 2]
    got = {}
    tight.generate_stream(
        [Request(p, params, tag=i) for i, p in enumerate(prompts)], lambda r, g: got.__setitem__(r.tag, g) or [], seed=0
    )
    _same([got[i] for i in range(6)], free.generate(prompts, params))
    assert tight.stream_rows[0] == 2  # the first step ran with the first two admitted
    kept = _RowsSeen(model, tok, max_prefill_gib=two)
    first = kept.generate(prompts, params, [f"s{i}" for i in range(6)])
    nxt = [p + g.token_ids + tok.encode(" ok") for p, g in zip(prompts, first)]
    kept.batches.clear()
    kept.generate(nxt, params, [f"s{i}" for i in range(6)])
    assert kept.batches == [6]  # only a few new tokens each: one prefill
    with pytest.raises(ValueError, match="max_prefill_gib"):
        HFBackend(model, tok, max_prefill_gib=-1)


def test_a_stream_serves_follow_ups_of_running_work_before_new_requests(tiny):
    """One row at a time: the follow-up that a finished request hands back runs before the requests still
    waiting to start, so a trajectory's kept context lives for one turn, not for the whole queue."""
    from envace.backends.base import Request

    model, tok = tiny
    be = HFBackend(model, tok, max_batch=1)
    params = SamplingParams(temperature=0, max_new_tokens=3)
    prompts = _prompts(tok, 3)
    order = []

    def on_done(req, g):
        order.append(req.tag)
        return (
            [Request(req.prompt + g.token_ids, params, session=req.session, tag=req.tag + "'")]
            if len(req.tag) == 1
            else []
        )

    be.generate_stream([Request(p, params, session=t, tag=t) for p, t in zip(prompts, "abc")], on_done, seed=0)
    assert order == ["a", "a'", "b", "b'", "c", "c'"]


@pytest.mark.parametrize("packed", [False, True], ids=["model", "packed"])
def test_a_generation_call_frees_its_kv_caches_as_it_returns_without_the_cyclic_gc(tiny, monkeypatch, packed):
    """Every prefill cache and stream slab of a call (sessions, shared prefixes, the packed decoder's cascade
    prefixes) is freed by reference counting when the call returns: a layer refers to its cache weakly. A cycle
    kept each slab until the collector's next full pass, and an experiment's dead slabs piled up until it ran out
    of memory."""
    model, tok = tiny
    made = Made(monkeypatch, backends=False)
    be = HFBackend(model, tok, packed=packed)
    with no_cyclic_gc():
        _three_turns(be, tok, SamplingParams(temperature=0, max_new_tokens=6))
        alive = made.alive()
    assert made.kinds() == {"SlabCache", "_Stream"} and be.stats["shared_prefix_tokens"] > 0
    assert alive == []
    assert len(be._kept) == 5  # what a backend keeps on purpose (the sessions' contexts) is still there


# -- update ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rows(tokenizer):
    """Rows of scripted rehearsal rollouts: 3 tasks x 4 trajectories, gold calls then a reply."""
    tasks = load_tasks("builtin", "train", n=3, seed=0)
    by_user = {t.user_turns[0]: t for t in tasks}

    def respond(prompt: str) -> str:
        if REHEARSE_SYSTEM[:40] in prompt:
            return '<observation>{"ok": true, "value": 12}</observation>'
        task = next(t for u, t in by_user.items() if u in prompt)
        gold, n = task.flat_gold(), prompt.count("<|im_start|>tool")
        return render_act([gold[n]]) if n < len(gold) else "Done."

    trajs = RolloutEngine(ScriptedBackend(tokenizer, respond), RolloutConfig(max_steps=6)).run(tasks, group_size=4)
    return [r for t in trajs for r in t.rows]


def test_micro_batches_group_packs_by_shared_prefix_cover_each_pack_once_and_keep_the_budget(rows):
    packs = pack_rows(rows)
    for budget in (1500, 4000, 8192):
        mbs = micro_batches(packs, budget)
        assert sorted(id(p) for mb in mbs for p in mb) == sorted(id(p) for p in packs)
        for mb in mbs:
            lp = shared_prefix_len(mb)
            lp = lp if lp >= MIN_SHARED_PREFIX else 0
            assert len(mb) == 1 or lp + len(mb) * (max(len(p.ids) for p in mb) - lp) <= budget
    shared = [shared_prefix_len(mb) for mb in micro_batches(packs, 8192) if len(mb) > 1]
    assert shared and min(shared) > 300  # the K packs of a task share system prompt, tools and first turn


def test_running_the_shared_prefix_once_gives_the_same_logprobs_and_gradients(tiny, rows):
    model = copy.deepcopy(tiny[0])
    packs = pack_rows(rows)

    def run(share: bool):
        model.zero_grad(set_to_none=True)
        lps = {}
        for mb in micro_batches(packs, 8192, share_prefixes=share):
            lp = completion_logprobs(model, mb, rows, TEMPS, share_prefix=share)
            sum((v * (1 + (i % 3))).sum() for i, v in lp.items()).backward()
            lps |= {i: v.detach() for i, v in lp.items()}
        return lps, {n: p.grad.clone() for n, p in model.named_parameters()}

    (a, ga), (b, gb) = run(False), run(True)
    assert set(a) == set(b) == set(range(len(rows)))
    for i in a:
        assert_logprobs_close(b[i], a[i], what=f"log-probs of row {i}")
    assert_all_close_rel(gb, ga, what="gradient of ")

    # the comparison catches a real mismatch: the shared prefix's keys/values without their gradient path (the
    # log-probs stay the same; only the gradients of the prefix's positions are lost) ...
    from envace.training import update

    def detached_prefix_hidden(trunk, ids, lp):  # update._shared_prefix_hidden with a .detach() added
        from transformers import DynamicCache

        P, S = ids.shape
        pre = trunk(input_ids=ids[:1, :lp], use_cache=True).past_key_values
        kv = [
            (layer.keys.detach().expand(P, -1, -1, -1), layer.values.detach().expand(P, -1, -1, -1))
            for layer in pre.layers
        ]
        pos = torch.arange(lp, S)[None].expand(P, -1)
        return trunk(
            input_ids=ids[:, lp:], position_ids=pos, past_key_values=DynamicCache(kv), use_cache=True
        ).last_hidden_state

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(update, "_shared_prefix_hidden", detached_prefix_hidden)
        c, gc = run(True)
    for i in a:
        assert_logprobs_close(c[i], a[i])
    with pytest.raises(AssertionError, match="gradient of"):
        assert_all_close_rel(gc, ga, what="gradient of ")
    # ... and a gradient 0.1% off in one parameter, or in one element (0.1% of the parameter's largest)
    name = "model.layers.1.mlp.down_proj.weight"
    with pytest.raises(AssertionError, match=name):
        assert_all_close_rel({**gb, name: gb[name] * 1.001}, ga, what="gradient of ")
    one = gb[name].clone()
    one.view(-1)[5] += 1e-3 * one.abs().max()
    with pytest.raises(AssertionError):
        assert_close_rel(one, ga[name])


def _step_update(model, rows, share: bool = True) -> dict[str, torch.Tensor]:
    """The update one optimizer_step (SGD, lr 1, a clipped surrogate with fixed advantages) makes to ``model``."""
    from envace.math import algos

    adv = torch.linspace(-1, 1, len(rows))

    def loss_fn(logp, mask, idxs, normalizer):
        return algos.policy_loss(logp, logp.detach() + 0.01, adv[idxs], mask, normalizer=normalizer)

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer_step(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        rows,
        loss_fn,
        agg="token_mean",
        micro_batch_tokens=4000,
        temperatures=TEMPS,
        max_grad_norm=1e9,
        share_prefixes=share,
    )
    return {n: p.detach() - before[n] for n, p in model.named_parameters()}


def test_optimizer_step_is_the_same_with_and_without_prefix_sharing(tiny, rows):
    deltas = [_step_update(copy.deepcopy(tiny[0]), rows, share) for share in (False, True)]
    assert all(bool(d.abs().max() > 0) for d in deltas[0].values())
    assert_all_close_rel(deltas[1], deltas[0], what="update of ")  # the step itself, not the (much larger) weights


def test_a_stream_matches_generate_when_requests_join_and_leave_mid_batch(tiny, monkeypatch):
    """Continuous batching is exact: rows of different lengths leave, follow-ups (continuing their session) join
    mid-batch, the slab is rebuilt (a tiny margin forces it often), yet tokens and log-probs equal plain
    one-prompt-at-a-time generation."""
    from envace.backends import hf
    from envace.backends.base import Request

    monkeypatch.setattr(hf._Stream, "MARGIN", 2)
    model, tok = tiny
    prompts = _prompts(tok, 4)
    lens = [3, 11, 6, 8]
    follow = " tool result"

    got: dict[tuple[int, int], object] = {}

    def on_done(req, g):
        i, turn = req.tag
        got[(i, turn)] = g
        if turn < 2:
            return [
                Request(
                    req.prompt + g.token_ids + tok.encode(follow),
                    SamplingParams(temperature=0, max_new_tokens=lens[(i + turn + 1) % 4]),
                    session=f"s{i}",
                    tag=(i, turn + 1),
                )
            ]
        return []

    be = HFBackend(model, tok)
    be.generate_stream(
        [
            Request(p, SamplingParams(temperature=0, max_new_tokens=n), session=f"s{i}", tag=(i, 0))
            for i, (p, n) in enumerate(zip(prompts, lens))
        ],
        on_done,
        seed=0,
    )
    plain = HFBackend(model, tok, keep_sessions=False, share_prefixes=False)
    for i, p in enumerate(prompts):
        kept = 0
        for turn in range(3):
            want = plain.generate([p], SamplingParams(temperature=0, max_new_tokens=lens[(i + turn) % 4]))
            _same([got[(i, turn)]], want)
            assert turn == 0 or got[(i, turn)].cached_tokens == kept  # the session's context was not encoded again
            kept = len(p) + len(want[0].token_ids) - 1  # prompt + completion, minus its last token (never fed)
            p = p + want[0].token_ids + tok.encode(follow)
    assert be.stats["forward_calls"] < plain.stats["forward_calls"]


def test_inverse_cdf_draws_follow_the_distribution_and_never_pick_zero_mass_tokens():
    from envace.backends.hf import draw

    gen = torch.Generator().manual_seed(0)
    probs = torch.tensor([[0.0, 0.2, 0.0, 0.5, 0.3, 0.0]]).repeat(40_000, 1)
    freq = torch.bincount(draw(probs, gen), minlength=6).float() / 40_000
    assert freq[[0, 2, 5]].sum() == 0
    assert torch.allclose(freq, probs[0], atol=0.01)
    unnormalised = torch.tensor([[0.0, 2.0, 6.0]]).repeat(20_000, 1)  # rows need not sum to 1
    assert abs((draw(unnormalised, gen) == 2).float().mean().item() - 0.75) < 0.015
    assert (draw(probs, torch.Generator().manual_seed(5)) == draw(probs, torch.Generator().manual_seed(5))).all()


def test_rows_with_different_settings_are_each_sampled_under_their_own():
    """sample_grouped (a stream's rows of several requests): each row is sampled under its own settings, a group
    exactly as sample_next samples those rows alone, groups drawing in order of their first row."""
    from envace.backends.sampling import sample_grouped, sample_next

    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    greedy, hot, warm = (
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=0.5, top_p=0.9),
    )
    params = [hot, greedy, warm, greedy, hot]
    tok, lp = sample_grouped(logits, params, [p.sampling_key() for p in params], torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(3)
    for rows, p in (([0, 4], hot), ([1, 3], greedy), ([2], warm)):
        want, want_lp = sample_next(logits[rows], p, gen)
        assert tok[rows].tolist() == want.tolist() and torch.equal(lp[rows], want_lp)
    assert tok[[1, 3]].tolist() == logits[[1, 3]].argmax(-1).tolist()
    assert (
        logits[[0, 4]].topk(5, -1).values[:, -1] <= logits[[0, 4]].gather(-1, tok[[0, 4], None]).squeeze(-1)
    ).all()  # within top-5


def _saved_bytes_and_update(model, rows, share: bool = True) -> tuple[int, dict[str, torch.Tensor]]:
    """Bytes of the decoder layers' tensors autograd keeps for the backward pass during one optimizer_step (the
    LM head's (tokens, vocabulary) logits left out: they are the same either way), and the step's update."""
    saved, vocab = [0], model.config.vocab_size

    def pack(t):
        if t.shape[-1:] != (vocab,):
            saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        delta = _step_update(model, rows, share)
    return saved[0], delta


def test_gradient_checkpointing_keeps_fewer_activations_and_gives_the_same_update(tiny, rows, monkeypatch):
    from envace.training import update

    plain_bytes, plain = _saved_bytes_and_update(copy.deepcopy(tiny[0]), rows, share=False)
    model = copy.deepcopy(tiny[0])
    enable_gradient_checkpointing(model)
    calls = []
    monkeypatch.setattr(update, "_shared_prefix_hidden", lambda *a: calls.append(a))  # needs a KV cache: not used
    ckpt_bytes, ckpt = _saved_bytes_and_update(model, rows, share=True)
    assert not calls
    assert ckpt_bytes < 0.25 * plain_bytes, (ckpt_bytes, plain_bytes)  # the tiny model: ~0.1 (each layer's input)
    assert all(bool(d.abs().max() > 0) for d in plain.values())
    assert_all_close_rel(ckpt, plain, what="update of ")


def test_load_trainable_turns_gradient_checkpointing_on_only_when_asked():
    from envace.backends.models import load_trainable

    assert not load_trainable("tiny-random")[0].is_gradient_checkpointing
    model, _ = load_trainable("tiny-random", gradient_checkpointing=True)
    assert model.is_gradient_checkpointing and not model.training  # rollouts (eval mode) keep their KV cache
    lora, _ = load_trainable("tiny-random", lora_r=4, gradient_checkpointing=True)
    assert lora.is_gradient_checkpointing
