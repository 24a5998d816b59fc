"""The packed decode step (envace.backends.fastdecode) computes the model's own next-token logits: exactly (up to
kernel rounding) in float32, with bf16 autocast's error in bf16; the backend's bf16 decoding through it
is consistent between continuous batching and lockstep generate, and follows weight changes."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from envace.backends.base import Request, SamplingParams
from envace.backends.fastdecode import LlamaDecoder, decoder_for
from envace.backends.hf import HFBackend, _Stream
from numerics import assert_close_rel, assert_logprobs_close


def _tiny(cls, cfg_cls, **over):
    torch.manual_seed(1)
    cfg = cfg_cls(
        vocab_size=49152,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        **over,
    )
    return cls(cfg).eval()


@pytest.fixture(scope="module")
def llama_with_biases():
    m = _tiny(LlamaForCausalLM, LlamaConfig, attention_bias=True, mlp_bias=True)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.05)  # zero-initialised biases would not test that they are applied
    return m


def _window(model, tok, n_rows: int = 5):
    """A stream slab holding ``n_rows`` prompts of different lengths (rows right-aligned, holes on the left) and
    the inputs of the next decode step: (stream, tokens, attention mask, positions)."""
    be = HFBackend(model, tok, share_prefixes=False)
    prompts = [
        tok.encode("You are a tool-using agent. " * (1 + i) + f"Request {i}: transfer {10 * i} dollars.")
        for i in range(n_rows)
    ]
    reqs = [Request(p, SamplingParams(max_new_tokens=4)) for p in prompts]
    st = _Stream(be._n_layers(), be.device, torch.float32)
    with torch.no_grad():
        cache, attn, width, L, logits = be._prefill(prompts, [None] * n_rows)
        st.admit(reqs, cache, attn, width, L)
    ids, am, pos = st.step_inputs(logits.argmax(-1))
    return be, st, ids, am, pos


def _reference(be, st, ids, am, pos):
    """The model's own forward over a copy of the slab."""
    data = st.data.clone()
    with torch.no_grad():
        out = be._forward(ids, am, pos, st.cache)
    st.data.copy_(data)
    return out


@pytest.mark.parametrize("which", ["tiny", "biases"])
def test_the_packed_decoder_computes_the_models_own_logits_in_float32(tiny, llama_with_biases, which):
    model, tok = (tiny[0], tiny[1]) if which == "tiny" else (llama_with_biases, tiny[1])
    be, st, ids, am, pos = _window(model, tok)
    ref = _reference(be, st, ids, am, pos)
    dec = decoder_for(model, torch.float32)
    dec.refresh()
    kv = st.data.clone()
    got = dec.step(ids[:, 0], pos[:, 0], kv, st.lo, st.col, am)
    assert_close_rel(got, ref, what="decoder logits")
    # it wrote the fed tokens' keys/values where the model does
    ref_kv = st.data.clone()
    with torch.no_grad():
        be._forward(ids, am, pos, st.cache)
    assert_close_rel(kv[..., st.col, :], st.data[..., st.col, :], what="written keys/values")
    assert not torch.equal(ref_kv[..., st.col, :], st.data[..., st.col, :])  # (the column was empty before)


def test_bf16_decoding_errs_from_float32_like_bf16_autocast(tiny):
    model, tok = tiny
    be, st, ids, am, pos = _window(model, tok)
    ref = torch.log_softmax(_reference(be, st, ids, am, pos), -1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        auto = torch.log_softmax(_reference(be, st, ids, am, pos).float(), -1)
    dec = decoder_for(model, torch.bfloat16)
    dec.refresh()
    got = torch.log_softmax(dec.step(ids[:, 0], pos[:, 0], st.data.clone(), st.lo, st.col, am), -1)
    top = ref.topk(20, dim=-1).indices  # the tokens that get sampled
    err, err_auto = ((x - ref).gather(-1, top).abs().mean().item() for x in (got, auto))
    assert 0 < err <= 1.5 * err_auto, (err, err_auto)
    assert dec.head.dtype == torch.bfloat16 and all(L.qkv.dtype == torch.bfloat16 for L in dec.layers)


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=0, max_new_tokens=8), SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=8)],
    ids=["greedy", "sampled"],
)
def test_bf16_backend_decodes_through_the_packed_weights_alike_in_stream_and_lockstep(tiny, params):
    model, tok = tiny
    be = HFBackend(model, tok, bf16=True)
    assert isinstance(be._decoder, LlamaDecoder)
    prompts = [tok.encode(f"Request {i}: " + "please help " * (i + 1)) for i in range(4)]
    lock = be.generate(prompts, params.with_(seed=3))
    got = {}
    HFBackend(model, tok, bf16=True).generate_stream(
        [Request(p, params.with_(seed=3), tag=i) for i, p in enumerate(prompts)],
        lambda r, g: got.__setitem__(r.tag, g) or [],
        seed=3,
    )
    if params.temperature == 0:  # sampled streams draw in another order; greedy ones must agree token for token
        for i, g in enumerate(lock):
            assert got[i].token_ids == g.token_ids
            # bf16 on both sides, the same packed weights: float32 accumulation order, plus where it tips a bf16
            # rounding the other way a bf16-sized step in one activation (hence 10x the float32 bound)
            assert_logprobs_close(got[i].logprobs, g.logprobs, rel=1e-4, elem=1e-4)
    plain = HFBackend(model, tok, bf16=True, packed=False)  # bf16 autocast through the model
    assert plain._decoder is None
    ref = plain.generate(prompts, params.with_(seed=3))
    assert [len(g.token_ids) for g in ref] and all(g.finish_reason for g in lock)


def test_the_decoder_repacks_when_the_weights_change_in_place(tiny):
    model, tok = tiny
    model = copy.deepcopy(model)
    be = HFBackend(model, tok, bf16=True)
    prompt = [tok.encode("Transfer 20 dollars to Bob, then check the balance.")]
    params = SamplingParams(temperature=0, max_new_tokens=6)
    before = be.generate(prompt, params)[0]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    out = model(input_ids=torch.tensor(prompt)).logits
    (-out[0, -1, before.token_ids[0]]).backward()  # make the first token less likely, in place
    opt.step()
    after = be.generate(prompt, params)[0]
    fresh = HFBackend(model, tok, bf16=True).generate(prompt, params)[0]
    assert after.token_ids == fresh.token_ids and after.logprobs == pytest.approx(fresh.logprobs, abs=1e-5)
    assert after.logprobs[0] != pytest.approx(before.logprobs[0], abs=1e-3)


def test_models_that_are_not_plain_llama_decode_through_the_model():
    tok_model = _tiny(Qwen2ForCausalLM, Qwen2Config)
    assert decoder_for(tok_model, torch.bfloat16) is None
    from envace.backends.models import load_tokenizer

    be = HFBackend(tok_model, load_tokenizer("tiny-random"), bf16=True)
    assert be._decoder is None
    assert len(be.generate([[1, 2, 3]], SamplingParams(temperature=0, max_new_tokens=3))[0].token_ids) == 3


def _mostly_same(a, b) -> None:
    """Sampled generations from equal seeds: identical unless a draw lands within rounding of a token boundary
    of the inverse CDF (the tiny random model is near-uniform over 49k tokens); where identical, equal log-probs."""
    same = [x.token_ids == y.token_ids for x, y in zip(a, b)]
    assert sum(same) >= 0.75 * len(same), same
    for x, y, s in zip(a, b, same):
        if s:
            assert_logprobs_close(x.logprobs, y.logprobs)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_new_tokens=10),
        SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=10, stop=["."]),
    ],
    ids=["greedy", "sampled"],
)
def test_packed_float32_generation_equals_the_models_own(tiny, params):
    """Every forward of the backend through the decoder (prompt prefill with kept sessions and shared prefixes,
    lockstep decoding and continuous batching): same tokens, log-probs equal up to float32 rounding (sampled: see
    _mostly_same)."""
    from test_perf_equivalence import _same, _three_turns

    check = _same if params.temperature == 0 else _mostly_same
    model, tok = tiny
    packed = HFBackend(model, tok, packed=True)
    assert packed._decoder is not None and packed._decoder.dtype == torch.float32
    check(_three_turns(packed, tok, params), _three_turns(HFBackend(model, tok), tok, params))
    assert packed.stats["cached_tokens"] > 0 and packed.stats["shared_prefix_tokens"] > 0
    got: dict = {}
    prompts = [tok.encode(f"Request {i}: " + "please help " * (i + 1)) for i in range(4)]
    reqs = [Request(p, params.with_(max_new_tokens=3 + 2 * i), tag=i) for i, p in enumerate(prompts)]
    for be in (HFBackend(model, tok, packed=True), HFBackend(model, tok)):
        be.generate_stream(reqs, lambda r, g, be=be: got.setdefault(be, {}).__setitem__(r.tag, g) or [], seed=5)
    a, b = got.values()
    check([a[i] for i in range(4)], [b[i] for i in range(4)])


def test_cascade_attention_over_shared_prefixes_changes_nothing_but_the_work(tiny, monkeypatch):
    """Rows that start with the same long prompt prefix attend to one copy of it, merged with their own columns by
    log-sum-exp: greedy streams (requests joining and leaving, follow-ups continuing their sessions, slab rebuilds)
    give the tokens of the model's own forward and its log-probs up to float32 rounding."""
    from envace.backends import hf

    monkeypatch.setattr(hf._Stream, "MARGIN", 2)
    used = []
    shared_inputs = hf._Stream.shared_inputs
    monkeypatch.setattr(hf._Stream, "shared_inputs", lambda st: used.append(shared_inputs(st)) or used[-1])
    model, tok = tiny
    systems = [
        "You are a careful banking assistant. Use the tools when needed and confirm every transfer. " * 5,
        "You manage files in a sandbox; list before you delete and answer briefly. " * 5,
    ]
    prompts = [
        tok.apply_chat_template(
            [{"role": "system", "content": systems[i % 2]}, {"role": "user", "content": f"task {i}: " + "go " * i}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(6)
    ]
    lens = [3, 9, 5, 12, 7, 4]

    def run(be):
        got = {}

        def on_done(req, g):
            i, turn = req.tag
            got[(i, turn)] = g
            if turn < 2:
                return [
                    Request(
                        req.prompt + g.token_ids + tok.encode(" result"),
                        SamplingParams(temperature=0, max_new_tokens=lens[(i + turn + 1) % 6]),
                        session=f"s{i}",
                        tag=(i, turn + 1),
                    )
                ]
            return []

        be.generate_stream(
            [
                Request(p, SamplingParams(temperature=0, max_new_tokens=n), session=f"s{i}", tag=(i, 0))
                for i, (p, n) in enumerate(zip(prompts, lens))
            ],
            on_done,
            seed=0,
        )
        return [got[k] for k in sorted(got)]

    from test_perf_equivalence import _same

    cascade = run(HFBackend(model, tok, packed=True))
    assert any(sp is not None and sp.n >= 2 for sp in used)  # rows really shared a prefix slot
    n_used = len(used)
    _same(cascade, run(HFBackend(model, tok, packed=True, cascade=False)))
    assert len(used) == n_used  # (off: not consulted)
    _same(cascade, run(HFBackend(model, tok)))
