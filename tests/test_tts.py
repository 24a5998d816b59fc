"""Test-time scaling by private rehearsal: the firewall, N=0 = plain acting, what sequential attempts see,
the memory bound, complete records, the tiny model end to end and the CLI."""

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from envace.chat.parsing import render_act
from envace.backends.base import SamplingParams
from envace.backends.hf import HFBackend
from envace.backends.scripted import ScriptedBackend
from envace.envs import ENVS
from envace.evaluation.trials import EvalResult, evaluate
from envace.chat.prompts import REHEARSE_SYSTEM
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.rollout.memory import LESSONS_HEADER
from envace.evaluation.tts import (
    MEMORY_SYSTEM,
    PLAN_MEMORY_SYSTEM,
    PLAN_REFLECT_SYSTEM,
    PLAN_SYSTEM,
    RECORD_FIELDS,
    REFLECT_SYSTEM,
    REHEARSAL_MODES,
    RehearsalRecord,
    TTSConfig,
    cap_tokens,
    format_record,
    load_records,
    rehearse,
    save_records,
)
from envace.evaluation.budget import evaluate_with_tts, run_tts
from spies import spied_bank_tasks

EVENTS: list[tuple] = []  # ("env",) when a real environment is built, ("real", key) per real call, ("gen", kind)


@pytest.fixture
def tasks():
    ts = spied_bank_tasks(
        "tts_spy", 3, on_open=lambda t: EVENTS.append(("env",)), on_call=lambda c: EVENTS.append(("real", c.key()))
    )
    EVENTS.clear()
    return ts


def kind_of(prompt: str) -> str:
    kinds = (
        ("reflect", REFLECT_SYSTEM),
        ("memory", MEMORY_SYSTEM),
        ("rehearse", REHEARSE_SYSTEM),
        ("plan", PLAN_SYSTEM),
        ("plan_reflect", PLAN_REFLECT_SYSTEM),
        ("plan_memory", PLAN_MEMORY_SYSTEM),
    )
    for kind, system in kinds:
        if prompt.startswith("<|im_start|>system\n" + system[:40]):
            return kind
    return "act"


PLAN_TEXT = "1. call the balance tool with the account id; if it fails, ask again."


def scripted(tasks, memory_text="Remember: call the gold tool first.", reflection=None):
    """Act: the first gold call, then a reply naming the attempt (counted from the notes it sees);
    Rehearse: a fixed observation; Reflect: names the attempt; Memory: ``memory_text``. Logs each generation."""

    def respond(prompt: str) -> str:
        kind = kind_of(prompt)
        EVENTS.append(("gen", kind))
        if kind == "rehearse":
            return '<observation>{"rehearsed": true}</observation>'
        if kind == "reflect":
            k = (re.findall(r"## Attempt (\d+)", prompt) or ["?"])[-1]  # "?" when a tiny prompt cap cut it
            return reflection if reflection is not None else f"reflection on attempt {k}: call it again"
        if kind in ("memory", "plan_memory"):
            return memory_text
        if kind == "plan":
            return PLAN_TEXT
        if kind == "plan_reflect":
            return "the plan misses a check: " + str(prompt.count("## Plan "))
        task = next(t for t in tasks if t.user_turns[0] in prompt)
        if "<|im_start|>tool" not in prompt:
            return render_act([task.flat_gold()[0]])
        return f"reply from attempt {prompt.count('## Attempt ') + 1}"

    return respond


def tcfg(**kw):
    base = dict(n=2, seed=3, rollout=RolloutConfig(max_steps=4))
    return TTSConfig(**{**base, **kw})


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_firewall_no_real_env_before_the_single_real_execution(tokenizer, tasks, mode, n):
    be = ScriptedBackend(tokenizer, scripted(tasks))
    recs = run_tts(be, tasks, tcfg(n=n, mode=mode, memory=("lessons", "model", "concat")[n % 3]))
    first_env = EVENTS.index(("env",))
    before, after = EVENTS[:first_env], EVENTS[first_env:]
    assert not any(e[0] == "real" for e in before)
    # every rehearsal-phase generation happened before any real environment existed ...
    n_private = sum(len(t.rows) for rec in recs for t in rec.attempts) + sum(
        len(rec.reflect_rows) + (rec.memory_row is not None) for rec in recs
    )
    assert len(before) == n_private
    assert {e[1] for e in before} <= {"act", "rehearse", "reflect", "memory"}
    # ... and after it only Act generates (the real run), the world answers
    assert {e[1] for e in after if e[0] == "gen"} == {"act"}
    for rec in recs:
        assert len(rec.attempts) == len(rec.reflections) == len(rec.reflect_rows) == n
        for t in rec.attempts:
            assert t.mode == "rehearsal" and all(s != "real" for st in t.steps for s in st.sources)
            assert all(o == {"rehearsed": True} for st in t.steps for o in st.observations)
        assert rec.final.mode == "real" and rec.final.steps[0].sources == ["real"]
        assert rec.success is not None
    # one real execution per task: its calls are all the real calls (scoring does not replay them)
    real_calls = [e[1] for e in after if e[0] == "real"]
    assert real_calls == [tasks[i].flat_gold()[0].key() for i in range(len(tasks))]
    assert after.count(("env",)) == len(tasks)


CALLS: dict[str, list[str]] = {}  # task id -> every Environment.call on an environment made for it, in order


def _counting_factory(task):
    """A bank environment that records each ``call`` it is asked to run under the task's id."""
    env = ENVS.get("bank")(task)
    inner = env.call

    def call(c):
        CALLS.setdefault(task.id, []).append(c.key())
        return inner(c)

    env.call = call
    return env


@pytest.fixture
def counted(tasks):
    if "tts_count" not in ENVS:
        ENVS.add("tts_count", _counting_factory)
    for t in tasks:
        t.env = "tts_count"
    CALLS.clear()
    return tasks


def _executions_per_task(tasks, trajs):
    """(ran, expected) per task id: every real ``call`` made for the task, and the calls of its real trials
    (sorted: the trials of a task run side by side)."""
    return {
        t.id: (sorted(CALLS.get(t.id, [])), sorted(c.key() for tr in trajs if tr.task_id == t.id for c in tr.calls()))
        for t in tasks
    }


@pytest.mark.parametrize("n,mode", [(0, "parallel"), (2, "parallel"), (2, "sequential")])
def test_each_task_s_calls_run_exactly_once_in_the_real_environment(tokenizer, counted, n, mode):
    """run_tts and evaluate_at_budget: the real environment runs each call of the single real execution once;
    scoring it (grounded success) uses that run and executes nothing again."""
    from envace.evaluation.budget import evaluate_at_budget

    recs = run_tts(ScriptedBackend(tokenizer, scripted(counted)), counted, tcfg(n=n, mode=mode))
    for task, rec in zip(counted, recs):
        ran, expected = _executions_per_task([task], [rec.final])[task.id]
        assert expected == [task.flat_gold()[0].key()]  # the real run made its call ...
        assert ran == expected  # ... and it was executed once, not again for scoring
        assert rec.success is not None and rec.final.reward_info["scored_in"] == "rollout"
    CALLS.clear()
    res = evaluate_at_budget(
        ScriptedBackend(tokenizer, scripted(counted)), counted, samples=2, rollout=tcfg().rollout, n=n, mode=mode
    )
    for task_id, (ran, expected) in _executions_per_task(counted, res.trajectories).items():
        assert len(expected) == 2 and ran == expected, task_id  # K=2 trials, each run once


def test_the_execution_count_catches_a_final_run_that_happens_twice_or_is_replayed(tokenizer, counted, monkeypatch):
    """The check above is not vacuous: a real phase that runs twice, or scoring that replays the calls, fails it."""
    import envace.rollout.engine
    from envace.evaluation.policy import Plain

    act = Plain.act

    def twice(self, *a, **k):  # the real phase of the rehearsing policy, run twice
        act(self, *a, **k)
        return act(self, *a, **k)

    def forgotten_outcome(env, traj):  # as if the rollout kept no outcome: scoring must replay
        return None

    for target, name, fake in (
        (Plain, "act", twice),
        (envace.rollout.engine, "final_outcome", forgotten_outcome),
    ):
        with monkeypatch.context() as m:
            m.setattr(target, name, fake)
            CALLS.clear()
            recs = run_tts(ScriptedBackend(tokenizer, scripted(counted)), counted, tcfg(n=1))
            counts = _executions_per_task(counted, [r.final for r in recs])
            assert all(ran == sorted(expected + expected) for ran, expected in counts.values()), name


def test_zero_budget_equals_plain_acting(tiny, tasks):
    model, tok = tiny
    rc = RolloutConfig(max_steps=2, act=SamplingParams(temperature=1.0, max_new_tokens=8))
    rec = run_tts(HFBackend(model, tok), tasks[:2], TTSConfig(n=0, rollout=rc, seed=11))
    plain = RolloutEngine(HFBackend(model, tok), rc, mode="real").run(tasks[:2], group_size=1, seed=11)
    ev = evaluate(HFBackend(model, tok), tasks[:2], samples=1, rollout=rc, seed=11)
    for r, p, e in zip(rec, plain, ev.trajectories):
        assert r.attempts == [] and r.memory == "" and r.memory_source == "none" and r.memory_row is None
        assert "Notes from private rehearsal" not in r.final.messages[0].content
        assert (
            [m.to_dict() for m in r.final.messages]
            == [m.to_dict() for m in p.messages]
            == [m.to_dict() for m in e.messages]
        )
        assert [(x.prompt_ids, x.completion_ids) for x in r.final.rows] == [
            (x.prompt_ids, x.completion_ids) for x in p.rows
        ]
        assert r.success == bool(e.reward)


@pytest.mark.parametrize("memory", ["model", "concat"])
def test_sequential_attempt_sees_earlier_attempts_and_reflections_in_the_transcript_formats(tokenizer, tasks, memory):
    be = ScriptedBackend(tokenizer, scripted(tasks))
    recs = rehearse(be, tasks, tcfg(n=3, mode="sequential", memory=memory))
    for rec in recs:
        assert rec.reflections == [f"reflection on attempt {k}: call it again" for k in (1, 2, 3)]
        for n, traj in enumerate(rec.attempts):
            prompt = tokenizer.decode(traj.rows[0].prompt_ids)  # attempt n's first Act prompt
            for j in range(3):
                seen = f"reply from attempt {j + 1}" in prompt and f"reflection on attempt {j + 1}" in prompt
                assert seen == (j < n), (n, j)
            assert traj.steps[-1].reply == f"reply from attempt {n + 1}"
    # parallel attempts see nothing of each other
    recs = rehearse(be, tasks, tcfg(n=3, mode="parallel"))
    for rec in recs:
        for traj in rec.attempts:
            prompt = tokenizer.decode(traj.rows[0].prompt_ids)
            assert "## Attempt" not in prompt and "Notes from private rehearsal" not in prompt


@pytest.mark.parametrize("memory", ["lessons", "model", "concat"])
def test_memory_length_bound_is_respected_and_cuts_are_recorded(tokenizer, tasks, memory):
    long = " ".join(f"note{i}" for i in range(600))
    be = ScriptedBackend(tokenizer, scripted(tasks, memory_text=long, reflection=long))
    cfg = tcfg(
        n=2,
        memory=memory,
        memory_max_tokens=64,
        reflect_sampling=SamplingParams(max_new_tokens=4000),
        memory_sampling=SamplingParams(max_new_tokens=4000),
    )
    recs = run_tts(be, tasks, cfg)
    for rec in recs:
        n_tok = len(tokenizer.encode(rec.memory, add_special_tokens=False))
        assert 0 < n_tok <= 64 and rec.counters["memory/tokens"] == n_tok
        assert rec.counters["memory/raw_tokens"] > 64
        cut = [c for c in rec.cuts if c.where == "memory"]
        if memory == "model":
            assert (
                len(cut) == 1
                and cut[0].tokens_before > 64
                and cut[0].tokens_after <= 64
                and "note599" in cut[0].cut_text
            )
        elif memory == "concat":  # each reflection got an equal share, then the whole was capped
            assert [c.attempt for c in rec.cuts if c.where == "reflection"] == [0, 1]
        else:  # the lessons come first: the cut drops whole lines from the end
            assert len(cut) == 1 and rec.memory.startswith(LESSONS_HEADER) and "note599" not in rec.memory
            assert rec.memory + "\n" + cut[0].cut_text == rec.memory_raw and "tokens cut" not in rec.memory
        assert rec.memory in rec.final.messages[0].content  # Act saw exactly m_x
    # long transcripts and prompts are capped too: a tiny transcript cap cuts every attempt
    recs = rehearse(be, tasks[:1], dataclasses.replace(cfg, transcript_max_tokens=24, prompt_max_tokens=48))
    wheres = {c.where for c in recs[0].cuts}
    assert {"transcript", "reflect_prompt", "memory"} <= wheres
    for r in recs[0].reflect_rows:
        assert "tokens cut" in tokenizer.decode(r.prompt_ids)


def test_cap_tokens_keeps_head_tail_or_middle_within_the_budget(tokenizer):
    from envace.chat.prompts import ChatFormat

    fmt = ChatFormat.for_tokenizer(tokenizer)
    text = " ".join(f"w{i}" for i in range(200))
    assert cap_tokens("short", 32, fmt) == ("short", None)
    for keep, start, end in (("head", "w0 ", "cut ...]"), ("tail", "[...", "w199"), ("middle", "w0 ", "w199")):
        kept, cut = cap_tokens(text, 32, fmt, keep)
        assert len(fmt.encode(kept)) <= 32 and kept.startswith(start) and kept.endswith(end)
        assert cut["tokens_before"] == len(fmt.encode(text)) and cut["cut_text"]
    lines = "\n".join(f"line {i} " + "w " * 5 for i in range(20))
    kept, cut = cap_tokens(lines, 32, fmt, "lines")  # whole lines only
    assert (
        len(fmt.encode(kept)) <= 32 and kept and lines.startswith(kept + "\n") and cut["cut_text"].startswith("line ")
    )


def test_every_record_is_complete_and_round_trips_through_json(tokenizer, tasks, tmp_path):
    be = ScriptedBackend(tokenizer, scripted(tasks))
    recs = run_tts(be, tasks, tcfg(n=2, mode="sequential", memory="model"))
    path = str(tmp_path / "records.jsonl")
    save_records(path, recs)
    back = load_records(path)
    assert len(back) == len(tasks)
    for rec, b in zip(recs, back):
        d = rec.to_dict()
        assert set(d) == set(RECORD_FIELDS)
        assert json.loads(json.dumps(d)) == d == b.to_dict()
        assert rec.final is not None and rec.success is not None and rec.memory and rec.memory_source == "model"
        assert len(rec.attempts) == len(rec.reflections) == len(rec.reflect_rows) == 2 and rec.memory_row is not None
        assert {r.role for r in rec.reflect_rows} == {"reflect"} and rec.memory_row.role == "memory"
        assert rec.config["n"] == 2 and rec.config["mode"] == "sequential"
        for key in (
            "rehearsal/attempts",
            "memory/tokens",
            "tokens/act",
            "tokens/rehearse",
            "tokens/reflect",
            "tokens/memory",
            "cuts",
            "final/act/steps",
        ):
            assert key in rec.counters, key
        assert {"rehearsal_s", "real_s"} <= set(rec.timing)


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_tasks_are_batched_in_lockstep(tokenizer, tasks, mode):
    """The number of backend calls does not grow with the number of tasks (or with N in parallel mode)."""

    def n_generate_calls(ts, n):
        be = ScriptedBackend(tokenizer, scripted(tasks))
        calls = []
        inner = be.generate
        be.generate = lambda prompts, *a, **k: calls.append(len(prompts)) or inner(prompts, *a, **k)
        rehearse(be, ts, tcfg(n=n, mode=mode))
        return calls

    copies = [dataclasses.replace(tasks[0], id=f"copy{i}") for i in range(3)]  # same length, distinct ids
    one, three = n_generate_calls(copies[:1], 2), n_generate_calls(copies, 2)
    assert len(one) == len(three) and [3 * c for c in one] == three


def test_tasks_in_flight_rehearses_that_many_tasks_at_a_time_and_keeps_every_record_in_task_order(tokenizer, tasks):
    """A scripted policy gives the same records whatever the grouping; the largest batch shrinks to the group's."""
    copies = [dataclasses.replace(tasks[0], id=f"copy{i}") for i in range(3)]

    def run(in_flight):
        be = ScriptedBackend(tokenizer, scripted(tasks))
        sizes = []
        inner = be.generate
        be.generate = lambda prompts, *a, **k: sizes.append(len(prompts)) or inner(prompts, *a, **k)
        res = evaluate_with_tts(be, copies, tcfg(n=2, mode="parallel", tasks_in_flight=in_flight))
        return res, max(sizes)

    (all_at_once, widest_all), (two, widest_two) = run(None), run(2)
    assert [r.task_id for r in two.records] == [r.task_id for r in all_at_once.records] == ["copy0", "copy1", "copy2"]
    assert [r.memory for r in two.records] == [
        r.memory for r in all_at_once.records
    ] and two.per_task == all_at_once.per_task
    assert widest_all == 3 * 2 and widest_two == 2 * 2  # N=2 attempts of 3 tasks, then of at most 2
    with pytest.raises(ValueError, match="tasks_in_flight"):
        tcfg(n=2, tasks_in_flight=0)


def test_config_rejects_what_would_break_the_method():
    with pytest.raises(KeyError, match="parallel, plan, sequential"):
        TTSConfig(mode="magic")
    with pytest.raises(KeyError, match="concat, lessons, model"):
        TTSConfig(memory="magic")
    with pytest.raises(ValueError, match="rehearsal"):
        TTSConfig(rollout=RolloutConfig(mode="real"))
    with pytest.raises(ValueError, match="rehearsal"):
        TTSConfig(rollout=RolloutConfig(shadow=True))
    with pytest.raises(ValueError):
        TTSConfig(n=-1)


def test_tiny_model_runs_the_whole_pipeline(tiny, tasks):
    model, tok = tiny
    small = SamplingParams(temperature=1.0, max_new_tokens=8)
    rc = RolloutConfig(max_steps=2, act=small, rehearse=small.with_(stop=["</observation>"]))
    cfg = TTSConfig(
        n=2,
        seed=5,
        mode="sequential",
        memory="model",
        transcript_max_tokens=96,
        notes_max_tokens=192,
        prompt_max_tokens=384,
        reflect_sampling=small,
        memory_sampling=small.with_(temperature=0.0),
        rollout=rc,
    )
    be = HFBackend(model, tok)
    recs = run_tts(be, tasks[:1], cfg)
    for rec in recs:
        assert len(rec.attempts) == 2 and rec.final is not None and rec.memory_source in ("model", "concat_fallback")
        assert rec.memory and rec.memory in rec.final.messages[0].content
        json.dumps(rec.to_dict())
    res = evaluate_with_tts(be, tasks[:2], dataclasses.replace(cfg, n=1, mode="parallel", memory="concat"), samples=2)
    assert isinstance(res, EvalResult) and len(res.trajectories) == 4 and len(res.records) == 2
    for key in (
        "success_rate",
        "pass^1",
        "pass^2",
        "call_f1",
        "tts/n",
        "tts/memory_tokens",
        "tts/rehearsal_tokens_per_task",
    ):
        assert key in res.metrics, key
    assert all(t.mode == "real" for t in res.trajectories)


def test_cli_rehearse_prints_attempts_reflections_memory_and_the_real_run(tmp_path):
    out = tmp_path / "rec.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [
        sys.executable,
        "-m",
        "envace.cli",
        "rehearse",
        "--model",
        "tiny-random",
        "--suite",
        "bank",
        "-N",
        "1",
        "--mode",
        "sequential",
        "--memory",
        "concat",
        "--max-steps",
        "2",
        "--max-new-tokens",
        "8",
        "--out",
        str(out),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    for text in ("attempt 1", "reflection 1", "--- memory", "real execution", "success:"):
        assert text in p.stdout, text
    rec = RehearsalRecord.from_dict(json.loads(out.read_text()))
    assert rec.n == 1 and rec.final is not None


# --------------------------------------------------------------------------------------------------------
# The compute-matched baseline: plans without rehearsed observations
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("memory", ["lessons", "model", "concat"])
def test_plan_baseline_calls_no_tool_and_imagines_no_result_before_the_single_real_run(tokenizer, tasks, n, memory):
    be = ScriptedBackend(tokenizer, scripted(tasks))
    recs = run_tts(be, tasks, tcfg(n=n, mode="plan", memory=memory))
    first_env = EVENTS.index(("env",))
    before, after = EVENTS[:first_env], EVENTS[first_env:]
    assert not any(e[0] == "real" for e in before)
    # before the real run: only plans, their reflections and (model memory) one distillation per task; no Act, no
    # Rehearse
    kinds = [e[1] for e in before]
    assert kinds.count("plan") == kinds.count("plan_reflect") == n * len(tasks)
    assert kinds.count("plan_memory") == (len(tasks) if memory == "model" else 0) and len(kinds) == (
        2 * n + (memory == "model")
    ) * len(tasks)
    assert {e[1] for e in after if e[0] == "gen"} == {"act"}
    for task, rec in zip(tasks, recs):
        assert (
            rec.attempts == [] and rec.plans == [PLAN_TEXT] * n and len(rec.reflections) == len(rec.reflect_rows) == n
        )
        assert {r.role for r in rec.plan_rows} == {"plan"}
        plan_prompt = tokenizer.decode(rec.plan_rows[0].prompt_ids)
        assert (
            task.user_turns[0] in plan_prompt
            and task.tools[0].name in plan_prompt
            and "<|im_start|>tool" not in plan_prompt
        )
        assert "## Plan 1 (nothing executed, no tool results)" in tokenizer.decode(rec.reflect_rows[0].prompt_ids)
        assert rec.memory and rec.memory in rec.final.messages[0].content and rec.final.mode == "real"
        assert "plan 1 (private; no tool called)" in format_record(rec)
        if memory == "lessons":  # no tool result exists, and the notes say so
            assert rec.memory.startswith("Lessons from private plans") and "Your plans:\n- 1: 1. call" in rec.memory
    assert [e[1] for e in after if e[0] == "real"] == [t.flat_gold()[0].key() for t in tasks]
    assert not REHEARSAL_MODES.get("plan").imagined and REHEARSAL_MODES.get("parallel").imagined


def test_generated_tokens_are_counted_per_task_for_rehearsal_and_for_plans(tokenizer, tasks):
    """attempt_tokens = Act + Rehearse tokens of the rehearsed attempts, or the plans' tokens; private_tokens adds
    reflections and memory; gen_tokens adds the real run's Act tokens; a plan never exceeds its budget."""
    enc = lambda text: len(tokenizer.encode(text, add_special_tokens=False)) + 1  # noqa: E731 - + the end token
    budget = 12
    assert enc(PLAN_TEXT) > budget  # so the budget binds
    for mode in ("parallel", "plan"):
        res = evaluate_with_tts(
            ScriptedBackend(tokenizer, scripted(tasks)),
            tasks,
            tcfg(n=2, mode=mode, memory="concat", plan_max_new_tokens=budget),
            samples=1,
        )
        for row, rec, task in zip(res.per_task, res.records, tasks):
            c = rec.counters
            if mode == "plan":
                assert (
                    c["tokens/plan"] == 2 * budget
                    and c["plan/truncated"] == 2
                    and c["tokens/act"] == c["tokens/rehearse"] == 0
                )
                assert row["attempt_tokens"] == 2 * budget
            else:  # every rehearsed observation is the same scripted text
                rows = [r for t in rec.attempts for r in t.rows]
                n_obs = sum(r.role == "rehearse" for r in rows)
                assert (
                    n_obs >= 2
                    and c["tokens/rehearse"] == n_obs * enc('<observation>{"rehearsed": true}</observation>')
                    and c["tokens/plan"] == 0
                )
                assert c["tokens/act"] == sum(len(r.completion_ids) for r in rows if r.role == "act") > 0
                assert row["attempt_tokens"] == c["tokens/act"] + c["tokens/rehearse"]
            assert (
                row["private_tokens"] == row["attempt_tokens"] + c["tokens/reflect"] + c["tokens/memory"]
                and c["tokens/reflect"] > 0
            )
            assert row["real_tokens"] == sum(len(r.completion_ids) for r in rec.final.rows if r.role == "act") > 0
            assert row["gen_tokens"] == row["private_tokens"] + row["real_tokens"]
        m = res.metrics
        assert m["tts/attempt_tokens_per_task"] == pytest.approx(
            sum(r["attempt_tokens"] for r in res.per_task) / len(tasks)
        )
        assert m["tts/attempt_tokens_per_attempt"] == pytest.approx(m["tts/attempt_tokens_per_task"] / 2)
        assert m["tts/rehearsal_tokens_per_task"] == pytest.approx(
            sum(r["private_tokens"] for r in res.per_task) / len(tasks)
        )
