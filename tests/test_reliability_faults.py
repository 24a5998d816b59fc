"""Faults of the world around the policy: tools that raise, hang, return non-JSON or 10 MB; judges that fail or
answer garbage; an HTTP backend whose server is down. The rollout goes on with an error observation, every fault
is counted, a failed judgement masks the trajectory (reward None) instead of scoring it 0."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from envace.chat.parsing import render_act
from envace.backends.base import Backend, SamplingParams
from envace.backends.scripted import ScriptedBackend
from envace.envs import ENVS, Environment, Score, ToolError
from envace.rewards.functions import RewardContext, make_reward, score_trajectories
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.training.trainer import rows_with_advantages
from envace.core.types import ChecklistItem, Task, ToolCall, ToolSpec, Trajectory, is_error_obs

RELEASE = threading.Event()  # lets the hung tool's thread end when the test is over
NO_ARGS = {"type": "object", "properties": {}, "additionalProperties": False}


class Circular(dict):
    pass


class FaultyEnv(Environment):
    """Each tool misbehaves in one way; ``ok`` works, ``refuse`` reports an expected failure."""

    call_timeout_s = 0.5

    def _execute(self, call: ToolCall):
        if call.name == "ok":
            return {"ok": True}
        if call.name == "refuse":
            raise ToolError("not allowed")
        if call.name == "raises":
            raise RuntimeError("boom")
        if call.name == "hangs":
            RELEASE.wait(60)
            return {"late": True}
        if call.name == "circular":
            d = Circular()
            d["self"] = d
            return d
        if call.name == "nan":
            return {"value": float("nan")}
        if call.name == "odd_types":
            return {"when": object(), "tags": {1, 2}}  # shown as text, counted
        if call.name == "huge":
            return {"blob": "x" * 10_000_000}
        raise AssertionError(call.name)

    def state(self):
        return {}

    def score(self, traj: Trajectory) -> Score:
        return Score(success=True, reward=1.0)


TOOLS = ["ok", "refuse", "raises", "hangs", "circular", "nan", "odd_types", "huge"]
if "reliability_faulty" not in ENVS:
    ENVS.add("reliability_faulty", FaultyEnv)


@pytest.fixture(autouse=True, scope="module")
def _release_hung_threads():
    yield
    RELEASE.set()


def faulty_task(i: int = 0) -> Task:
    return Task(
        id=f"faulty-{i}",
        env="reliability_faulty",
        system_prompt="Call the tools.",
        user_turns=["Try every tool."],
        tools=[ToolSpec(n, f"the {n} tool", NO_ARGS) for n in TOOLS],
        gold_actions=[[ToolCall("ok", {})]],
    )


def test_every_tool_fault_becomes_an_error_observation_and_is_counted(tokenizer):
    script = iter([render_act([ToolCall(n, {})]) for n in TOOLS] + ["All tools tried."])
    be = ScriptedBackend(tokenizer, lambda prompt: next(script))
    cfg = RolloutConfig(max_steps=len(TOOLS) + 1, max_steps_per_turn=len(TOOLS) + 1)
    t0 = time.perf_counter()
    (traj,) = RolloutEngine(be, cfg, mode="real").run([faulty_task()], group_size=1)
    assert time.perf_counter() - t0 < 20  # the hung tool costs its timeout, not the 60 s it would take
    obs = {s.calls[0].name: s.observations[0] for s in traj.steps if s.calls}
    kinds = {n: (o["error"]["kind"] if is_error_obs(o) else "ok") for n, o in obs.items()}
    assert kinds == {
        "ok": "ok",
        "refuse": "tool_error",
        "raises": "tool_exception",
        "hangs": "timeout",
        "circular": "tool_exception",
        "nan": "tool_exception",
        "odd_types": "ok",
        "huge": "too_large",
    }
    assert "RuntimeError: boom" in obs["raises"]["error"]["message"] and "0.5s" in obs["hangs"]["error"]["message"]
    assert isinstance(obs["odd_types"]["when"], str) and isinstance(obs["odd_types"]["tags"], str)
    # the rollout went on to the end, and every fault is visible in the trajectory's counters
    assert traj.truncated is None and traj.steps[-1].reply == "All tools tried."
    assert traj.counters["env/tool_exception"] == 1 and traj.counters["env/timeout"] == 1
    assert traj.counters["env/non_json"] == 3 and traj.counters["env/too_large"] == 1  # circular, nan, odd_types
    # what reached the Act context is small and strict JSON
    for m in traj.messages:
        if m.role == "tool":
            assert len(m.content) < 1000
            json.loads(m.content, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


def test_timeout_is_off_by_default_and_per_instance():
    env = FaultyEnv(faulty_task())
    env.call_timeout_s = None
    assert Environment.call_timeout_s is None
    t = threading.Thread(target=env.call, args=(ToolCall("hangs", {}),), daemon=True)
    t.start()
    t.join(0.8)
    assert t.is_alive()  # without a timeout the call waits for the tool
    env2 = FaultyEnv(faulty_task())
    env2.call_timeout_s = 0.2
    assert env2.call(ToolCall("hangs", {}))["error"]["kind"] == "timeout" and env2.faults == {"timeout": 1}
    assert env2.call(ToolCall("ok", {})) == {"ok": True}  # the environment stays usable
    assert env2.call(ToolCall("refuse", {}))["error"]["kind"] == "tool_error" and env2.faults == {"timeout": 1}


def test_faults_in_a_batch_do_not_disturb_the_other_trajectories(tokenizer):
    """Two tasks, K=2: the faulty calls of one trajectory leave the others' observations intact."""
    tasks = [faulty_task(0), faulty_task(1)]
    tasks[0].user_turns, tasks[1].user_turns = ["Call raises."], ["Just call ok."]
    be = ScriptedBackend(
        tokenizer,
        lambda p: (
            (render_act([ToolCall("raises", {})]) if "Call raises." in p else render_act([ToolCall("ok", {})]))
            if "<|im_start|>tool" not in p
            else "done"
        ),
    )
    trajs = RolloutEngine(be, RolloutConfig(max_steps=3), mode="real").run(tasks, group_size=2)
    assert [t.steps[0].observations[0].get("error", {}).get("kind", "ok") for t in trajs] == ["tool_exception"] * 2 + [
        "ok"
    ] * 2
    assert all(t.steps[-1].reply == "done" for t in trajs)
    assert [t.counters.get("env/tool_exception", 0) for t in trajs] == [1, 1, 0, 0]


# ------------------------------------------------------------------------------------------------- judge


class FlakyJudge(Backend):
    """A judge that, call by call, raises, answers garbage, answers too few items, or answers well."""

    def __init__(self, replies):
        self.replies = list(replies)

    def generate(self, prompts, params, sessions=None):
        raise NotImplementedError

    def chat(self, conversations, params):
        r = self.replies.pop(0)
        if isinstance(r, Exception):
            raise r
        return r


def _judged_group():
    task = Task(
        id="j",
        env="bank",
        system_prompt="",
        user_turns=["hi"],
        tools=[],
        gold_actions=[[]],
        checklist=[ChecklistItem("a"), ChecklistItem("b")],
    )
    trajs = [Trajectory(id=f"t{i}", task_id="j", group_id="g", mode="rehearsal") for i in range(6)]
    return task, trajs


GOOD = '{"items": [{"index": 0, "satisfied": true}, {"index": 1, "satisfied": false}]}'
BAD_REPLIES = [
    ConnectionError("judge server down"),
    "I think it is fine.",  # no JSON
    '{"items": [{"index": 0, "satisfied": true}]}',  # an item missing
    '{"items": [{"index": 0, "satisfied": "yes"}, {"index": 1, "satisfied": true}]}',  # not a boolean
    ["two", "replies"],  # wrong number of replies
    GOOD,
]


def test_failed_or_malformed_judgements_are_masked_and_counted():
    task, trajs = _judged_group()
    ctx = RewardContext(judge=FlakyJudge([r if isinstance(r, (Exception, list)) else [r] for r in BAD_REPLIES]))
    m = score_trajectories(task, trajs, make_reward({"gold_f1": 0.5, "checklist_judge": 0.5}), ctx)
    assert [t.reward for t in trajs] == [None] * 5 + [0.5 * 1.0 + 0.5 * 0.5]
    assert m["reward/unscored"] == 5.0 and m["reward/n"] == 6.0
    for t in trajs[:5]:
        assert t.reward_info["unscored_by"] == ["checklist_judge"] and t.reward_info["checklist_judge"]["judge_error"]
    assert "ConnectionError" in trajs[0].reward_info["checklist_judge"]["judge_error"]


def test_trainer_scoring_masks_unscored_trajectories_out_of_the_update(tokenizer):
    from envace.envs import load_tasks
    from envace.training.sft import gold_trajectories

    tasks = load_tasks("bank", "train", n=1)
    trajs = gold_trajectories(tokenizer, tasks * 4)
    assert len({t.id for t in trajs}) == 4
    for t in trajs:
        t.group_id = "g"
    ctx = RewardContext(
        judge=FlakyJudge([[GOOD.replace("true", "false")], RuntimeError("judge crashed"), ["garbage"], [GOOD]])
    )
    for t in tasks:
        t.checklist = [ChecklistItem("a"), ChecklistItem("b")]
    m = score_trajectories({tasks[0].id: tasks[0]}, trajs, make_reward("checklist_judge"), ctx)
    assert m["reward/unscored"] == 2 and [t.reward for t in trajs] == [0.0, None, None, 0.5]
    rows, adv, _ = rows_with_advantages(trajs, "rolewise", ("act", "rehearse"))
    assert {r.traj_id for r in rows} == {trajs[0].id, trajs[3].id} and len(adv) == len(rows)


# ------------------------------------------------------------------------------------------------- HTTP backend


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return port


def test_http_backend_that_is_down_fails_clearly_after_bounded_retries():
    from envace.backends.base import BackendError
    from envace.backends.http import HTTPBackend

    url = f"http://127.0.0.1:{_closed_port()}/v1"
    backend = HTTPBackend(url, model="m", timeout=2.0, max_retries=2, backoff=0.01, max_backoff=0.05)
    t0 = time.perf_counter()
    with pytest.raises(BackendError) as e:
        backend.chat([[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=4))
    assert time.perf_counter() - t0 < 10  # bounded: 3 attempts, tiny backoff
    msg = str(e.value)
    assert url in msg and "3 attempt(s)" in msg and "\n" not in msg
    assert backend.stats["retries"] == 2


def test_a_judge_whose_server_is_down_leaves_the_trajectory_unscored():
    from envace.backends.http import HTTPBackend

    task, trajs = _judged_group()
    judge = HTTPBackend(f"http://127.0.0.1:{_closed_port()}/v1", model="m", timeout=2.0, max_retries=1, backoff=0.01)
    m = score_trajectories(task, trajs[:2], make_reward("checklist_judge"), RewardContext(judge=judge))
    assert m["reward/unscored"] == 2.0 and all(t.reward is None for t in trajs[:2])
    err = trajs[0].reward_info["checklist_judge"]["judge_error"]
    assert "BackendError" in err and "2 attempt(s)" in err
