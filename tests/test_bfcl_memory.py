"""BFCL-v4 memory categories (memory_kv, memory_rec_sum): the gold writer's memory within BFCL's limits and holding
every cited fact, BFCL's memory system prompt, BFCL's agentic checker on the final message (its error types for
calls-only and empty trajectories), wrong arguments as error observations, the agentic collection and BFCL's
agentic column, a missing backend package as an unavailable category, and an evaluation with a scripted policy.
With ``writer=model`` (BFCL's protocol): the questions start from exactly what the model wrote in the prerequisite
sessions, played in order and chained, one batch per session index; nothing written is the empty memory; the
tiny random model runs it end to end; the option's errors; the refusal outside an evaluation; the summary's note;
test-time rehearsal starting from the prepared memory."""

from __future__ import annotations

import json

import pytest

from bfcl_eval.constants.default_prompts import MEMORY_AGENT_SETTINGS
from bfcl_eval.eval_checker.agentic_eval.agentic_checker import agentic_checker

from envace.chat.parsing import render_act
from envace.backends.base import SamplingParams
from envace.backends.scripted import ScriptedBackend
from envace.evaluation.budget import evaluate_at_budget
from envace.evaluation.tts import TTSConfig
from envace.envs import check_env, load_tasks, make_env, suite_summary
from envace.envs.bfcl import memory as bfcl_memory, multi_turn as bfcl, v4 as bfcl_v4
from envace.evaluation.trials import evaluate
from envace.rollout.engine import RolloutConfig
from envace.core.types import Step, Task, ToolCall, Trajectory, is_error_obs

SCENARIOS = ("customer", "student", "finance", "healthcare", "notetaker")


@pytest.fixture(scope="module")
def tasks() -> dict[str, list[Task]]:
    return {c: bfcl_memory.load_category(c) for c in bfcl_memory.CATEGORIES}


def sample(tasks: dict[str, list[Task]]) -> list[Task]:
    """The first question of each scenario, in both categories."""
    firsts = {}
    for c, ts in tasks.items():
        for t in ts:
            firsts.setdefault((c, t.env_config["scenario"]), t)
    return list(firsts.values())


def traj(task: Task, steps: list[Step]) -> Trajectory:
    return Trajectory(id=f"{task.id}-t", task_id=task.id, group_id="g", mode="real", steps=steps)


def reply_step(text: str) -> Step:
    return Step(user_turn=0, action_text=text, reply=text)


def test_both_categories_have_bfcl_s_155_questions_with_the_memory_tools(tasks):
    assert {c: len(ts) for c, ts in tasks.items()} == {"memory_kv": 155, "memory_rec_sum": 155}
    kv, rec = tasks["memory_kv"][0], tasks["memory_rec_sum"][0]
    assert kv.id == "memory_kv_0-customer-0" and kv.user_turns == ["What is my first name?"]
    assert {"archival_memory_add", "archival_memory_key_search", "core_memory_retrieve_all"} <= {
        t.name for t in kv.tools
    }
    assert {t.name for t in rec.tools} == {
        "memory_append",
        "memory_update",
        "memory_clear",
        "memory_replace",
        "memory_retrieve",
    }
    assert kv.env_config["possible_answer"] == ["Michael"] and kv.env_config["backend"] == "MemoryAPI_kv"


@pytest.mark.parametrize("category", bfcl_memory.CATEGORIES)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_gold_writer_stores_every_cited_fact_within_bfcl_s_limits(tasks, category, scenario):
    memory = bfcl_memory.gold_memory(category, scenario)  # the writer raises when a backend call fails
    text = json.dumps(memory, ensure_ascii=False)
    questions = [t for t in tasks[category] if t.env_config["scenario"] == scenario]
    for t in questions:
        assert json.dumps(bfcl_memory.fact_text(t.metadata["answer_source"]), ensure_ascii=False)[1:-1] in text
        assert t.env_config["memory"] == memory  # every question of a scenario starts from its one memory
    if category == "memory_kv":
        valid_key = bfcl._backend_class("MemoryAPI_kv")._is_valid_key_format  # BFCL's snake_case rule
        assert memory["core_memory"] == {} and 0 < len(memory["archival_memory"]) <= 50
        assert all(len(v) <= 2000 and valid_key(k) for k, v in memory["archival_memory"].items())
    else:
        assert 0 < len(memory["memory"]) <= 10_000


def test_gold_replay_passes_bfcl_s_agentic_checker_and_reads_the_answer_from_memory(tasks):
    for t in sample(tasks):
        g = bfcl_memory.replay_gold(t)
        assert g.score.success and g.score.details == {"checker": "bfcl.agentic_checker", "valid": True}, t.id
    first = {c: bfcl_memory.replay_gold(ts[0]) for c, ts in tasks.items()}  # "Michael" is in the read's result
    assert all(g.answer_in_memory for g in first.values())
    bad = tasks["memory_kv"][0]  # a read of a key that holds another session's facts does not have the answer
    wrong = Task.from_dict(
        {
            **bad.to_dict(),
            "gold_actions": [
                [
                    {
                        "name": "archival_memory_retrieve",
                        "arguments": {"key": "billing_dispute_over_an_unexpected_charge"},
                    }
                ]
            ],
        }
    )
    assert not bfcl_memory.replay_gold(wrong).answer_in_memory


def test_the_system_prompt_is_bfcl_s_memory_prompt_showing_the_in_context_memory(tasks):
    kv = tasks["memory_kv"][0]
    rec = tasks["memory_rec_sum"][0]
    for t in (kv, rec):
        assert MEMORY_AGENT_SETTINGS["customer"] in t.system_prompt
        assert "For your final answer to the user, you must respond in this format" in t.system_prompt
    assert "There is no content in the core memory at this point." in kv.system_prompt  # kv: the core memory only
    assert "Michael" not in kv.system_prompt and "My name is Michael" in rec.system_prompt  # rec_sum: all of it


def test_the_final_message_is_scored_by_bfcl_s_agentic_checker(tasks):
    t = tasks["memory_kv"][0]
    read = Step(user_turn=0, action_text="", calls=[ToolCall(name="archival_memory_list_keys")], observations=[{}])
    ok = make_env(t).score(traj(t, [read, reply_step("{'answer': 'Michael', 'context': 'memory'}")]))
    assert ok.success and ok.reward == 1.0
    for text in ("{'answer': 'Michaelson'}", "I do not know", "{'answer': 'michael.', 'context': 'x'}"):
        got = make_env(t).score(traj(t, [reply_step(text)]))
        assert got.success == agentic_checker(text, ["Michael"])["valid"]  # BFCL's verdict, whatever it is
    wrong = make_env(t).score(traj(t, [reply_step("{'answer': 'John'}")]))
    assert not wrong.success and wrong.details["error_type"] == "agentic:answer_not_found"
    calls_only = make_env(t).score(traj(t, [read]))  # ended (or was cut) on a call: no final message
    assert calls_only.details["error_type"] == "agentic:no_last_message"
    assert make_env(t).score(traj(t, [])).details["error_type"] == "agentic:inference_error"
    garbled = Step(user_turn=0, action_text="<tool_call>{Michael", parse_error={"error": {"message": "bad json"}})
    assert make_env(t).score(traj(t, [read, garbled])).success  # BFCL checks the last message that does not decode


def test_wrong_argument_types_and_names_are_error_observations_and_leave_the_memory_unchanged(tasks):
    for t in (tasks["memory_kv"][3], tasks["memory_rec_sum"][3]):
        env = make_env(t)
        before = env.state()
        bad = [
            ToolCall(name="archival_memory_retrieve", arguments={"key": [1]}),
            ToolCall(name="archival_memory_key_search", arguments={"query": "order", "k": "5"}),
            ToolCall(name="memory_replace", arguments={"old_text": {"a": 1}, "new_text": "x"}),
            ToolCall(name="memory_append", arguments={}),
            ToolCall(name="memory_append", arguments={"text": "x", "extra": 1}),
            ToolCall(name="_load_scenario", arguments={"initial_config": {}}),
            ToolCall(name="__import__", arguments={"name": "os"}),
        ]
        for c in bad:
            obs = env.call(c)
            assert is_error_obs(obs), (c, obs)
        assert env.state() == before and env.faults == {}


def test_memory_tools_act_on_bfcl_s_backend_and_check_env_is_deterministic(tasks):
    kv = tasks["memory_kv"][0]
    env = make_env(kv)
    assert env.call(ToolCall(name="core_memory_add", arguments={"key": "first_name", "value": "Michael"})) == {
        "status": "Key-value pair added."
    }
    assert (
        env.call(ToolCall(name="core_memory_add", arguments={"key": "Bad Key", "value": "x"}))["error"]["kind"]
        == "tool_error"
    )
    assert env.state()["MemoryAPI_kv"]["core_memory"] == {"first_name": "Michael"}
    found = env.call(ToolCall(name="archival_memory_key_search", arguments={"query": "first time inquiry", "k": 1}))
    assert found["ranked_results"][0][1] == "first_time_inquiry_about_a_product"  # BFCL's BM25+ over the keys
    assert make_env(kv).state()["MemoryAPI_kv"]["core_memory"] == {}  # a fresh environment starts from the snapshot
    for t in sample(tasks)[:4]:
        report = check_env(t)
        assert report.ok, report.problems
    same = [t for t in tasks["memory_kv"] if t.env_config["scenario"] == "customer"][:2]
    other = next(t for t in tasks["memory_kv"] if t.env_config["scenario"] == "student")
    key = bfcl_memory.BFCLMemoryEnv.initial_state_key
    assert key(same[0]) == key(same[1]) != key(other) != key(tasks["memory_rec_sum"][0])


def test_a_question_is_on_the_same_split_side_in_both_categories(tasks):
    kv, rec = tasks["memory_kv"], tasks["memory_rec_sum"]
    assert [t.split for t in kv] == [t.split for t in rec]
    assert 30 <= sum(t.split == "test" for t in kv) <= 70
    assert bfcl_memory.entry_ids("memory_kv", "test") == [t.id for t in kv if t.split == "test"]
    with pytest.raises(ValueError, match="unknown split"):
        bfcl_memory.entry_ids("memory_kv", "val")


def test_tasks_round_trip_through_json_and_still_score(tasks):
    t = tasks["memory_rec_sum"][5]
    back = Task.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back.to_dict() == t.to_dict() and bfcl_memory.replay_gold(back).score.success


def test_the_memory_categories_join_the_agentic_collection_and_bfcl_s_agentic_column():
    assert bfcl_v4.unavailable("memory_kv") is None and bfcl_v4.unavailable("memory_rec_sum") is None
    assert "Hugging Face Hub" in bfcl_v4.unavailable("memory_vector")
    agentic = load_tasks("bfcl:agentic", "test", n=6, seed=1)
    assert {t.env for t in agentic} <= {"bfcl:memory_kv", "bfcl:memory_rec_sum"} and len(agentic) == 6
    assert all(type(make_env(t)) is bfcl_memory.BFCLMemoryEnv for t in agentic)
    assert {"memory_kv", "memory_rec_sum"} <= set(bfcl_v4.categories_of("bfcl:all"))
    rows = [{"task_id": "a", "domain": "bfcl:memory_kv", "successes": [True, False]}]
    rows += [{"task_id": "b", "domain": "bfcl:memory_rec_sum", "successes": [True]}]
    s = bfcl_v4.summary(rows)
    agentic_col = s["scores"]["data_agentic"]
    assert agentic_col["Memory KV"] == 0.5 and agentic_col["Memory Recursive Summarization"] == 1.0
    # BFCL's weighting: agentic = mean(web search, memory), memory = mean of its three (vector: not run, 0)
    assert agentic_col["Agentic Overall Acc"] == pytest.approx(((0.5 + 1.0 + 0.0) / 3 + 0.0) / 2)
    assert s["scores"]["data_overall"]["Overall Acc"] == pytest.approx(0.4 * agentic_col["Agentic Overall Acc"])
    assert s["categories"]["memory_kv"]["note"] == bfcl_memory.NOTE and "note on memory_kv, memory_rec_sum" in s["text"]
    assert set(s["unavailable"]) == {"web_search_base", "web_search_no_snippet", "memory_vector"}


def test_a_memory_backend_that_does_not_import_makes_its_category_unavailable(monkeypatch):
    def missing(class_name: str) -> type:
        raise ModuleNotFoundError("No module named 'rank_bm25'")

    monkeypatch.setattr(bfcl, "_backend_class", missing)
    why = bfcl_v4.unavailable("memory_kv")
    assert why is not None and "rank_bm25" in why and "install-bench-envs.sh" in why
    with pytest.raises(ValueError, match="no selected BFCL category can run here: memory_kv: unavailable"):
        load_tasks("bfcl:memory_kv", "test")


def scripted(tasks: list[Task], read: bool):
    """Act: the task's gold read, then (having seen its result) the gold reply; without ``read`` a wrong answer."""

    def respond(prompt: str) -> str:
        task = next(t for t in tasks if t.user_turns[0] in prompt)
        if not read:
            return "{'answer': 'I do not know', 'context': 'I do not know'}"
        if "<|im_start|>tool" not in prompt:
            return render_act(task.gold_actions[0])
        return task.gold_replies[0]

    return respond


def test_evaluation_with_a_scripted_policy_reads_the_memory_and_is_scored_on_its_reply(tokenizer, tasks):
    few = [tasks["memory_kv"][0], tasks["memory_rec_sum"][31]]
    cfg = RolloutConfig(max_steps=3, max_steps_per_turn=3)
    res = evaluate(ScriptedBackend(tokenizer, scripted(few, read=True)), few, rollout=cfg)
    assert [p["successes"] for p in res.per_task] == [[True], [True]], [t.reward_info for t in res.trajectories]
    assert [len(t.steps) for t in res.trajectories] == [2, 2] and not is_error_obs(
        res.trajectories[0].steps[0].observations[0]
    )
    res = evaluate(ScriptedBackend(tokenizer, scripted(few, read=False)), few, rollout=cfg)
    assert [p["successes"] for p in res.per_task] == [[False], [False]]


# ------------------------------------------------------------------------------- writer=model: BFCL's protocol


def last_message(prompt: str) -> tuple[str, str]:
    """(role, content) of the last message of a ChatML prompt, before its generation prompt."""
    role, _, content = prompt.rsplit("<|im_start|>", 2)[-2].partition("\n")
    return role, content.split("<|im_end|>")[0]


def writing_policy(first_turns: dict[str, tuple[str, int]], writes: bool = True):
    """Act: on the first user turn of a prerequisite session (``first_turns``: text -> (its category, its index)),
    the calls that record it (kv: a core entry and an archival entry, and a call with a bad key; rec_sum: an
    append); every other user message and every tool result is answered with text."""

    def respond(prompt: str) -> str:
        role, content = last_message(prompt)
        if role != "user" or content not in first_turns or not writes:
            return "{'answer': 'Noted.', 'context': 'x'}"
        category, k = first_turns[content]
        if category == "memory_kv":
            calls = [
                ToolCall(name="core_memory_add", arguments={"key": f"session_{k}", "value": f"wrote {k}"}),
                ToolCall(name="core_memory_add", arguments={"key": "Bad Key", "value": "x"}),  # BFCL refuses it
                ToolCall(name="archival_memory_add", arguments={"key": f"note_{k}", "value": f"archived {k}"}),
            ]
        else:
            calls = [ToolCall(name="memory_append", arguments={"text": f"[wrote {k}]"})]
        return render_act(calls)

    return respond


def firsts(*chains: tuple[str, str]) -> dict[str, tuple[str, int]]:
    """The first user turn of each prerequisite session of the (category, scenario) chains -> (category, index)."""
    out = {}
    for category, scenario in chains:
        for k, sid in enumerate(bfcl_memory.session_ids(category, scenario)):
            out[bfcl_memory.session_task(category, sid, None).user_turns[0]] = (category, k)
    return out


def first_question(category: str, scenario: str, writer: str = "model") -> Task:
    (q,) = [e for e in bfcl_memory._questions(category) if e["scenario"] == scenario][:1]
    return bfcl_memory.load_category(category, [q["id"]], writer=writer)[0]


WIDE = RolloutConfig(max_steps=3, max_steps_per_turn=3, max_context_tokens=32_768)


def test_with_the_model_writer_questions_start_from_what_the_model_wrote_in_its_chained_sessions(tokenizer):
    chains = [("memory_kv", "notetaker"), ("memory_rec_sum", "healthcare")]
    tasks = [first_question(*c) for c in chains]
    assert all(t.env_config["memory"] is None and t.env_config["unprepared"] for t in tasks)
    res = evaluate(ScriptedBackend(tokenizer, writing_policy(firsts(*chains))), tasks, rollout=WIDE)
    ids = {c: bfcl_memory.session_ids(*c) for c in chains}
    assert [len(v) for v in ids.values()] == [5, 5]
    # one batch per session index, the scenarios side by side, each chain in BFCL's order
    assert [t.task_id for t in res.prepared] == [ids[c][i] for i in range(5) for c in chains]
    assert [t.group_id.split(".")[0] for t in res.prepared] == [f"prepare{i + 1}" for i in range(5) for _ in chains]
    for traj in res.prepared:  # each session played to its last user turn, never scored
        task = bfcl_memory.session_task(traj.task_id.split("_prereq")[0], traj.task_id, None)
        assert sum(m.role == "user" for m in traj.messages) == len(task.user_turns) and traj.truncated is None
        assert traj.reward is None
    kv_first = res.prepared[0].steps[0]
    assert is_error_obs(kv_first.observations[1]) and not is_error_obs(kv_first.observations[0])  # "Bad Key"
    # session k starts from sessions 0..k-1's writes (the in-context memory its prompt shows), not its own
    for i in range(5):
        kv, rec = (res.prepared[2 * i].messages[0].content, res.prepared[2 * i + 1].messages[0].content)
        assert all(f'"session_{j}": "wrote {j}"' in kv for j in range(i)) and f'"session_{i}"' not in kv
        assert "".join(f"[wrote {j}]" for j in range(i)) in rec and f"[wrote {i}]" not in rec
    # the questions' initial memory is exactly what the model wrote (none of the gold writer's facts)
    assert [p["task_id"] for p in res.per_task] == [t.id for t in tasks] and res.metrics["n_tasks"] == 2
    assert res.metrics["prepare/episodes"] == 10.0 and res.metrics["prepare/truncated_rate"] == 0.0
    kv_q, rec_q = res.trajectories
    assert "wrote 4" in kv_q.messages[0].content and "[wrote 4]" in rec_q.messages[0].content
    assert all(p["successes"] == [False] for p in res.per_task)  # "Noted." answers nothing
    prepared = bfcl_memory.with_memory(tasks[0], bfcl_memory.memory_after(res.prepared[-2]))
    assert prepared.env_config["memory"] == {
        "core_memory": {f"session_{k}": f"wrote {k}" for k in range(5)},
        "archival_memory": {f"note_{k}": f"archived {k}" for k in range(5)},
    }
    assert bfcl_memory.memory_after(res.prepared[-1]) == {"memory": "".join(f"[wrote {k}]" for k in range(5))}
    for t in tasks:
        assert bfcl_memory.fact_text(t.metadata["answer_source"]) not in json.dumps(res.prepared[-1].env_outcome)
    d = json.loads(json.dumps(res.to_dict(with_trajectories=True)))
    assert len(d["prepared_trajectories"]) == 10 and len(d["trajectories"]) == 2


def test_a_model_that_writes_nothing_leaves_the_questions_an_empty_memory(tokenizer):
    from envace.evaluation.trials import prepare

    chains = [("memory_kv", "notetaker"), ("memory_rec_sum", "notetaker")]
    tasks = [first_question(*c) for c in chains]
    be = ScriptedBackend(tokenizer, writing_policy(firsts(*chains), writes=False))
    ready, played = prepare(be, tasks, WIDE)
    assert len(played) == 10 and all(not t.calls() for t in played)
    assert [t.env_config["memory"] for t in ready] == [{"core_memory": {}, "archival_memory": {}}, {"memory": ""}]
    assert all("unprepared" not in t.env_config for t in ready)
    assert "There is no content in the core memory at this point." in ready[0].system_prompt
    assert "There is no content in the memory at this point." in ready[1].system_prompt
    gold = first_question("memory_kv", "notetaker", writer="gold")
    assert gold.env_config["memory"] != ready[0].env_config["memory"]
    assert prepare(be, [gold], WIDE) == ([gold], [])  # the gold writer's tasks need nothing played


def test_the_tiny_random_model_plays_the_prerequisite_sessions_end_to_end(tiny):
    from envace.backends.hf import HFBackend

    model, tok = tiny
    chains = [("memory_kv", "notetaker"), ("memory_rec_sum", "finance")]
    tasks = [first_question(*c) for c in chains]
    cfg = RolloutConfig(
        max_steps=2, max_steps_per_turn=2, max_context_tokens=8192, act=SamplingParams(max_new_tokens=8)
    )
    res = evaluate(HFBackend(model, tok), tasks, rollout=cfg)
    assert len(res.prepared) == 5 + 7 and len(res.trajectories) == 2  # notetaker: 5 sessions, finance: 7
    assert [len(p["successes"]) for p in res.per_task] == [1, 1]
    for t in res.prepared:  # garbled output is a text reply (or a parse error): the session goes on to its end
        assert t.truncated is None and t.env_outcome and "error" not in t.env_outcome
        assert all(is_error_obs(o) or isinstance(o, dict) for s in t.steps for o in s.observations)
    last = {c: next(t for t in reversed(res.prepared) if t.task_id.startswith(c[0] + "_prereq")) for c in chains}
    for task, traj, c in zip(tasks, res.trajectories, chains):  # each question shows its chain's last memory
        ready = bfcl_memory.with_memory(task, bfcl_memory.memory_after(last[c]))
        assert traj.messages[0].content.startswith(ready.system_prompt.strip())


def test_the_writer_is_a_suite_option_and_an_unknown_one_is_an_error_listing_the_valid_ones():
    assert bfcl_v4.options_of("bfcl:memory") == {"writer": "gold"}
    assert bfcl_v4.categories_of("bfcl:memory?writer=model") == ["memory_kv", "memory_vector", "memory_rec_sum"]
    model = load_tasks("bfcl:memory_kv?writer=model", "test", n=2, seed=3)
    gold = load_tasks("bfcl:memory_kv", "test", n=2, seed=3)
    assert [t.id for t in model] == [t.id for t in gold]  # the same questions
    assert all(t.env_config["writer"] == "model" and t.env_config["memory"] is None for t in model)
    assert all(t.env_config["writer"] == "gold" and t.env_config["memory"] for t in gold)
    with pytest.raises(ValueError, match="unknown BFCL writer 'bogus'.*valid: gold, model"):
        load_tasks("bfcl:memory_kv?writer=bogus", "test", n=1)
    with pytest.raises(ValueError, match="unknown BFCL suite option 'wrtier'.*valid options: writer"):
        load_tasks("bfcl:memory_kv?wrtier=model", "test", n=1)
    with pytest.raises(ValueError, match="no selected BFCL category takes the option writer"):
        load_tasks("bfcl:simple_python?writer=model", "test", n=1)
    with pytest.raises(ValueError, match="unknown BFCL memory writer 'x'; valid: gold, model"):
        bfcl_memory.load_category("memory_kv", writer="x")


def test_outside_an_evaluation_a_model_writer_question_is_refused_with_the_reason(tokenizer):
    from envace.rollout.engine import RolloutEngine

    t = first_question("memory_kv", "customer")
    with pytest.raises(ValueError, match="cannot run before its environment prepares it.*use writer=gold"):
        make_env(t)
    engine = RolloutEngine(ScriptedBackend(tokenizer, lambda p: "x"), RolloutConfig(), mode="rehearsal")
    with pytest.raises(ValueError, match="customer scenario's prerequisite sessions"):  # training, rehearsal
        engine.run([t])


def test_the_summary_says_who_wrote_the_memory():
    rows = [{"task_id": "a", "domain": "bfcl:memory_kv", "successes": [True]}]
    gold, model = bfcl_v4.summary(rows), bfcl_v4.summary(rows, "bfcl:memory?writer=model")
    assert gold["categories"]["memory_kv"]["note"] == bfcl_memory.NOTE and "not BFCL's memory score" in gold["text"]
    assert model["categories"]["memory_kv"]["note"] == bfcl_memory.MODEL_NOTE
    assert "not BFCL's memory score" not in model["text"] and "note on memory_kv: writer=model" in model["text"]
    assert suite_summary("bfcl:memory_kv?writer=model@oracle-references", rows)["text"] == model["text"]


def test_test_time_rehearsal_starts_from_the_prepared_memory(tokenizer):
    t = first_question("memory_kv", "notetaker")
    be = ScriptedBackend(tokenizer, writing_policy(firsts(("memory_kv", "notetaker"))))
    res = evaluate_at_budget(be, [t], rollout=WIDE, n=1, mode="sequential", tts=TTSConfig(memory="concat"))
    assert len(res.prepared) == 5 and res.metrics["prepare/episodes"] == 5.0
    attempt = res.records[0].attempts[0]
    assert '"session_4": "wrote 4"' in attempt.messages[0].content  # the private attempt saw the model's memory
