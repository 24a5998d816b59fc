"""Rollout modes: role-tagged rows, what each role sees, the rehearsal firewall, limits and counters."""

import copy
import dataclasses
import json

import pytest

from envace.chat.parsing import render_act
from envace.backends.base import SamplingParams
from envace.backends.hf import HFBackend
from envace.backends.scripted import ScriptedBackend
from envace.envs import ENVS, load_tasks, make_env
from envace.envs.references import initial_state_key, record_each
from envace.chat.prompts import REHEARSE_SYSTEM
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.core.types import ToolCall, Trajectory, read_jsonl, write_jsonl
from numerics import assert_logprobs_close

REAL_CALLS = []


def _probe_factory(task):
    """A bank environment whose every executed call is recorded (to prove rehearsal never touches it)."""
    env = ENVS.get("bank")(task)
    inner = env._execute

    def spy(call):
        REAL_CALLS.append(call.key())
        return inner(call)

    env._execute = spy
    return env


@pytest.fixture
def bank_tasks():
    make_env(load_tasks("bank", "train", n=1)[0])  # registers the built-in environments
    if "probe" not in ENVS:
        ENVS.add("probe", _probe_factory)
    tasks = load_tasks("bank", "train", n=4)
    for t in tasks:
        t.env = "probe"
    REAL_CALLS.clear()
    return tasks


def gold_policy(tasks):
    """Act: the task's first gold call, then a text reply; Rehearse: a fixed observation."""
    by_user = {t.user_turns[0]: t for t in tasks}

    def respond(prompt: str) -> str:
        if REHEARSE_SYSTEM[:40] in prompt:
            return '<observation>{"rehearsed": true}</observation>'
        task = next(t for u, t in by_user.items() if u in prompt)
        n_tool_msgs = prompt.count("<|im_start|>tool")
        gold = task.flat_gold()
        if n_tool_msgs < min(1, len(gold)):
            return render_act([gold[0]])
        return "All done."

    return respond


def cfg(**kw):
    """How these tests unroll (K=2 and the mode are the engine's and run's arguments)."""
    return RolloutConfig(max_steps=6, **kw)


def test_rehearsal_rows_are_role_tagged_and_never_touch_the_real_env(tokenizer, bank_tasks):
    be = ScriptedBackend(tokenizer, gold_policy(bank_tasks))
    trajs = RolloutEngine(be, cfg()).run(bank_tasks, group_size=2)
    assert len(trajs) == 8
    assert REAL_CALLS == []  # the firewall: no real call while rehearsing
    for tr in trajs:
        roles = [r.role for r in tr.rows]
        assert roles[:3] == ["act", "rehearse", "act"]
        assert tr.steps[0].sources == ["rehearsed"]
        assert tr.steps[0].observations == [{"rehearsed": True}]
        assert tr.steps[-1].reply == "All done."


def test_each_role_sees_what_the_method_says(tokenizer, bank_tasks):
    be = ScriptedBackend(tokenizer, gold_policy(bank_tasks))
    tr = RolloutEngine(be, cfg()).run(bank_tasks[:1], group_size=2)[0]
    task = bank_tasks[0]
    act0, reh0, act1 = (tokenizer.decode(r.prompt_ids) for r in tr.rows[:3])
    # Act: system prompt with tool schemas, the user turn; no simulator instructions
    assert task.system_prompt.strip() in act0 and '"name": "get_balance"' in act0 and task.user_turns[0] in act0
    assert "tool simulator" not in act0
    # Rehearse: its own context (simulator system prompt, schemas, references, conversation, current call)
    assert reh0.startswith("<|im_start|>system\nYou are a precise tool simulator")
    call = task.flat_gold()[0]
    assert f"name: {call.name}" in reh0 and "schema: " in reh0 and f"[user] {task.user_turns[0]}" in reh0
    for ref in task.references:
        assert ref.call.key() in reh0
    assert "<|im_start|>assistant\n" + render_act([call]) not in reh0  # not a continuation of the Act chat
    # Act at step 1 sees its call and the rehearsed observation as a tool message, token for token
    assert act1.startswith(tokenizer.decode(tr.rows[0].prompt_ids + tr.rows[0].completion_ids))
    assert '<|im_start|>tool\n{"rehearsed": true}<|im_end|>' in act1


def test_real_mode_observations_equal_the_environment_and_have_no_rehearse_rows(tokenizer, bank_tasks):
    be = ScriptedBackend(tokenizer, gold_policy(bank_tasks))
    trajs = RolloutEngine(be, cfg(), mode="real").run(bank_tasks, group_size=2)
    for tr in trajs:
        task = next(t for t in bank_tasks if t.id == tr.task_id)
        assert {r.role for r in tr.rows} == {"act"}
        env = ENVS.get("bank")(task)
        assert tr.steps[0].observations == [env.call(c) for c in tr.steps[0].calls]
        assert tr.steps[0].sources == ["real"]
    assert len(REAL_CALLS) == len(trajs)


def test_shadow_records_the_real_observation_without_showing_it(tokenizer, bank_tasks):
    be = ScriptedBackend(tokenizer, gold_policy(bank_tasks))
    tr = RolloutEngine(be, cfg(), shadow=True).run(bank_tasks[:1], group_size=2)[0]
    task = bank_tasks[0]
    real = ENVS.get("bank")(task).call(task.flat_gold()[0])
    assert tr.steps[0].shadow == [real] and tr.steps[0].observations == [{"rehearsed": True}]
    act_prompts = "".join(tokenizer.decode(r.prompt_ids) for r in tr.rows if r.role == "act")
    assert json.dumps(real) not in act_prompts  # the policy never sees the shadow observation


def _cache_run(tokenizer, task, call):
    def respond(prompt):
        if "tool simulator" in prompt:
            return '<observation>{"rehearsed": true}</observation>'
        return render_act([call]) if "<|im_start|>tool" not in prompt else "ok"

    return RolloutEngine(ScriptedBackend(tokenizer, respond), cfg(reference_cache=True)).run([task], group_size=2)[0]


def test_reference_cache_hits_are_answered_from_the_record_and_counted(tokenizer, bank_tasks):
    task = copy.deepcopy(bank_tasks[0])
    call = task.flat_gold()[0]
    task.references = record_each(task, [call], make_env)  # recorded on this task's own initial state
    tr = _cache_run(tokenizer, task, call)
    assert tr.steps[0].observations == [task.references[0].result] and tr.steps[0].sources == ["cache"]
    assert tr.counters["rehearse/cache_hits"] == 1
    assert {r.role for r in tr.rows} == {"act"}


def test_a_record_of_another_tasks_world_is_not_a_cache_hit(tokenizer, bank_tasks):
    task = bank_tasks[0]
    ref = task.references[0]
    assert ref.source != task.id and ref.state != initial_state_key(task)  # another train task's world
    tr = _cache_run(tokenizer, task, ref.call)
    assert tr.steps[0].observations == [{"rehearsed": True}] and tr.steps[0].sources == ["rehearsed"]
    assert tr.counters["rehearse/cache_other_state"] == 1 and "rehearse/cache_hits" not in tr.counters


def test_parse_errors_and_truncation_are_counted_not_silent(tokenizer, bank_tasks):
    be = ScriptedBackend(tokenizer, lambda p: '<tool_call>{"name": broken</tool_call>')
    tr = RolloutEngine(be, RolloutConfig(max_steps=3, max_steps_per_turn=5)).run(bank_tasks[:1], group_size=1)[0]
    assert tr.counters["act/parse_errors"] == 3
    assert tr.truncated == "max_steps" and tr.counters["truncated/max_steps"] == 1
    assert tr.steps[0].observations[0]["error"]["kind"] == "bad_format"
    assert tr.steps[0].sources == ["validation"]
    tr2 = RolloutEngine(be, RolloutConfig(max_steps=9, max_steps_per_turn=2)).run(bank_tasks[:1], group_size=1)[0]
    assert tr2.truncated == "max_steps_per_turn"


def test_validation_in_code_answers_unknown_tools_without_rehearse(tokenizer, bank_tasks):
    be = ScriptedBackend(
        tokenizer, lambda p: render_act([ToolCall("launch_rocket", {})]) if "<|im_start|>tool" not in p else "no"
    )
    tr = RolloutEngine(be, cfg(validate_in_code=True)).run(bank_tasks[:1], group_size=2)[0]
    assert tr.steps[0].observations[0]["error"]["kind"] == "unknown_tool"
    assert {r.role for r in tr.rows} == {"act"} and tr.counters["rehearse/validation_errors"] >= 1


def test_multi_turn_tasks_get_the_next_user_turn_after_a_text_reply(tokenizer):
    tasks = [t for t in load_tasks("bank", "train", n=60) if len(t.user_turns) >= 2][:1]
    assert tasks, "the bank suite should have multi-turn tasks"
    be = ScriptedBackend(tokenizer, lambda p: "Sure.")
    tr = RolloutEngine(be, cfg(), mode="real").run(tasks, group_size=2)[0]
    assert [m.content for m in tr.messages if m.role == "user"] == tasks[0].user_turns
    assert tr.truncated is None and tr.counters["act/replies"] == len(tasks[0].user_turns)


def test_per_role_and_simulator_modes_route_rehearse_to_the_other_backend(tokenizer, bank_tasks):
    act = ScriptedBackend(tokenizer, gold_policy(bank_tasks))
    other = ScriptedBackend(tokenizer, lambda p: '<observation>{"other": 1}</observation>')
    tr = RolloutEngine(act, cfg(), mode="per_role", rehearser=other).run(bank_tasks[:1], group_size=2)[0]
    assert tr.steps[0].observations == [{"other": 1}] and [r.role for r in tr.rows][:2] == ["act", "rehearse"]
    tr = RolloutEngine(act, cfg(), mode="simulator", simulator=other).run(bank_tasks[:1], group_size=2)[0]
    assert tr.steps[0].observations == [{"other": 1}] and tr.steps[0].sources == ["simulator"]
    assert {r.role for r in tr.rows} == {"act"}
    assert REAL_CALLS == []


def test_unknown_mode_lists_the_valid_ones():
    with pytest.raises(KeyError, match="per_role, real, rehearsal, simulator"):
        RolloutConfig(mode="magic")


def test_tiny_model_rehearsal_batch_is_deterministic_and_round_trips_as_jsonl(tiny, bank_tasks, tmp_path):
    model, tok = tiny
    c = RolloutConfig(
        max_steps=2,
        act=SamplingParams(max_new_tokens=12),
        rehearse=SamplingParams(max_new_tokens=12, stop=["</observation>"]),
    )
    a = RolloutEngine(HFBackend(model, tok), c).run(bank_tasks[:2], group_size=4, seed=7)
    b = RolloutEngine(HFBackend(model, tok), c).run(bank_tasks[:2], group_size=4, seed=7)
    assert [r.completion_ids for t in a for r in t.rows] == [r.completion_ids for t in b for r in t.rows]
    for t in a:
        for r in t.rows:
            assert len(r.completion_ids) == len(r.old_logprobs) and r.role in ("act", "rehearse")
    path = tmp_path / "t.jsonl"
    write_jsonl(str(path), a)
    back = [Trajectory.from_dict(d) for d in read_jsonl(str(path))]
    assert [t.to_dict() for t in back] == [t.to_dict() for t in a]


class _GoldActHF(HFBackend):
    """The tiny model where Act's tokens are the task's gold calls, one per step, then a reply (the random model
    emits no tool calls); each forced token still costs a forward and its log-prob is read off the logits.
    Rehearse decodes from the model. Works under both schedules (generate and generate_stream sample through
    the same _sample_rows); ``lockstep_calls`` counts generate calls."""

    def __init__(self, model, tok, tasks):
        super().__init__(model, tok)
        self.tasks, self.n, self.lockstep_calls = {t.id: t for t in tasks}, {}, 0

    def _script(self, session):
        if not session.endswith("/act"):
            return None
        n = self.n[session] = self.n.get(session, -1) + 1
        gold = self.tasks[session.rsplit("/", 2)[0].split(":", 1)[1]].flat_gold()
        text = render_act([gold[n]]) if n < len(gold) else "Done."
        return self.tokenizer.encode(text, add_special_tokens=False) + [
            self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        ]

    def _force(self, logits, tok, lp, forced):
        for i, f, step in forced:
            if f is not None:
                tok[i] = f[min(step, len(f) - 1)]
                lp[i] = logits[i].float().log_softmax(-1)[tok[i]]
        return tok, lp

    def generate(self, prompts, params, sessions=None):
        self.lockstep_calls += 1
        return super().generate(prompts, params, sessions)

    def _sample_rows(self, logits, rows, gen):
        tok, lp = super()._sample_rows(logits, rows, gen)
        for row in rows:
            if not hasattr(row, "forced"):
                row.forced = self._script(row.req.session)
        return self._force(logits, tok, lp, [(i, row.forced, len(row.toks)) for i, row in enumerate(rows)])


@pytest.mark.parametrize("mode", ["rehearsal", "real"])
def test_continuous_batching_unrolls_the_same_trajectories_as_lockstep(tiny, mode):
    """Greedy, so the schedules must agree token for token: trajectories of different lengths leave the running
    batch and their next generations join it mid-way (with kept sessions), yet every row, observation and
    log-prob is what the step-by-step lockstep batches give."""
    model, tok = tiny
    tasks = load_tasks("builtin", "train", n=4, seed=3)
    assert len({len(t.flat_gold()) for t in tasks}) > 1  # trajectories of different lengths
    greedy = SamplingParams(temperature=0, max_new_tokens=48)
    runs = {}
    for schedule in ("lockstep", "continuous"):
        c = RolloutConfig(
            schedule=schedule,
            max_steps=6,
            act=greedy,
            rehearse=greedy.with_(max_new_tokens=10, stop=["</observation>"]),
        )
        be = _GoldActHF(model, tok, tasks)
        runs[schedule] = (RolloutEngine(be, c, mode=mode).run(tasks, group_size=2), be.lockstep_calls)
    (lock, lock_calls), (cont, cont_calls) = runs["lockstep"], runs["continuous"]
    assert sum(len(t.steps) for t in cont) > 2 * len(cont)  # several steps each, with observations
    for a, b in zip(lock, cont):
        assert [(r.role, r.completion_ids) for r in a.rows] == [(r.role, r.completion_ids) for r in b.rows]
        assert [s.observations for s in a.steps] == [s.observations for s in b.steps]
        assert a.messages == b.messages and a.counters == b.counters
        for x, y in zip(a.rows, b.rows):
            assert_logprobs_close(x.old_logprobs, y.old_logprobs)
    assert lock_calls > 0 and cont_calls == 0  # the continuous run went through the stream, not batch rounds


class _KeptGoldHF(_GoldActHF):
    """_GoldActHF that checks, at every finished generation of a stream, which trajectories still have kept
    contexts: a trajectory is done once its on_done hands back no follow-up."""

    def __init__(self, *a):
        super().__init__(*a)
        self.done, self.stale, self.peak = set(), [], 0

    def generate_stream(self, requests, on_done, seed=None):
        def spy(req, g):
            traj = req.session.rsplit("/", 1)[0]
            nxt = on_done(req, g)
            if not nxt:
                self.done.add(traj)
            self.stale += [s for s in self._kept if s.rsplit("/", 1)[0] in self.done]
            self.peak = max(self.peak, len(self._kept))
            return nxt

        return super().generate_stream(requests, spy, seed)


@pytest.mark.parametrize("mode", ["rehearsal", "real"])
def test_a_finished_trajectorys_kept_contexts_are_dropped_while_the_others_run(tiny, mode):
    """Memory follows the trajectories still running: the keys/values kept for a trajectory's Act and Rehearse
    contexts are released the moment it ends, not when the whole rollout does (a 100-task evaluation otherwise
    holds every finished context, ~9 GB for SmolLM2-135M)."""
    model, tok = tiny
    tasks = load_tasks("builtin", "train", n=4, seed=3)
    greedy = SamplingParams(temperature=0, max_new_tokens=48)
    c = RolloutConfig(max_steps=6, act=greedy, rehearse=greedy.with_(max_new_tokens=10, stop=["</observation>"]))
    be = _KeptGoldHF(model, tok, tasks)
    trajs = RolloutEngine(be, c, mode=mode).run(tasks, group_size=2)
    steps = sorted(len(t.steps) for t in trajs)
    assert steps[0] < steps[-1]  # some end while others still run
    assert len(be.done) == len(trajs) and be.stale == []
    assert 0 < be.peak and be._kept == {}


class _SeenGoldHF(_GoldActHF):
    """_GoldActHF that records (session, prompt length) of every generation it is asked for, batch or stream."""

    def __init__(self, *a):
        super().__init__(*a)
        self.seen = []

    def generate(self, prompts, params, sessions=None):
        self.seen += [(s, len(p)) for s, p in zip(sessions or [None] * len(prompts), prompts)]
        return super().generate(prompts, params, sessions)

    def generate_stream(self, requests, on_done, seed=None):
        def spy(req, g):
            nxt = on_done(req, g)
            self.seen += [(r.session, len(r.prompt)) for r in nxt]
            return nxt

        self.seen += [(r.session, len(r.prompt)) for r in requests]
        return super().generate_stream(requests, spy, seed)


class _SeenHF(HFBackend):
    """The tiny model as a second Rehearse model or a simulator, recording the prompt length of each generation."""

    def __init__(self, *a):
        super().__init__(*a)
        self.seen = []

    def generate(self, prompts, params, sessions=None):
        self.seen += [("other", len(p)) for p in prompts]
        return super().generate(prompts, params, sessions)


@pytest.mark.parametrize(
    "mode,schedule",
    [
        ("rehearsal", "lockstep"),
        ("rehearsal", "continuous"),
        ("per_role", "lockstep"),
        ("simulator", "lockstep"),
        ("real", "continuous"),
    ],
)
def test_a_rehearse_context_over_the_limit_is_never_generated_from_and_is_counted(tiny, mode, schedule):
    """A limit that Act's first context fits but the first call's Rehearse context (schemas, references, the
    serialized conversation) does not: the trajectory ends there, visibly, with no Rehearse generation."""
    model, tok = tiny
    task = load_tasks("builtin", "train", n=4, seed=3)[0]
    greedy = SamplingParams(temperature=0, max_new_tokens=48)
    base = RolloutConfig(
        schedule=schedule,
        max_steps=4,
        act=greedy,
        rehearse=greedy.with_(max_new_tokens=10, stop=["</observation>"]),
    )
    probe = RolloutEngine(ScriptedBackend(tok, lambda p: ""), base)
    lv = probe._start(task, 0, "probe")
    n_act, n_reh = len(lv.act_ids), len(probe.rehearse_prompt(lv, task.flat_gold()[0]))
    act_fits = n_act + 48 + 2
    assert n_reh + 10 + 2 > act_fits  # the Rehearse context is the longer one here, as on the built-in suites

    def run(limit):
        be, other = _SeenGoldHF(model, tok, [task]), _SeenHF(model, tok)
        c = dataclasses.replace(base, max_context_tokens=limit)
        trajs = RolloutEngine(
            be,
            c,
            rehearser=other if mode == "per_role" else None,
            simulator=other if mode == "simulator" else None,
            mode=mode,
        ).run([task], group_size=2)
        rehearse_gens = [n for s, n in be.seen if s is None or not s.endswith("/act")] + [n for _, n in other.seen]
        return trajs, rehearse_gens

    trajs, gens = run(act_fits)
    if mode == "real":  # no Rehearse context at all: the real environment answered
        assert all("context/rehearse" not in t.counters and t.steps[0].sources == ["real"] for t in trajs)
        return
    assert gens == []  # no Rehearse generation, least of all from an over-long prompt
    for t in trajs:
        assert (
            t.truncated == "context:rehearse"
            and t.counters["context/rehearse"] == 1
            and t.counters["truncated/context"] == 1
        )
        assert "context/act" not in t.counters
        assert [r.role for r in t.rows] == ["act"] and len(t.steps) == 1 and t.steps[0].calls == task.flat_gold()[:1]
    # a limit the first Rehearse context just fits: it is generated from (so the spies above can see one), and
    # every Rehearse generation that happens fits the limit
    limit = n_reh + 10 + 2
    trajs, gens = run(limit)
    assert gens and gens[0] == n_reh and all(n + 10 + 2 <= limit for n in gens)
    assert all(t.steps[0].sources == ["rehearsed" if mode != "simulator" else "simulator"] for t in trajs)


def test_an_act_context_over_the_limit_ends_the_trajectory_before_acting(tokenizer, bank_tasks):
    be = ScriptedBackend(tokenizer, gold_policy(bank_tasks))
    tr = RolloutEngine(be, cfg(max_context_tokens=64)).run(bank_tasks[:1], group_size=2)[0]
    assert tr.truncated == "context:act" and tr.counters["context/act"] == 1 and tr.counters["truncated/context"] == 1
    assert tr.steps == [] and tr.rows == [] and be.prompts == []


# ------------------------------------------- per-call arguments: mode / shadow of the engine, K / seed of run


@pytest.mark.parametrize(
    "per_call", [dict(mode="real"), dict(shadow=True), dict(mode="per_role"), dict(group_size=3), dict(seed=9)]
)
def test_the_deprecated_rollout_config_fields_warn_and_unroll_as_the_arguments_do(tokenizer, bank_tasks, per_call):
    """One version: a per-call field set on RolloutConfig warns (DeprecationWarning) and still applies, giving the
    trajectories the engine's / run's argument gives."""
    engine_kw = {k: v for k, v in per_call.items() if k in ("mode", "shadow")}
    run_kw = {k: v for k, v in per_call.items() if k in ("group_size", "seed")}
    helper = {"rehearser": ScriptedBackend(tokenizer, gold_policy(bank_tasks))} if "mode" in per_call else {}
    with pytest.warns(DeprecationWarning, match=next(iter(per_call))):
        old_cfg = RolloutConfig(max_steps=6, **per_call)
    old = RolloutEngine(ScriptedBackend(tokenizer, gold_policy(bank_tasks)), old_cfg, **helper).run(bank_tasks[:2])
    REAL_CALLS.clear()
    new_be = ScriptedBackend(tokenizer, gold_policy(bank_tasks))
    new = RolloutEngine(new_be, cfg(), **helper, **engine_kw).run(bank_tasks[:2], **run_kw)
    assert [t.to_dict() for t in new] == [t.to_dict() for t in old] and new


def test_the_arguments_win_over_the_deprecated_fields_and_the_config_is_never_changed(tokenizer, bank_tasks):
    with pytest.warns(DeprecationWarning):
        c = RolloutConfig(max_steps=6, mode="real", group_size=3, seed=4)
    before = dataclasses.asdict(c)
    engine = RolloutEngine(ScriptedBackend(tokenizer, gold_policy(bank_tasks)), c, mode="rehearsal", shadow=False)
    trajs = engine.run(bank_tasks[:2], group_size=1, seed=5)
    assert len(trajs) == 2 and {t.mode for t in trajs} == {"rehearsal"} and REAL_CALLS == []
    assert engine.seed == 5 and dataclasses.asdict(c) == before
    assert len(engine.run(bank_tasks[:1])) == 3 and engine.seed == 4  # None: the config's (deprecated) values


def test_the_default_config_does_not_warn_and_run_seeds_the_sampling(tiny, bank_tasks):
    import warnings

    model, tok = tiny
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        c = RolloutConfig(max_steps=2, act=SamplingParams(max_new_tokens=8), rehearse=SamplingParams(max_new_tokens=8))
    engine = RolloutEngine(HFBackend(model, tok), c)
    a, b = (engine.run(bank_tasks[:1], group_size=2, seed=s) for s in (1, 2))
    ids = lambda ts: [r.completion_ids for t in ts for r in t.rows]  # noqa: E731
    assert len(a) == 2 and ids(a) != ids(b)
    assert ids(RolloutEngine(HFBackend(model, tok), c).run(bank_tasks[:1], group_size=2, seed=1)) == ids(a)
