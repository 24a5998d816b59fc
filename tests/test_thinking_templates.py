"""Thinking models whose chat template is not append-only: Qwen3's drops the ``<think>`` block of every assistant turn
before the last user message, so a context grown by appending is not the template's rendering of the chat.

``RolloutConfig.thinking_history``: ``strip`` (the default for such a template) makes each Act turn's prompt the
template's rendering of the chat so far, its completion the exact sampled ids; ``keep`` grows the context by
appending, thinking kept. Checked end to end with a tokenizer built here (the tiny model's vocabulary and a
Qwen3-like template that drops earlier thinking and honours ``enable_thinking``): scripted rollouts in both modes,
an HF rollout whose kept KV is reused only as far as the rewritten prompt agrees with it (the same tokens as
without any reuse), an SFT step and a GRPO step on its rows, the SFT and training configs, and the server."""

import copy
import dataclasses
import math

import pytest
import torch

from envace.backends.base import SamplingParams
from envace.backends.hf import HFBackend
from envace.backends.models import make_optimizer
from envace.backends.scripted import ScriptedBackend
from envace.chat.openai_api import act_messages
from envace.chat.parsing import tool_format_for
from envace.chat.prompts import ChatFormat, earlier_answer, with_thinking_history
from envace.config import ServeConfig, SFTConfig, load_config
from envace.core.registry import UnknownNameError
from envace.core.types import Message
from envace.envs import load_tasks
from envace.math import algos
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.serving.serve import EnvaceServer, ServerConfig
from envace.training import sft as sft_module
from envace.training.sft import gold_trajectories
from envace.training.trainer import rows_with_advantages
from envace.training.update import optimizer_step
from numerics import assert_logprobs_close

QWEN3_THINKING_TEMPLATE = """{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content %}
    {%- if message.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}
        {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
    {%- endif %}
    {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}"""  # noqa: E501
"""Qwen3's thinking rules on ChatML turns: an assistant turn before the last user message is written without its
thinking (the text after ``</think>``, leading newlines dropped, as Qwen3's template does); ``enable_thinking``
False opens the generation with an empty ``<think>`` block."""


@pytest.fixture(scope="module")
def qwen3_tok(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template, tok.name_or_path = QWEN3_THINKING_TEMPLATE, "test/qwen3-thinking"
    return tok


def template_text(tok, messages, thinking=None, generation=True):
    """The template's own rendering of ``messages`` (Message or dicts)."""
    chat = [{"role": m.role, "content": m.content} if isinstance(m, Message) else m for m in messages]
    kw = {} if thinking is None else {"enable_thinking": thinking}
    return tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation, **kw)


def template_ids(tok, messages, thinking=None, generation=True):
    return tok.encode(template_text(tok, messages, thinking, generation), add_special_tokens=False)


def _multi_turn_task():
    return next(t for t in load_tasks("bank", "train", n=20) if len(t.user_turns) >= 3 and t.flat_gold())


def _histories(traj, opened):
    """The chat before each Act step, its assistant turns as sampled (the generation prompt's opening, the text)."""
    out, chat, k = [], [], 0
    for m in traj.messages:
        if m.role == "assistant":
            out.append(list(chat))
            chat.append(Message("assistant", opened + traj.steps[k].action_text))
            k += 1
        else:
            chat.append(m)
    return out


def _thinking_policy(task, tools, think):
    """Act: a thought (``think``), then the next gold call after a user message, a reply after a tool result;
    Rehearse: a fixed observation."""
    gold = task.flat_gold()

    def respond(prompt):
        if "tool simulator" in prompt:
            return '<observation>{"ok": true}</observation>'
        step = prompt.count("<|im_start|>assistant") - 1
        thought = f"<think>\nPLAN-{step}\n</think>\n\n" if think else ""
        last = prompt.rsplit("<|im_start|>", 2)[-2]  # the message before the generation prompt
        n = prompt.count("<|im_start|>tool")
        if last.startswith("user") and n < len(gold):
            return thought + tools.render([gold[n]])
        return thought + "Done."

    return respond


class Recording(ScriptedBackend):
    """A scripted backend that keeps every generation's token ids."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.generated = []

    def generate(self, prompts, params, sessions=None):
        gens = super().generate(prompts, params, sessions)
        self.generated += [(s, list(g.token_ids)) for s, g in zip(sessions or [None] * len(gens), gens)]
        return gens


def _scripted_rollout(tok, history, chat_format=None, thinking=None):
    task = _multi_turn_task()
    be = Recording(tok, _thinking_policy(task, tool_format_for(tok), think=thinking is None))
    cfg = RolloutConfig(max_steps=12, chat_format=chat_format, thinking=thinking, thinking_history=history)
    engine = RolloutEngine(be, cfg)
    (traj,) = engine.run([task], group_size=1)
    acts = [r for r in traj.rows if r.role == "act"]
    assert sum(m.role == "user" for m in traj.messages) >= 3 and len(acts) == len(traj.steps) >= 6
    assert [r.completion_ids for r in acts] == [ids for s, ids in be.generated if s.endswith("/act")]
    return engine, traj, acts


# ----------------------------------------------------------------------------------------- which mode


def test_a_template_that_drops_earlier_thinking_is_detected_and_its_rendering_is_the_default(tokenizer, qwen3_tok):
    for name in ("chatml", "template"):
        for thinking in (None, False):
            fmt = ChatFormat.for_tokenizer(qwen3_tok, name, thinking)
            assert fmt.drops_thinking and fmt.thinking_history() == "strip", (name, thinking)
    assert not ChatFormat.for_tokenizer(tokenizer).drops_thinking  # SmolLM2's template keeps it
    policy = lambda tok: ScriptedBackend(tok, lambda prompt: "Done.")  # noqa: E731
    assert RolloutEngine(policy(qwen3_tok), RolloutConfig()).thinking_history == "strip"
    assert RolloutEngine(policy(tokenizer), RolloutConfig()).thinking_history == "keep"
    assert RolloutEngine(policy(qwen3_tok), RolloutConfig(thinking_history="keep")).thinking_history == "keep"
    for make in (
        RolloutConfig,
        ServeConfig,
        lambda **kw: load_config(SFTConfig, values={"rollout." + k: v for k, v in kw.items()}),
    ):
        with pytest.raises(UnknownNameError, match="unknown thinking history 'drop'; valid names: keep, strip"):
            make(thinking_history="drop")


def test_an_earlier_answer_is_what_the_template_writes():
    assert earlier_answer("<think>\na\n</think>\n\nIt is 4.") == "It is 4."
    assert earlier_answer("opened by the prompt</think>\nIt is 4.") == "It is 4."
    assert earlier_answer("no thinking\n") == "no thinking\n"
    chat = [
        Message("user", "q1"),
        Message("assistant", "<think>a</think>A"),
        Message("user", "q2"),
        Message("assistant", "<think>b</think>B"),
    ]
    assert [m.content for m in with_thinking_history(chat, "strip")] == ["q1", "A", "q2", "<think>b</think>B"]
    assert with_thinking_history(chat, "keep") == chat


# ----------------------------------------------------------------------------------------- rollouts


@pytest.mark.parametrize("chat_format", ["chatml", "template"])
@pytest.mark.parametrize("thinking", [None, False])
def test_strip_makes_every_act_prompt_the_templates_rendering_of_the_chat_so_far(qwen3_tok, chat_format, thinking):
    """Every prompt is the template's text of the chat so far; a user turn's first prompt (every assistant turn
    before it rewritten) is its tokenization too. Later prompts of a turn keep that turn's completions as sampled
    (a tokenizer may split a completion's start unlike the template's text: the notice of derive_template_format)."""
    engine, traj, acts = _scripted_rollout(qwen3_tok, "strip", chat_format, thinking)
    histories = _histories(traj, engine.fmt.opened)
    user_steps = [k for k, c in enumerate(histories) if c[-1].role == "user"]
    for k, (row, chat) in enumerate(zip(acts, histories)):
        assert qwen3_tok.decode(row.prompt_ids) == template_text(qwen3_tok, chat, thinking), f"step {k}"
        if k in user_steps:
            assert row.prompt_ids == template_ids(qwen3_tok, chat, thinking), f"step {k}"
    last = qwen3_tok.decode(acts[-1].prompt_ids)
    if thinking is None:  # the thoughts before the last user message are gone, the ones after it are kept
        assert all((f"PLAN-{k}" in last) == (k >= user_steps[-1]) for k in range(len(acts) - 1))
    else:
        assert last.count("<think>") == len(acts) - user_steps[-1]  # the empty blocks of the last user turn
    breaks = [k for k in range(1, len(acts)) if not _extends(acts[k], acts[k - 1])]
    assert breaks == user_steps[1:]  # a user turn's first prompt starts a new chain; within a turn it grows


def _extends(row, prev):
    ctx = prev.prompt_ids + prev.completion_ids
    return row.prompt_ids[: len(ctx)] == ctx


@pytest.mark.parametrize("thinking", [None, False])
def test_keep_grows_acts_context_by_appending_with_its_thinking(qwen3_tok, thinking):
    engine, traj, acts = _scripted_rollout(qwen3_tok, "keep", "chatml", thinking)
    assert all(_extends(acts[k], acts[k - 1]) for k in range(1, len(acts)))
    last = qwen3_tok.decode(acts[-1].prompt_ids)
    assert ("PLAN-0" in last) if thinking is None else (last.count("<think>\n\n</think>") == len(acts))
    histories = _histories(traj, engine.fmt.opened)
    differ = [qwen3_tok.decode(r.prompt_ids) != template_text(qwen3_tok, c, thinking) for r, c in zip(acts, histories)]
    user_steps = [k for k, c in enumerate(histories) if c[-1].role == "user"]
    assert not any(differ[: user_steps[1]]) and all(differ[user_steps[1] :])  # the template drops it from there on


# ----------------------------------------------------------------------------------------- an HF rollout and training


def _hf_rollout(model, tok, **backend):
    task = _multi_turn_task()
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    cfg = RolloutConfig(max_steps=4, thinking=False, act=greedy, rehearse=greedy, schedule="lockstep")
    be = HFBackend(model, tok, **backend)
    seen = []  # (session, prompt, generation) of every call, in order
    generate = be.generate

    def recording(prompts, params, sessions=None):
        gens = generate(prompts, params, sessions)
        seen.extend(zip(sessions, prompts, gens))
        return gens

    be.generate = recording
    engine = RolloutEngine(be, cfg, mode="real")
    assert engine.thinking_history == "strip"
    return engine.run([task], group_size=2), seen


@pytest.fixture(scope="module")
def stripped_hf_rollout(tiny, qwen3_tok):
    """A greedy HF rollout with thinking off (every Act turn opens an empty ``<think>`` block, which ``strip`` drops
    at the next user message), with and without kept / shared KV: (trajectories, prompts and generations) of each."""
    model, _ = tiny
    return _hf_rollout(model, qwen3_tok), _hf_rollout(model, qwen3_tok, keep_sessions=False, share_prefixes=False)


def test_a_rewritten_act_context_reuses_kept_kv_only_where_it_agrees_and_generates_the_same_tokens(
    stripped_hf_rollout, qwen3_tok
):
    (trajs, seen), (fresh_trajs, fresh_seen) = stripped_hf_rollout
    rows = [(r.role, r.prompt_ids, r.completion_ids) for t in trajs for r in t.rows]
    assert rows == [(r.role, r.prompt_ids, r.completion_ids) for t in fresh_trajs for r in t.rows]
    assert [g.token_ids for _, _, g in seen] == [g.token_ids for _, _, g in fresh_seen]
    for k, ((_, _, g), (_, _, f)) in enumerate(zip(seen, fresh_seen)):
        assert_logprobs_close(g.logprobs, f.logprobs, what=f"log-probs of generation {k}")
    assert all(g.cached_tokens == 0 for _, _, g in fresh_seen)
    rewritten = 0
    for session in {s for s, _, _ in seen if s.endswith("/act")}:
        calls = [(p, g) for s, p, g in seen if s == session]
        for (prev, pg), (prompt, g) in zip(calls, calls[1:]):
            kept = prev + pg.token_ids[:-1]  # what the backend kept of the session
            if prompt[: len(kept)] == kept:
                assert g.cached_tokens == len(kept)
                continue
            rewritten += 1
            agree = next(i for i, (a, b) in enumerate(zip(kept, prompt)) if a != b)
            assert 0 < g.cached_tokens == agree < len(kept)  # the kept KV up to the rewritten turn, no further
            assert "<think>" not in qwen3_tok.decode(prompt[agree:]).split("<|im_start|>user")[0]
    assert rewritten >= 2


def test_an_sft_step_and_a_grpo_step_run_on_stripped_rows(stripped_hf_rollout, tiny):
    (trajs, seen), _ = stripped_hf_rollout
    acts = [r for t in trajs for r in t.rows if r.role == "act"]
    sampled = [list(g.token_ids) for _, _, g in seen]
    assert all(r.completion_ids in sampled for r in acts) and any(
        not _extends(b, a) for a, b in zip(acts, acts[1:]) if a.traj_id == b.traj_id
    )
    for t, reward in zip(trajs, (1.0, 0.0)):
        t.reward = reward
    rows, adv, _ = rows_with_advantages(trajs, "rolewise", ("act",))
    assert len(rows) == len(acts) and torch.all(adv.abs() > 0)  # role-wise advantages as for any rows
    model = copy.deepcopy(tiny[0])
    opt = make_optimizer(model, 1e-3, 0.0)
    step = dict(agg="token_mean", micro_batch_tokens=4096, temperatures={}, max_grad_norm=1.0)

    def sft_loss(logp, mask, idxs, normalizer):
        return algos.sft_loss(logp, mask, "token_mean", normalizer)

    def grpo_loss(logp, mask, idxs, normalizer):
        old = torch.nn.utils.rnn.pad_sequence([torch.tensor(rows[i].old_logprobs) for i in idxs], batch_first=True)
        return algos.policy_loss(logp, old, adv[idxs], mask, clip_eps=0.2, agg="token_mean", normalizer=normalizer)

    before = [p.detach().clone() for p in model.parameters()]
    for loss_fn in (sft_loss, grpo_loss):
        m = optimizer_step(model, opt, rows, loss_fn, **step)
        assert m["micro_batches"] > 0 and math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0, m
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


# ----------------------------------------------------------------------------------------- SFT data and serving


def test_sft_gold_chats_follow_the_thinking_history(qwen3_tok, tiny, tmp_path, monkeypatch):
    task = _multi_turn_task()
    fmt = ChatFormat.for_tokenizer(qwen3_tok, None, False)
    by_mode = {}
    for mode in ("strip", "keep"):
        (t,) = gold_trajectories(qwen3_tok, [task], thinking=False, thinking_history=mode)
        by_mode[mode] = acts = [r for r in t.rows if r.role == "act"]
        texts = [qwen3_tok.decode(r.prompt_ids) for r in acts]
        same = [x == template_text(qwen3_tok, c, False) for x, c in zip(texts, _histories(t, fmt.opened))]
        assert all(same) if mode == "strip" else not all(same)
    assert [r.completion_ids for r in by_mode["strip"]] == [r.completion_ids for r in by_mode["keep"]]

    folder = tmp_path / "qwen3-thinking"  # the SFT command's own path, with SFTConfig.rollout.thinking_history
    tiny[0].save_pretrained(folder)
    qwen3_tok.save_pretrained(folder)
    asked = []
    monkeypatch.setattr(
        sft_module, "gold_trajectories", lambda *a, **kw: asked.append(kw) or gold_trajectories(*a, **kw)
    )
    cfg = SFTConfig(
        model=str(folder),
        suite="bank",
        n_tasks=2,
        steps=1,
        batch_tasks=2,
        rollout=dataclasses.replace(SFTConfig().rollout, thinking=False, thinking_history="keep"),
        out_dir=str(tmp_path / "sft"),
        report_to=(),
        progress=False,
    )
    res = sft_module.sft(cfg)
    assert [kw["thinking_history"] for kw in asked] == ["keep"] and res.metrics[-1]["sft/grad_norm"] > 0


def test_the_server_renders_a_history_with_thinking_as_the_template_does(qwen3_tok):
    messages = [
        {"role": "system", "content": "You are a bank assistant."},
        {"role": "user", "content": "How much is in main?"},
        {"role": "assistant", "content": "<think>\nAsk the bank.\n</think>\n\nLet me look."},
        {"role": "user", "content": "And in savings?"},
        {"role": "assistant", "content": "<think>\nStill thinking.\n</think>\n\nOne moment."},
        {"role": "user", "content": "Well?"},
        {"role": "assistant", "content": "<think>\nNow the answer.\n</think>\n\nIt is 12.5."},
    ]
    body = {"model": "m", "messages": messages}
    prompts = {}
    for mode in (None, "keep"):
        server = EnvaceServer(
            ScriptedBackend(qwen3_tok, lambda prompt: "Done."), ServerConfig(model_name="m", thinking_history=mode)
        )
        try:
            (prompts[mode],) = server.parse_chat(body).prompts
        finally:
            server.close()
    assert prompts[None] == template_ids(qwen3_tok, messages)
    text = qwen3_tok.decode(prompts[None])
    assert "Ask the bank" not in text and "Still thinking" not in text and "Now the answer" in text
    fmt = ChatFormat.for_tokenizer(qwen3_tok)
    assert prompts["keep"] == fmt.render(act_messages(messages, [])) and "Ask the bank" in qwen3_tok.decode(
        prompts["keep"]
    )
