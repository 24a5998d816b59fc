"""verifiers tasksets as envace suites (envace.envs.verifiers_env): a small verifiers environment defined here (a
Taskset of arithmetic questions, a Toolset of two Python tools with a typed state, a rubric of two reward functions,
one async) loads as tasks with the tools' schemas, runs its real tools, rolls out in real mode, and is scored by its
rubric; bad specs are one-line errors naming the choices."""

from __future__ import annotations

import pytest

vf = pytest.importorskip("verifiers.v1")

from envace.backends.scripted import ScriptedBackend  # noqa: E402
from envace.chat.parsing import render_act  # noqa: E402
from envace.core.types import Step, ToolCall, Trajectory  # noqa: E402
from envace.envs import check_env, load_tasks, make_env  # noqa: E402
from envace.rewards.functions import REWARDS, RewardContext, make_reward  # noqa: E402
from envace.rollout.engine import RolloutConfig, RolloutEngine  # noqa: E402

# ---------------------------------------------------------------------------------- the verifiers environment

QUESTIONS = [("What is 2 + 3?", 2, 3), ("What is 10 + 32?", 10, 32), ("What is 7 + 8?", 7, 8), ("What is 1 + 1?", 1, 1)]
QUESTIONS += [(f"What is {a} + {b}?", a, b) for a, b in [(4, 9), (12, 30), (5, 5), (6, 11)]]


class CalcState(vf.State):
    notes: list[str] = []


class CalcConfig(vf.ToolsetConfig):
    pass


class Calc(vf.Toolset[CalcConfig, CalcState]):
    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers and return the sum."""
        return a + b

    @vf.tool
    async def note(self, text: str) -> int:
        """Keep a note; returns how many notes are kept."""
        if not text:
            raise ValueError("an empty note")
        self.state.notes.append(text)
        return len(self.state.notes)


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @classmethod
    def toolsets(cls, config):
        return [Calc(CalcConfig())]

    @vf.reward
    async def correct(self, task, trace) -> float:  # verifiers' reward functions are async: awaited by the adapter
        last = trace.messages[-1]
        return 1.0 if last.role == "assistant" and task.answer in (last.content or "").split() else 0.0

    @vf.reward(weight=0.5)
    async def used_tool(self, trace) -> float:
        return 1.0 if any(m.role == "tool" for m in trace.messages) else 0.0


class SumTaskset(vf.Taskset[SumTask]):
    def load(self):
        for i, (q, a, b) in enumerate(QUESTIONS):
            yield SumTask(SumData(id=f"sum{i}", prompt=q, answer=str(a + b)), self.config.task)


def make_taskset():
    return SumTaskset(vf.TasksetConfig())


NOT_A_TASKSET = 42


def returns_a_dict():
    return {"not": "a taskset"}


class SilentTaskset(vf.Taskset[SumTask]):
    def load(self):
        yield SumTask(SumData(id="silent", prompt=None, answer="0"), self.config.task)


SPEC = f"verifiers:{__file__}:SumTaskset"
ANSWERS = {q: str(a + b) for q, a, b in QUESTIONS}


def _task(split="all", i=0):
    return load_tasks(SPEC, split)[i]


# ---------------------------------------------------------------------------------- tasks and tools


def test_the_taskset_loads_as_tasks_with_the_tools_and_their_schemas():
    tasks = load_tasks(SPEC, "all")
    assert [t.user_turns for t in tasks] == [[q] for q, _, _ in QUESTIONS]
    assert {t.env for t in tasks} == {SPEC}
    assert tasks[0].id.startswith("vf_") and tasks[0].id.endswith("_sum0")
    (t,) = [t for t in tasks if t.user_turns == ["What is 2 + 3?"]]
    tools = {s.name: s for s in t.tools}
    assert set(tools) == {"calc_add", "calc_note"}  # verifiers' <server>_<tool> names
    assert tools["calc_add"].description == "Add two integers and return the sum."
    assert tools["calc_add"].parameters["properties"] == {
        "a": {"title": "A", "type": "integer"},
        "b": {"title": "B", "type": "integer"},
    }
    assert tools["calc_add"].parameters["required"] == ["a", "b"]
    assert set(t.env_config) == {"taskset", "index", "key"} and t.expected_outputs == []  # no answer in the task
    assert "answer" not in t.metadata and "5" not in t.system_prompt + t.user_turns[0].replace("2 + 3", "")
    # stable hash splits, disjoint, together the taskset; a function returning the taskset names the same tasks
    train, test = load_tasks(SPEC, "train"), load_tasks(SPEC, "test")
    assert train and test and sorted(t.id for t in train + test) == sorted(t.id for t in tasks)
    same = load_tasks(f"verifiers:{__file__}:make_taskset", "all")
    assert [t.user_turns for t in same] == [t.user_turns for t in tasks]
    assert len(load_tasks(SPEC, "all", n=3, seed=1)) == 3


def test_a_call_runs_the_real_python_tool_and_keeps_the_toolset_state():
    env = make_env(_task())
    try:
        assert env.call(ToolCall("calc_add", {"a": 2, "b": 40})) == {"result": 42}
        assert env.call(ToolCall("calc_note", {"text": "first"})) == {"result": 1}
        assert env.call(ToolCall("calc_note", {"text": "second"})) == {"result": 2}
        assert env.state()["toolsets"]["calc"]["notes"] == ["first", "second"]
        bad = env.call(ToolCall("calc_add", {"a": "two", "b": 3}))  # schema check: never reaches the tool
        assert bad["error"]["kind"] == "bad_arguments"
        raised = env.call(ToolCall("calc_note", {"text": ""}))  # the tool raised: an observation, not a crash
        assert raised["error"]["kind"] == "tool_error" and "an empty note" in raised["error"]["message"]
        unknown = env.call(ToolCall("rm_rf", {}))
        assert unknown["error"]["kind"] == "unknown_tool"
    finally:
        env.close()
    fresh = make_env(_task())  # a fresh environment starts from a fresh state
    try:
        assert fresh.state()["toolsets"]["calc"]["notes"] == []
    finally:
        fresh.close()
    report = check_env(_task(), calls=[ToolCall("calc_note", {"text": "x"}), ToolCall("calc_add", {"a": 1, "b": 2})])
    assert report.ok, report.problems


# ---------------------------------------------------------------------------------- rollouts and the rubric


def policy(right: bool):
    """Act: add the two numbers with the tool, then answer (the right sum, or one more)."""

    def respond(prompt: str) -> str:
        question = next(q for q in ANSWERS if q in prompt)
        a, b = (int(x) for x in question.removeprefix("What is ").rstrip("?").split(" + "))
        if "<|im_start|>tool" not in prompt:
            return render_act([ToolCall("calc_add", {"a": a, "b": b})])
        return f"The answer is {a + b if right else a + b + 1} ."

    return respond


def test_a_real_rollout_is_scored_by_the_rubric_higher_for_the_right_answer(tokenizer):
    tasks = load_tasks(SPEC, "all", n=2, seed=0)
    cfg = RolloutConfig(max_steps=4)
    right = RolloutEngine(ScriptedBackend(tokenizer, policy(True)), cfg, mode="real").run(tasks, group_size=1)
    wrong = RolloutEngine(ScriptedBackend(tokenizer, policy(False)), cfg, mode="real").run(tasks, group_size=1)
    for r, w in zip(right, wrong):
        assert r.steps[0].sources == ["real"]
        a, b = r.steps[0].calls[0].arguments["a"], r.steps[0].calls[0].arguments["b"]
        assert r.steps[0].observations == [{"result": a + b}]  # the real tool's answer
        assert r.env_outcome["success"] is True and r.env_outcome["reward"] == 1.0
        assert r.env_outcome["details"]["rewards"]["correct"] == {"score": 1.0, "weight": 1.0}
        assert w.env_outcome["success"] is False
        assert w.env_outcome["reward"] == pytest.approx(0.5 / 1.5)  # only used_tool (weight 0.5)
    grounded = make_reward("grounded")
    assert [grounded(t, r, RewardContext()).value for t, r in zip(tasks, right)] == [1.0, 1.0]
    assert [grounded(t, w, RewardContext()).value for t, w in zip(tasks, wrong)] == [0.0, 0.0]


def test_the_rubric_reward_scores_a_rehearsed_trajectory_without_running_a_tool():
    task = next(t for t in load_tasks(SPEC, "all") if t.user_turns == ["What is 10 + 32?"])
    reward = REWARDS.get("verifiers_rubric")

    def traj(answer: str, observation) -> Trajectory:
        steps = [
            Step(user_turn=0, action_text="", calls=[ToolCall("calc_add", {"a": 10, "b": 32})], sources=["rehearse"]),
            Step(user_turn=0, action_text=f"It is {answer} .", reply=f"It is {answer} ."),
        ]
        steps[0].observations = [observation]
        return Trajectory(id="t", task_id=task.id, group_id="g", mode="rehearsal", steps=steps)

    right = reward(task, traj("42", {"result": 42}), RewardContext())
    wrong = reward(task, traj("41", {"result": 41}), RewardContext())
    no_tool = Trajectory(id="t", task_id=task.id, group_id="g", mode="rehearsal")
    no_tool.steps = [Step(user_turn=0, action_text="42", reply="42")]
    assert right.value == 1.0 and right.info["success"] is True
    assert wrong.value == pytest.approx(1 / 3) and wrong.value < right.value
    assert reward(task, no_tool, RewardContext()).value == pytest.approx(2 / 3)
    assert right.info["rewards"]["used_tool"] == {"score": 1.0, "weight": 0.5}
    training = make_reward({"verifiers_rubric": 0.5, "grounded": 0.5})  # composes like any registered reward
    real = traj("42", {"result": 42})
    real.env_outcome = {"success": True, "reward": 1.0, "details": {}, "n_calls": 1}
    assert training(task, real, RewardContext()).value == 1.0
    other = load_tasks("bank", "train", n=1)[0]
    assert reward(other, no_tool, RewardContext()).value is None  # not a verifiers task: unscored


@pytest.mark.slow
def test_a_real_rollout_with_the_tiny_model_runs_and_is_scored(tiny):
    from envace.backends.hf import HFBackend
    from envace.backends.base import SamplingParams

    model, tok = tiny
    tasks = load_tasks(SPEC, "all", n=2, seed=0)
    cfg = RolloutConfig(max_steps=2, act=SamplingParams(temperature=1.0, max_new_tokens=24))
    trajs = RolloutEngine(HFBackend(model, tok), cfg, mode="real").run(tasks, group_size=2)
    assert len(trajs) == 4
    for tr in trajs:
        assert tr.steps and tr.env_outcome is not None and "error" not in tr.env_outcome, tr.env_outcome
        assert set(tr.env_outcome["details"]["rewards"]) == {"correct", "used_tool"}
        assert 0.0 <= tr.env_outcome["reward"] <= 1.0


# ---------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "spec,split,message",
    [
        ("verifiers:", "train", "the verifiers suite needs a taskset: 'verifiers:<module>:<name>'"),
        ("verifiers:no_such_module_x:Tasks", "train", "module 'no_such_module_x' does not import (ModuleNotFoundError"),
        (f"verifiers:{__file__}:Nope", "train", "has no 'Nope'; its tasksets: SilentTaskset, SumTaskset"),
        (f"verifiers:{__file__}:NOT_A_TASKSET", "train", "'NOT_A_TASKSET' is of type int, not a verifiers Taskset"),
        (f"verifiers:{__file__}:returns_a_dict", "train", "returns_a_dict() returned an object of type dict, not a"),
        (f"verifiers:{__file__}:SilentTaskset", "all", "has no prompt (the user opens the conversation)"),
        ("verifiers:/no/such/file.py:Tasks", "train", "no such file '/no/such/file.py'"),
        ("verifiers:no-such-taskset-x", "train", "is not an installed taskset package"),
        (SPEC, "dev", "unknown split 'dev' for verifiers tasksets; valid: train, test, all"),
    ],
    ids=["empty", "no_module", "no_name", "not_a_taskset", "returns_other", "no_prompt", "no_file", "no_id", "split"],
)
def test_bad_input_is_a_one_line_error_naming_the_choices(spec, split, message):
    with pytest.raises(ValueError) as err:
        load_tasks(spec, split)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_without_verifiers_installed_the_suite_names_the_extra_to_install():
    import subprocess
    import sys

    script = (
        "import sys\n"
        "sys.modules['verifiers'] = None  # as if not installed\n"
        "from envace.envs import load_tasks\n"
        "try:\n"
        "    load_tasks('verifiers:mymod:Tasks')\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("MissingExtraError environment 'verifiers' needs optional packages"), p.stdout
    assert "install the 'verifiers' extra with: bash requirements/install-bench-envs.sh" in p.stdout
