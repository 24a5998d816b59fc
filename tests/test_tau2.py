"""tau2-bench adapter: tools and execution through tau2's environments, scoring by tau2's own evaluator,
scripted and LLM users."""

from __future__ import annotations

import copy
import json
import time
from collections import Counter

import pytest

from envace.backends.base import Backend, SamplingParams
from envace.envs import USERS, check_env, load_tasks, make_env
from envace.envs import tau2 as t2
from envace.envs.references import record_gold
from envace.chat.parsing import validate_call, render_act
from envace.core.types import Message, Step, Task, ToolCall, Trajectory, is_error_obs


@pytest.fixture(scope="module")
def retail_test() -> list[Task]:
    """A seeded sample of retail's test split (the whole 114-task replay takes about 90 s on 2 cores)."""
    return load_tasks("tau2:retail", "test", n=12, seed=0)


def gold_trajectory(
    task: Task, turns: list[list[ToolCall]] | None = None, replies: list[str] | None = None, env=None
) -> Trajectory:
    """The scripted conversation of a task played with the given calls (default: the gold actions) through
    the real environment: per user turn, the calls one step each, then the reply."""
    turns = task.gold_actions if turns is None else turns
    replies = task.gold_replies if replies is None else replies
    env = env or make_env(task)
    steps, messages = [], [Message("system", task.system_prompt)]
    for i, calls in enumerate(turns):
        messages.append(Message("user", task.user_turns[i]))
        for c in calls:
            obs = env.call(c)
            steps.append(
                Step(user_turn=i, action_text=render_act([c]), calls=[c], observations=[obs], sources=["real"])
            )
            messages += [Message("assistant", tool_calls=[c]), Message("tool", json.dumps(obs))]
        steps.append(Step(user_turn=i, action_text=replies[i], reply=replies[i]))
        messages.append(Message("assistant", replies[i]))
    return Trajectory(id=f"{task.id}-t", task_id=task.id, group_id="g", mode="real", steps=steps, messages=messages)


def score(task: Task, **kw) -> "t2.Score":
    env = make_env(task)
    return env.score(gold_trajectory(task, env=env, **kw))


def test_retail_gold_actions_replayed_through_the_adapter_get_full_marks(retail_test):
    assert len(retail_test) == 12 and all(t.split == "test" for t in retail_test)
    assert sum(len(t.gold_actions) > 1 for t in retail_test) >= 6  # most include write actions
    failures = [(t.id, s.details) for t in retail_test if not (s := score(t)).success]
    assert not failures, failures[:3]


def test_tasks_round_trip_through_json(retail_test):
    task = retail_test[1]
    again = Task.from_dict(json.loads(json.dumps(task.to_dict())))
    assert again.to_dict() == task.to_dict()
    assert score(again).success


def test_corrupted_write_call_scores_zero(retail_test):
    def effective_write(task: Task) -> bool:  # the first write action succeeds in the gold replay
        write = task.gold_actions[1][0]
        return any(r.call == write and not is_error_obs(r.result) for r in record_gold(task))

    task = next(t for t in retail_test if len(t.gold_actions) > 1 and effective_write(t))
    turns = copy.deepcopy(task.gold_actions)
    write = turns[1][0]  # the first write action opens turn 1
    key = (
        "order_id"
        if "order_id" in write.arguments
        else next(k for k, v in write.arguments.items() if isinstance(v, str))
    )
    write.arguments[key] = write.arguments[key] + "0"
    s = score(task, turns=turns)
    assert not s.success and s.reward == 0.0
    assert s.details["db_match"] is False


def test_communicate_info_must_be_said(retail_test):
    task = next(t for t in retail_test if t.expected_outputs)
    assert all(info in task.gold_replies[-1] for info in task.expected_outputs)
    assert score(task).success
    silent = [r if i < len(task.gold_replies) - 1 else "Done." for i, r in enumerate(task.gold_replies)]
    s = score(task, replies=silent)
    assert not s.success and s.details["reward_breakdown"]["COMMUNICATE"] == 0.0


def test_truncated_episode_scores_zero(retail_test):
    task = retail_test[0]
    env = make_env(task)
    traj = gold_trajectory(task, env=env)
    traj.truncated = "max_steps"
    assert env.score(traj).reward == 0.0


def test_rehearsed_observations_do_not_enter_the_evaluator(retail_test):
    task = next(t for t in retail_test if t.flat_gold())
    env = make_env(task)
    traj = gold_trajectory(task, env=env)
    for step in traj.steps:
        step.observations = [{"invented": True} for _ in step.calls]
        step.sources = ["rehearsed" for _ in step.calls]
    assert env.score(traj).success  # the evaluator re-executes the calls


def test_tools_come_from_tau2_schemas_and_gold_calls_fit_them(retail_test):
    from tau2.registry import registry

    names = {t.name for t in registry.get_env_constructor("retail")().get_tools()}
    for task in retail_test:
        assert {t.name for t in task.tools} == names
        for call in task.flat_gold():
            assert validate_call(call, task.tools) is None, (task.id, call)
    assert "<policy>" in retail_test[0].system_prompt


def test_tau2s_read_and_write_tool_types_mark_the_tools_read_only_or_not(retail_test):
    from tau2.environment.toolkit import ToolType, get_tool_types
    from tau2.registry import registry

    types = get_tool_types(registry.get_env_constructor("retail")().tools)
    flags = {t.name: t.read_only for t in retail_test[0].tools}
    assert flags["get_order_details"] is True and flags["cancel_pending_order"] is False
    for name, kind in types.items():
        assert flags[name] is {ToolType.READ: True, ToolType.WRITE: False}.get(kind), name


def test_tool_errors_are_observations(retail_test):
    env = make_env(retail_test[0])
    obs = env.call(ToolCall("get_order_details", {"order_id": "#W0000000"}))
    assert is_error_obs(obs) and obs["error"]["kind"] == "tool_error" and "not found" in obs["error"]["message"].lower()
    obs = env.call(ToolCall("get_order_details", {}))
    assert obs["error"]["kind"] == "bad_arguments"


def test_calculate_is_evaluated_without_eval(retail_test, tmp_path):
    env = make_env(retail_test[0])
    assert env.call(ToolCall("calculate", {"expression": "(2 + 3) * 4 / 3"})) == 6.67
    t0 = time.time()
    obs = env.call(ToolCall("calculate", {"expression": "9**9**9**9"}))  # passes tau2's character filter
    assert is_error_obs(obs) and time.time() - t0 < 2.0
    marker = tmp_path / "pwned"
    obs = env.call(ToolCall("calculate", {"expression": f"__import__('os').system('touch {marker}')"}))
    assert is_error_obs(obs) and not marker.exists()
    with pytest.raises(ValueError):
        t2.safe_arithmetic("(1).__class__")


def test_scripted_user_turns_follow_the_write_actions(retail_test):
    task = next(t for t in retail_test if len(t.gold_actions) > 1)
    kinds = t2._domain_info("retail")["kinds"]
    n_writes = sum(kinds[c.name] == "write" for c in task.flat_gold())
    assert len(task.user_turns) == len(task.gold_actions) == len(task.gold_replies) == 1 + n_writes
    assert all(kinds[turn[0].name] == "write" for turn in task.gold_actions[1:])
    user = USERS.get("scripted")(task)
    said = [user.reply(task, [], i) for i in range(len(task.user_turns) + 1)]
    assert said[:-1] == task.user_turns and said[-1] is None
    assert "Known" in task.metadata["user_system_prompt"] or "known" in task.metadata["user_system_prompt"]


class CannedBackend(Backend):
    """A backend whose chat replies come from a list; it records the conversations it was given."""

    def __init__(self, replies: list[str]):
        self.replies = list(replies)
        self.seen: list[list[dict[str, str]]] = []

    def generate(self, prompts, params, sessions=None):  # pragma: no cover - chat only
        raise NotImplementedError

    def chat(self, conversations, params):
        self.seen.extend(copy.deepcopy(list(conversations)))
        return [self.replies.pop(0) for _ in conversations]


def test_llm_user_drives_a_backend_with_the_task_persona(retail_test):
    task = retail_test[0]
    backend = CannedBackend(["Hi, I want to exchange an item.", "Yes please. ###STOP###"])
    user = USERS.get("llm")(task, backend=backend, params=SamplingParams(temperature=0.0))
    first = user.reply(task, [Message("system", task.system_prompt)], 0)
    assert first == "Hi, I want to exchange an item."
    conv = backend.seen[0]
    assert (
        conv[0]["role"] == "system"
        and str(t2.tau2_task(task).user_scenario.instructions.reason_for_call) in conv[0]["content"]
    )
    assert conv[1] == {"role": "user", "content": t2.FIRST_AGENT_MESSAGE}
    chat = [
        Message("system", task.system_prompt),
        Message("user", first),
        Message("assistant", tool_calls=[ToolCall("find_user_id_by_email", {"email": "a@b.c"})]),
        Message("tool", "{}"),
        Message("assistant", "Can you confirm?"),
    ]
    assert user.reply(task, chat, 1) is None and user.ended == "stop"
    roles = [m["role"] for m in backend.seen[1]]
    assert roles == ["system", "user", "assistant", "user"]  # tool traffic hidden, roles flipped
    with pytest.raises(ValueError):
        USERS.get("llm")(task)


def test_splits_come_from_tau2():
    retail = Counter(t2.convert_task("retail", x).split for x in t2._domain_info("retail")["tasks"])
    assert retail == {"train": 74, "test": 40}
    test = load_tasks("tau2:retail", "test", n=3, seed=5)
    assert [t.split for t in test] == ["test"] * 3
    mock = load_tasks("tau2:mock", "all")
    assert len(mock) == 9 and {t.split for t in mock} <= {"train", "test"}
    with pytest.raises(ValueError):
        load_tasks("tau2:nowhere", "all")


@pytest.mark.parametrize("domain", ["retail", "airline", "telecom", "mock"])
def test_check_env_passes(domain):
    tasks = load_tasks(f"tau2:{domain}", "all", n=2, seed=1)
    assert len(tasks) == 2
    for task in tasks:
        assert task.env == f"tau2:{domain}"
        report = check_env(task)
        assert report.ok, report.problems
