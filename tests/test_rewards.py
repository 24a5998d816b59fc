"""Rewards on hand-built trajectories (envace.rewards.functions): gold matching, checklist rules, the LLM judge with
fake backends, the grounded reward with a tiny environment defined here, composition and group scoring."""

from __future__ import annotations

import json
from typing import Any

import pytest

from envace.backends.base import Backend, BackendError, SamplingParams
from envace.envs.base import ENVS, Environment, Score, ToolError
from envace.core.registry import UnknownNameError
from envace.rewards.functions import (
    REWARDS,
    RewardContext,
    RewardResult,
    call_prf,
    make_reward,
    outcome_rules,
    parse_reward_spec,
    reward_names,
    parse_verdict,
    JudgeError,
    score_trajectories,
    serialize_trajectory,
    tool_name_prf,
)
from envace.core.types import ChecklistItem, Message, Step, Task, ToolCall, ToolSpec, Trajectory

# ---------------------------------------------------------------------------------------------- fixtures


class CounterEnv(Environment):
    """A counter: ``add(n)`` adds n, ``fail()`` reports a tool error. Success: the total equals the target."""

    def __init__(self, task: Task):
        super().__init__(task)
        self.total = 0

    def _execute(self, call: ToolCall) -> Any:
        if call.name == "add":
            self.total += call.arguments["n"]
            return {"total": self.total}
        raise ToolError("this tool always fails")

    def state(self) -> dict[str, Any]:
        return {"total": self.total}

    def score(self, traj: Trajectory) -> Score:
        target = self.task.env_config["target"]
        ok = self.total == target
        return Score(success=ok, reward=1.0 if ok else 0.0, details={"total": self.total, "target": target})


class BrokenScoreEnv(CounterEnv):
    def score(self, traj: Trajectory) -> Score:
        raise RuntimeError("scorer crashed")


for _name, _cls in (("rwtest_counter", CounterEnv), ("rwtest_broken", BrokenScoreEnv)):
    if _name not in ENVS:
        ENVS.add(_name, _cls)

TOOLS = [
    ToolSpec(
        "add", "add n to the counter", {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    ),
    ToolSpec("fail", "always fails", {"type": "object", "properties": {}}),
    ToolSpec(
        "lookup",
        "look something up",
        {"type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "integer"}}},
    ),
]


def make_task(**kw: Any) -> Task:
    base = dict(
        id="t1",
        env="rwtest_counter",
        system_prompt="You count.",
        user_turns=["add 2 then 3", "now tell me the total"],
        tools=TOOLS,
        env_config={"target": 5},
        gold_actions=[[ToolCall("add", {"n": 2}), ToolCall("add", {"n": 3})], []],
    )
    base.update(kw)
    return Task(**base)


def make_traj(*steps: Step, tid: str = "tr") -> Trajectory:
    return Trajectory(id=tid, task_id="t1", group_id="g", mode="rehearse", steps=list(steps))


def calls_step(*calls: ToolCall, turn: int = 0, obs: list[Any] | None = None) -> Step:
    return Step(user_turn=turn, action_text="", calls=list(calls), observations=obs or [{"ok": True}] * len(calls))


def reply_step(text: str, turn: int = 1) -> Step:
    return Step(user_turn=turn, action_text=text, reply=text)


ADD2, ADD3 = ToolCall("add", {"n": 2}), ToolCall("add", {"n": 3})
GOOD = make_traj(calls_step(ADD2), calls_step(ADD3), reply_step("The total is 5."))
CTX = RewardContext()


def test_reward_registry_names_and_unknown_name():
    assert REWARDS.names() == [
        "checklist",
        "checklist_judge",
        "consistent_f1",
        "consistent_facts",
        "gold_exact",
        "gold_f1",
        "grounded",
        "outcome_checklist",
        "reply_facts",
        "verifiers_rubric",
    ]
    with pytest.raises(UnknownNameError, match="gold_f1"):
        REWARDS.get("gold")


# ---------------------------------------------------------------------------------------------- gold rewards


def test_gold_exact_requires_same_calls_in_same_order():
    f = REWARDS.get("gold_exact")
    assert f(make_task(), GOOD, CTX).value == 1.0
    # the same calls in one step with a reordered argument dict are still equal (canonical comparison)
    assert f(make_task(), make_traj(calls_step(ToolCall("add", {"n": 2}), ADD3)), CTX).value == 1.0
    swapped = f(make_task(), make_traj(calls_step(ADD3, ADD2)), CTX)
    assert swapped.value == 0.0 and swapped.info["first_mismatch"] == 0
    extra = f(make_task(), make_traj(calls_step(ADD2, ADD3, ADD3)), CTX)
    assert extra.value == 0.0 and extra.info["first_mismatch"] == 2
    assert f(make_task(), make_traj(calls_step(ToolCall("add", {"n": 2.0}), ADD3)), CTX).value == 0.0  # 2.0 != 2


def test_gold_rewards_are_unscored_without_gold_but_score_an_expected_empty_call_list():
    for name in ("gold_exact", "gold_f1"):
        res = REWARDS.get(name)(make_task(gold_actions=[]), GOOD, CTX)
        assert res.value is None and "no gold" in res.info["unscored"]
        # [[]] = annotated: the right answer is no call at all
        assert REWARDS.get(name)(make_task(gold_actions=[[]]), make_traj(reply_step("hi")), CTX).value == 1.0
        assert REWARDS.get(name)(make_task(gold_actions=[[]]), GOOD, CTX).value == 0.0


def test_gold_f1_hand_values():
    # pred: add2, add2, lookup(x); gold: add2, add3 -> tp = 1 (multiset), p = 1/3, r = 1/2, f1 = 0.4
    traj = make_traj(calls_step(ADD2, ADD2, ToolCall("lookup", {"q": "x"})))
    res = REWARDS.get("gold_f1")(make_task(), traj, CTX)
    assert res.value == pytest.approx(0.4)
    assert res.info["precision"] == pytest.approx(1 / 3) and res.info["recall"] == pytest.approx(0.5)


def test_call_prf_multiset_and_edge_cases():
    assert call_prf([], []) == (1.0, 1.0, 1.0)
    assert call_prf([ADD2], []) == (0.0, 0.0, 0.0)
    assert call_prf([], [ADD2]) == (0.0, 0.0, 0.0)
    assert call_prf([ADD2, ADD2], [ADD2, ADD2]) == (1.0, 1.0, 1.0)
    assert call_prf([ADD2, ADD2], [ADD2]) == (0.5, 1.0, pytest.approx(2 / 3))
    assert call_prf([ADD3], [ADD2]) == (0.0, 0.0, 0.0)


def test_tool_name_prf_compares_sets_of_names():
    lk = ToolCall("lookup", {"q": "a"})
    # names {add, lookup} vs {add, fail}: p = 1/2, r = 1/2, f1 = 1/2; arguments and repeats do not matter
    assert tool_name_prf([ADD2, ADD3, ADD3, lk], [ToolCall("add", {"n": 9}), ToolCall("fail")]) == (0.5, 0.5, 0.5)
    assert tool_name_prf([ADD2], [ADD3, ADD2]) == (1.0, 1.0, 1.0)
    assert tool_name_prf([], []) == (1.0, 1.0, 1.0)
    assert tool_name_prf([lk], []) == (0.0, 0.0, 0.0)


# ---------------------------------------------------------------------------------------------- checklist


def _checklist_task() -> Task:
    return make_task(
        checklist=[
            ChecklistItem("adds 2", {"type": "called", "tool": "add", "arguments": {"n": 2}}),
            ChecklistItem("looks up x with k=1", {"type": "called", "tool": "lookup", "arguments": {"q": "x", "k": 1}}),
            ChecklistItem("never fails", {"type": "not_called", "tool": "fail"}),
            ChecklistItem("says the total", {"type": "reply_contains", "text": "TOTAL IS 5"}),
            ChecklistItem("at most 2 calls", {"type": "max_calls", "n": 2}),
            ChecklistItem("is polite", None),
        ]
    )


def test_checklist_rules_hand_values():
    res = REWARDS.get("checklist")(_checklist_task(), GOOD, CTX)
    # satisfied: adds 2, never fails, says the total (case-insensitive), at most 2 calls; not: lookup
    assert res.value == pytest.approx(4 / 5)
    assert [it["satisfied"] for it in res.info["items"]] == [True, False, True, True, True]
    assert res.info["skipped"] == [5]


def test_checklist_called_matches_an_argument_subset():
    traj = make_traj(calls_step(ToolCall("lookup", {"q": "x", "k": 1, "extra": True}), ToolCall("fail"), ADD2, ADD3))
    res = REWARDS.get("checklist")(_checklist_task(), traj, CTX)
    # adds 2 yes, lookup subset yes, fail called -> no, no reply -> no, 4 calls > 2 -> no
    assert [it["satisfied"] for it in res.info["items"]] == [True, True, False, False, False]
    assert res.value == pytest.approx(2 / 5)


def test_checklist_unknown_rule_or_missing_field_is_a_clear_error_and_no_rules_is_unscored():
    bad = make_task(checklist=[ChecklistItem("x", {"type": "called_twice", "tool": "add"})])
    with pytest.raises(UnknownNameError, match="max_calls, not_called, reply_contains"):
        REWARDS.get("checklist")(bad, GOOD, CTX)
    missing = make_task(checklist=[ChecklistItem("x", {"type": "called"})])
    with pytest.raises(ValueError, match="lacks the field 'tool'"):
        REWARDS.get("checklist")(missing, GOOD, CTX)
    no_type = make_task(checklist=[ChecklistItem("x", {"tool": "add"})])
    with pytest.raises(ValueError, match="'type'"):
        REWARDS.get("checklist")(no_type, GOOD, CTX)
    judge_only = make_task(checklist=[ChecklistItem("is polite")])
    res = REWARDS.get("checklist")(judge_only, GOOD, CTX)
    assert res.value is None and res.info["skipped"] == [0]


# ---------------------------------------------------------------------------------------------- LLM judge


class FakeJudge(Backend):
    """Answers every chat with a fixed text (or raises), and records the conversations it was given."""

    def __init__(self, reply: str | Exception):
        self.reply = reply
        self.seen: list[list[dict[str, str]]] = []
        self.params: list[SamplingParams] = []

    def generate(self, prompts, params, sessions=None):  # pragma: no cover - never used by the judge
        raise NotImplementedError

    def chat(self, conversations, params):
        self.seen.extend(conversations)
        self.params.append(params)
        if isinstance(self.reply, Exception):
            raise self.reply
        return [self.reply for _ in conversations]


def _verdict(*sat: bool) -> str:
    return json.dumps({"items": [{"index": i, "satisfied": s} for i, s in enumerate(sat)]})


def test_judge_good_verdict_scores_all_items_in_one_call():
    task = _checklist_task()
    judge = FakeJudge("<think>{not json}</think> Verdict: " + _verdict(True, False, True, True, True, True) + " done")
    res = REWARDS.get("checklist_judge")(task, GOOD, RewardContext(judge=judge))
    assert res.value == pytest.approx(5 / 6)
    assert len(judge.seen) == 1 and judge.params[0].temperature == 0.0
    prompt = judge.seen[0][-1]["content"]
    assert "5. is polite" in prompt and "add" in prompt and "The total is 5." in prompt


@pytest.mark.parametrize(
    "reply",
    [
        "I think it is fine.",  # no JSON
        '{"items": [{"index": 0, "satisfied": true}',  # truncated JSON
        _verdict(True, True),  # incomplete: 2 of 6 items
        json.dumps({"items": [{"index": i, "satisfied": "yes"} for i in range(6)]}),  # not a bool
        json.dumps({"items": [{"index": i % 5, "satisfied": True} for i in range(6)]}),  # duplicate index
        json.dumps({"items": [{"index": i + 1, "satisfied": True} for i in range(6)]}),  # out of range (1-based)
        json.dumps({"verdict": "all good"}),  # wrong shape
        "{'items': []}",  # python literal, not JSON: never evaluated
    ],
)
def test_judge_malformed_verdict_is_unscored_with_the_reason(reply):
    res = REWARDS.get("checklist_judge")(_checklist_task(), GOOD, RewardContext(judge=FakeJudge(reply)))
    assert res.value is None
    assert res.info["judge_error"].startswith("JudgeError")


def test_judge_backend_exception_is_unscored_and_missing_judge_is_an_error():
    res = REWARDS.get("checklist_judge")(
        _checklist_task(), GOOD, RewardContext(judge=FakeJudge(BackendError("server down")))
    )
    assert res.value is None and "server down" in res.info["judge_error"]
    with pytest.raises(ValueError, match="judge backend"):
        REWARDS.get("checklist_judge")(_checklist_task(), GOOD, RewardContext())
    empty = REWARDS.get("checklist_judge")(make_task(), GOOD, RewardContext(judge=FakeJudge(_verdict())))
    assert empty.value is None and "no checklist" in empty.info["unscored"]


def test_judge_uses_the_configured_sampling_params():
    judge = FakeJudge(_verdict(True, True, True, True, True, True))
    params = SamplingParams(temperature=0.3, max_new_tokens=64)
    REWARDS.get("checklist_judge")(_checklist_task(), GOOD, RewardContext(judge=judge, judge_params=params))
    assert judge.params == [params]


def test_parse_verdict_takes_only_the_first_json_object():
    assert parse_verdict('{"items": [{"index": 0, "satisfied": false}]} {"items": []}', 1) == [False]
    with pytest.raises(JudgeError):
        parse_verdict('{"items": [{"index": true, "satisfied": false}]}', 2)  # a bool is not an index


def test_serialize_trajectory_prefers_the_act_chat_and_falls_back_to_steps():
    from_steps = serialize_trajectory(make_task(), GOOD)
    assert from_steps.splitlines()[:3] == [
        "[user] add 2 then 3",
        '[assistant calls] add({"n": 2})',
        '[tool] {"ok": true}',
    ]
    assert "[user] now tell me the total" in from_steps and "[assistant] The total is 5." in from_steps
    chat = make_traj()
    chat.messages = [
        Message("system", "SECRET SCHEMAS"),
        Message("user", "hello"),
        Message("assistant", "", [ADD2]),
        Message("tool", '{"total": 2}'),
        Message("assistant", "bye"),
    ]
    text = serialize_trajectory(make_task(), chat)
    assert "SECRET" not in text
    assert text.splitlines() == [
        "[user] hello",
        '[assistant calls] add({"n": 2})',
        '[tool] {"total": 2}',
        "[assistant] bye",
    ]


# ---------------------------------------------------------------------------------------------- grounded


def test_grounded_replays_calls_in_a_fresh_real_environment():
    f = REWARDS.get("grounded")
    # rehearsed observations in the trajectory are irrelevant: the real env recomputes the total
    res = f(make_task(), GOOD, CTX)
    assert res.value == 1.0 and res.info["details"] == {"total": 5, "target": 5} and res.info["n_replayed"] == 2
    again = f(make_task(), GOOD, CTX)  # fresh environment each time: no state carried over
    assert again.value == 1.0
    wrong = f(make_task(), make_traj(calls_step(ADD2, ToolCall("fail"), ToolCall("add", {"n": "x"}))), CTX)
    assert wrong.value == 0.0 and wrong.info["details"]["total"] == 2 and wrong.info["n_error_obs"] == 2


def test_grounded_takes_the_outcome_of_the_run_itself_and_builds_no_environment():
    import dataclasses

    ran = dataclasses.replace(
        GOOD, env_outcome={"success": False, "reward": 0.25, "details": {"total": 4}, "n_calls": 2}
    )
    res = REWARDS.get("grounded")(make_task(env="rwtest_no_such_env"), ran, CTX)  # building that env would raise
    assert (
        res.value == 0.0
        and res.info["scored_in"] == "rollout"
        and res.info["n_replayed"] == 0
        and res.info["env_reward"] == 0.25
    )
    crashed = dataclasses.replace(GOOD, env_outcome={"error": "RuntimeError: boom", "n_calls": 2})
    res = REWARDS.get("grounded")(make_task(env="rwtest_no_such_env"), crashed, CTX)
    assert res.value is None and res.info["grounded_error"] == "RuntimeError: boom"


def test_grounded_scorer_crash_is_unscored_and_unknown_env_raises():
    res = REWARDS.get("grounded")(make_task(env="rwtest_broken"), GOOD, CTX)
    assert res.value is None and "scorer crashed" in res.info["grounded_error"]
    with pytest.raises(UnknownNameError):
        REWARDS.get("grounded")(make_task(env="rwtest_no_such_env"), GOOD, CTX)


# ---------------------------------------------------------------------------------------------- composition


def test_parse_reward_spec_forms():
    assert parse_reward_spec("gold_f1") == {"gold_f1": 1.0}
    assert parse_reward_spec(["gold_f1", "checklist"]) == {"gold_f1": 1.0, "checklist": 1.0}
    assert parse_reward_spec([{"gold_f1": 0.5}, {"checklist": 0.25}]) == {"gold_f1": 0.5, "checklist": 0.25}
    assert parse_reward_spec({"gold_exact": 2}) == {"gold_exact": 2.0}
    with pytest.raises(UnknownNameError, match="grounded"):
        parse_reward_spec({"gold": 1.0})
    for bad in ([], {"gold_f1": float("nan")}, {"gold_f1": "1"}, ["gold_f1", {"gold_f1": 1.0}], 3):
        with pytest.raises(ValueError):
            parse_reward_spec(bad)


def test_make_reward_weighted_sum_with_components_in_info():
    fn = make_reward({"gold_f1": 0.5, "checklist": 0.5})
    traj = make_traj(calls_step(ADD2, ADD2, ToolCall("lookup", {"q": "x"})))  # f1 0.4
    res = fn(_checklist_task(), traj, CTX)
    # checklist: adds 2 yes, lookup(x, k=1) no (k missing), never fails yes, no reply no, 3 calls > 2 no -> 2/5
    assert res.info["components"] == {"gold_f1": pytest.approx(0.4), "checklist": pytest.approx(0.4)}
    assert res.value == pytest.approx(0.5 * 0.4 + 0.5 * 0.4)
    assert res.info["gold_f1"]["recall"] == pytest.approx(0.5)


def test_make_reward_is_unscored_if_any_component_is():
    fn = make_reward(["gold_exact", "checklist_judge"])
    res = fn(_checklist_task(), GOOD, RewardContext(judge=FakeJudge("no verdict")))
    assert res.value is None
    assert res.info["components"]["gold_exact"] == 1.0 and res.info["unscored_by"] == ["checklist_judge"]


def test_score_trajectories_sets_rewards_and_counts_unscored():
    task = _checklist_task()
    trajs = [make_traj(*GOOD.steps, tid="a"), make_traj(calls_step(ADD3), tid="b"), make_traj(tid="c")]

    replies = iter([_verdict(*[True] * 6), "garbage", _verdict(*[False] * 6)])

    class SeqJudge(FakeJudge):
        def chat(self, conversations, params):
            return [next(replies)]

    m = score_trajectories(task, trajs, make_reward("checklist_judge"), RewardContext(judge=SeqJudge("")))
    assert [t.reward for t in trajs] == [1.0, None, 0.0]
    assert "judge_error" in trajs[1].reward_info["checklist_judge"]
    assert m == {"reward/n": 3.0, "reward/unscored": 1.0, "reward/mean": 0.5}
    # a plain registered function works as reward_fn too, and ctx defaults to an empty context
    m2 = score_trajectories(make_task(), trajs, REWARDS.get("gold_exact"))
    assert [t.reward for t in trajs] == [1.0, 0.0, 0.0] and m2["reward/unscored"] == 0.0


def test_reward_result_default_info_is_not_shared():
    a, b = RewardResult(1.0), RewardResult(0.0)
    a.info["x"] = 1
    assert b.info == {}


# ---------------------------------------------------------------------------------------------- outcome rewards


def _balance_task(**kw: Any) -> Task:
    """A read-only question: the reply must state the balance that get_balance returns (142.50)."""
    base = dict(
        id="ro",
        env="rwtest_counter",
        system_prompt="You bank.",
        user_turns=["What is the balance of rent?"],
        tools=[ToolSpec("get_balance", "read", {"type": "object", "properties": {"account": {"type": "string"}}})],
        gold_actions=[[ToolCall("get_balance", {"account": "rent"})]],
        expected_outputs=["142.50"],
        checklist=[
            ChecklistItem(
                "Calls get_balance(account=rent)",
                {"type": "called", "tool": "get_balance", "arguments": {"account": "rent"}},
            ),
            ChecklistItem("Does not call transfer", {"type": "not_called", "tool": "transfer"}),
            ChecklistItem("Tells the user '142.50'", {"type": "reply_contains", "text": "142.50"}),
        ],
    )
    base.update(kw)
    return Task(**base)


def _balance_traj(rehearsed: str, tid: str = "tr") -> Trajectory:
    """The gold call, a rehearsed balance, and a reply that reports the rehearsed balance."""
    call = ToolCall("get_balance", {"account": "rent"})
    return make_traj(
        calls_step(call, obs=[{"account": "rent", "balance": rehearsed}]),
        reply_step(f"Your rent account holds ${rehearsed}.", turn=0),
        tid=tid,
    )


def test_outcome_rewards_tell_an_invented_balance_from_the_right_one_where_gold_f1_cannot():
    task, right, invented = _balance_task(), _balance_traj("142.50"), _balance_traj("999.00")
    score = lambda spec, traj: make_reward(spec)(task, traj, CTX).value  # noqa: E731
    assert score("gold_f1", right) == score("gold_f1", invented) == 1.0  # blind to what the reply says
    assert score("gold_exact", invented) == 1.0
    assert (score("reply_facts", right), score("reply_facts", invented)) == (1.0, 0.0)
    assert (score("outcome_checklist", right), score("outcome_checklist", invented)) == (1.0, pytest.approx(2 / 3))
    assert (score("gold_f1*reply_facts", right), score("gold_f1*reply_facts", invented)) == (1.0, 0.0)
    assert score({"gold_f1": 0.5, "reply_facts": 0.5}, invented) == pytest.approx(0.5)
    res = REWARDS.get("reply_facts")(task, invented, CTX)
    assert res.info == {"n_facts": 1, "missing": ["142.50"]}


def _sweep_task() -> Task:
    """Move the whole balance of holiday (511.00 in the real world) to savings: the amount is only looked up."""
    tools = [ToolSpec(n, n, {"type": "object", "properties": {}}) for n in ("get_balance", "transfer")]
    return Task(
        id="sw",
        env="rwtest_counter",
        system_prompt="You bank.",
        user_turns=["Move everything from holiday to savings and tell me how much."],
        tools=tools,
        gold_actions=[
            [
                ToolCall("get_balance", {"account": "holiday"}),
                ToolCall("transfer", {"from_account": "holiday", "to_account": "savings", "amount": 511.0}),
            ]
        ],
        expected_outputs=["511.00"],
    )


def _sweep_traj(seen: str, moved: float, told: str) -> Trajectory:
    """Looks up holiday (the observation says ``seen``), moves ``moved``, replies with ``told``."""
    look, move = (
        ToolCall("get_balance", {"account": "holiday"}),
        ToolCall("transfer", {"from_account": "holiday", "to_account": "savings", "amount": moved}),
    )
    return make_traj(
        calls_step(look, obs=[{"account": "holiday", "balance": seen}]),
        calls_step(move, obs=[{"amount": f"{moved:.2f}"}]),
        reply_step(f"Moved ${told} to savings."),
    )


def test_consistent_rewards_score_a_rehearsed_world_by_its_own_observations_where_the_gold_rewards_cannot():
    task = _sweep_task()
    score = lambda spec, traj: make_reward(spec)(task, traj, CTX).value  # noqa: E731
    real = _sweep_traj("511.00", 511.0, "511.00")
    imagined = _sweep_traj("300.00", 300.0, "300.00")  # Rehearse imagined 300: Act copied it, as it should
    made_up = _sweep_traj("300.00", 250.0, "250.00")  # an amount no observation holds
    assert score("gold_f1*reply_facts", real) == score("consistent_f1*consistent_facts", real) == 1.0
    assert score("gold_f1", imagined) == 0.5 and score("reply_facts", imagined) == 0.0  # the gold punishes copying
    assert score("consistent_f1", imagined) == score("consistent_facts", imagined) == 1.0
    assert score("consistent_f1", made_up) == 0.5 and score("consistent_facts", made_up) == 0.0
    res = REWARDS.get("consistent_facts")(task, made_up, CTX)
    assert res.info["made_up_numbers"] == [250.0]


def test_consistent_f1_still_needs_the_values_the_user_states_exactly():
    task = _sweep_task()
    wrong_account = make_traj(
        calls_step(ToolCall("get_balance", {"account": "holiday"}), obs=[{"balance": "300.00"}]),
        calls_step(ToolCall("transfer", {"from_account": "holiday", "to_account": "checking", "amount": 300.0})),
    )
    assert REWARDS.get("consistent_f1")(task, wrong_account, CTX).value == 0.5
    extra_arg = make_traj(calls_step(ToolCall("get_balance", {"account": "holiday", "x": 1})))
    assert REWARDS.get("consistent_f1")(task, extra_arg, CTX).value == 0.0
    assert (
        REWARDS.get("consistent_f1")(
            _sweep_task().__class__(**{**_sweep_task().__dict__, "gold_actions": []}), wrong_account, CTX
        ).value
        is None
    )


def test_consistent_facts_ask_the_stated_facts_as_written_and_a_word_fact_from_the_observations():
    base = _sweep_task()
    stated = Task(**{**base.__dict__, "expected_outputs": ["holiday"]})  # the user names it: it must be said
    assert REWARDS.get("consistent_facts")(stated, _sweep_traj("300.00", 300.0, "300.00"), CTX).value == 0.0
    payee = Task(**{**base.__dict__, "expected_outputs": ["cinema"]})  # only the world knows the payee
    said = make_traj(
        calls_step(ToolCall("get_balance", {"account": "holiday"}), obs=[{"merchant": "bakery"}]),
        reply_step("The newest payment went to the bakery."),
    )
    unsaid = make_traj(
        calls_step(ToolCall("get_balance", {"account": "holiday"}), obs=[{"merchant": "bakery"}]),
        reply_step("I could not tell."),
    )
    assert REWARDS.get("consistent_facts")(payee, said, CTX).value == 1.0
    assert REWARDS.get("consistent_facts")(payee, unsaid, CTX).value == 0.0


def test_reply_facts_is_case_insensitive_needs_every_fact_and_is_1_without_facts():
    task = _balance_task(expected_outputs=["Grocery Store", "63.29"])
    f = REWARDS.get("reply_facts")
    assert f(task, make_traj(reply_step("last: grocery store, $63.29", turn=0)), CTX).value == 1.0
    assert f(task, make_traj(reply_step("last: grocery store", turn=0)), CTX).value == 0.5
    assert f(task, make_traj(calls_step(ADD2)), CTX).value == 0.0  # no reply at all
    nothing = f(_balance_task(expected_outputs=[]), make_traj(), CTX)
    assert nothing.value == 1.0 and nothing.info["n_facts"] == 0


def test_outcome_rules_keep_the_checklist_add_missing_facts_and_derive_calls_where_there_is_no_checklist():
    task = _balance_task(expected_outputs=["142.50", "Frozen"])
    rules = outcome_rules(task)
    assert rules[:3] == [i.rule for i in task.checklist]
    assert rules[3:] == [{"type": "reply_contains", "text": "Frozen"}]  # "142.50" is checked already
    # no checklist (BFCL / tau2): one called rule per distinct gold call, then the facts
    bare = make_task(checklist=[], gold_actions=[[ADD2, ADD2], [ADD3]], expected_outputs=["5"])
    assert outcome_rules(bare) == [
        {"type": "called", "tool": "add", "arguments": {"n": 2}},
        {"type": "called", "tool": "add", "arguments": {"n": 3}},
        {"type": "reply_contains", "text": "5"},
    ]
    res = REWARDS.get("outcome_checklist")(bare, make_traj(calls_step(ADD2), reply_step("total 4")), CTX)
    assert res.value == pytest.approx(1 / 3) and len(res.info["failed"]) == 2
    assert REWARDS.get("checklist")(bare, GOOD, CTX).value is None  # the plain checklist cannot score it
    empty = make_task(checklist=[], gold_actions=[], expected_outputs=[])
    assert REWARDS.get("outcome_checklist")(empty, GOOD, CTX).value is None


def test_builtin_checklists_already_check_every_expected_output():
    from envace.envs import load_tasks

    tasks = [t for suite in ("bank", "shop", "files") for t in load_tasks(suite, "train", n=30)]
    assert any(t.expected_outputs for t in tasks)
    for t in tasks:
        assert outcome_rules(t) == [i.rule for i in t.checklist if i.rule is not None], t.id


def test_product_terms_multiply_and_parse_to_one_canonical_name():
    assert parse_reward_spec("gold_f1 * reply_facts") == {"gold_f1*reply_facts": 1.0}
    assert parse_reward_spec({"gold_f1*reply_facts": 0.8, "checklist": 0.2}) == {
        "gold_f1*reply_facts": 0.8,
        "checklist": 0.2,
    }
    assert reward_names({"gold_f1*reply_facts": 0.8, "checklist": 0.2}) == {"gold_f1", "reply_facts", "checklist"}
    with pytest.raises(UnknownNameError, match="reply_facts"):
        parse_reward_spec("gold_f1*facts")
    for bad in (
        "gold_f1*",
        "gold_f1*gold_f1",
        ["gold_f1*reply_facts", "gold_f1 * reply_facts"],
    ):  # the last: one term twice
        with pytest.raises(ValueError):
            parse_reward_spec(bad)
    task = _balance_task(expected_outputs=["142.50", "rent"])
    traj = make_traj(calls_step(ToolCall("get_balance", {"account": "rent"}), ADD2), reply_step("142.50", turn=0))
    res = make_reward({"gold_f1*reply_facts": 0.5, "gold_exact": 0.5})(task, traj, CTX)
    # gold_f1 = 2/3 (p 1/2, r 1), reply_facts = 1/2 -> term 1/3; gold_exact 0
    term = res.info["gold_f1*reply_facts"]
    assert term["factors"] == {"gold_f1": pytest.approx(2 / 3), "reply_facts": 0.5}
    assert res.info["components"]["gold_f1*reply_facts"] == pytest.approx(1 / 3)
    assert res.value == pytest.approx(0.5 / 3)
    assert term["reply_facts"]["missing"] == ["rent"]


def test_an_unscored_factor_makes_its_product_and_the_whole_reward_unscored_and_it_is_masked():
    task = _checklist_task()
    spec = {"gold_f1*checklist_judge": 0.5, "gold_exact": 0.5}
    res = make_reward(spec)(task, GOOD, RewardContext(judge=FakeJudge("no verdict")))
    assert res.value is None and res.info["unscored_by"] == ["gold_f1*checklist_judge"]
    term = res.info["gold_f1*checklist_judge"]
    assert term["unscored_by"] == ["checklist_judge"] and term["factors"]["gold_f1"] == 1.0
    assert "judge_error" in term["checklist_judge"]
    trajs = [make_traj(*GOOD.steps, tid="a"), make_traj(calls_step(ADD3), tid="b")]
    m = score_trajectories(task, trajs, make_reward(spec), RewardContext(judge=FakeJudge("garbage")))
    assert [t.reward for t in trajs] == [None, None] and m["reward/unscored"] == 2.0
    ok = make_reward(spec)(task, GOOD, RewardContext(judge=FakeJudge(_verdict(True, True, True, True, False, False))))
    assert ok.value == pytest.approx(0.5 * 1.0 * 4 / 6 + 0.5 * 1.0)


def test_trainer_needs_a_judge_for_checklist_judge_inside_a_product_too():
    from envace.config import TrainConfig
    from envace.training.trainer import reward_context

    with pytest.raises(ValueError, match="needs a judge"):
        reward_context(TrainConfig(reward="gold_f1*checklist_judge"), None, None)
