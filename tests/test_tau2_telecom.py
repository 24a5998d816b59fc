"""tau2 telecom: the user acts on their own phone through user-side tools, in the agent's environment (real
mode) or nowhere (rehearsal: applied when the conversation is scored); gold replay reaches tau2's reward."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest

from envace.chat.parsing import render_act
from envace.backends.base import Backend, SamplingParams
from envace.envs import UNEXECUTED, USERS, UserSide, load_tasks, make_env
from envace.envs import tau2 as t2
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.training.sft import GoldTeacher, gold_trajectories
from envace.training.trainer import rows_with_advantages
from envace.core.types import Task, ToolCall, Trajectory, is_error_obs
from tau2.data_model.message import UserMessage

BIG = dict(max_steps=64, max_steps_per_turn=64, max_context_tokens=1 << 22)


@pytest.fixture(scope="module")
def telecom() -> list[Task]:
    return load_tasks("tau2:telecom", "all")


@pytest.fixture(scope="module")
def sample(telecom) -> list[Task]:
    """Five tasks of the default split (seeded), most with user actions."""
    return load_tasks("tau2:telecom", "all", n=5, seed=0)


def by_id(tasks: list[Task], part: str) -> Task:
    return next(t for t in tasks if part in t.id)


def two_toggles(telecom) -> Task:
    """Airplane mode on and roaming off abroad: the user must toggle both (no agent call)."""
    return by_id(telecom, "[mobile_data_issue]airplane_mode_on|user_abroad_roaming_enabled_off[PERSONA:None]")


class ChatScript(Backend):
    """A user backend whose chat replies come from a list (then ``default``); records what it was shown."""

    def __init__(self, replies: list[str], default: str | None = None):
        self.replies, self.default = list(replies), default
        self.seen: list[list[dict[str, str]]] = []

    def generate(self, prompts, params, sessions=None):  # pragma: no cover - chat only
        raise NotImplementedError

    def chat(self, conversations, params):
        self.seen.extend(copy.deepcopy(list(conversations)))
        return [self.replies.pop(0) if self.replies else self.default for _ in conversations]


def call_text(name: str, **arguments) -> str:
    return render_act([ToolCall(name, arguments)])


def run_llm_user(tokenizer, task: Task, replies: list[str], mode: str = "real", **kw) -> tuple[Trajectory, ChatScript]:
    """The task's gold agent (GoldTeacher) against an LLM user played by ``replies``."""
    user = ChatScript(replies, default=kw.pop("default", None))
    user.tokenizer = kw.pop("user_tokenizer", None)  # the user model's (its tool format); None: hermes
    cfg = RolloutConfig(user="llm", **BIG)
    engine = RolloutEngine(GoldTeacher(tokenizer, [task]), cfg, user_backend=user, mode=mode)
    (traj,) = engine.run([task], group_prefix="t", group_size=1)
    return traj, user


# ---------------------------------------------------------------------------------------------- tasks


def test_plan_turns_puts_user_actions_after_the_reply_that_asks_for_them():
    def act(requestor, name):
        return SimpleNamespace(requestor=requestor, name=name, arguments={})

    kinds = {"refuel": "write", "lookup": "read"}
    turns = t2.plan_turns(
        [
            act("user", "a"),
            act("user", "b"),
            act("assistant", "refuel"),
            act("assistant", "lookup"),
            act("user", "c"),
            act("assistant", "lookup"),
        ],
        kinds,
    )
    got = [([c.name for c in t.user], [c.name for c in t.agent]) for t in turns]
    # opening; the user's two actions; the confirmed write and a read; then the user's next action and a read
    assert got == [([], []), (["a", "b"], []), ([], ["refuel", "lookup"]), (["c"], ["lookup"])]


def test_telecom_tasks_carry_the_user_tools_and_tau2s_user_actions_per_turn(telecom):
    from tau2.registry import registry

    assert len(telecom) == 114
    names = [t.name for t in registry.get_env_constructor("telecom")().get_user_tools()]
    for task in telecom:
        actions = t2.tau2_task(task).evaluation_criteria.actions
        assert [t.name for t in task.user_tools] == names
        assert (
            len(task.user_turns)
            == len(task.gold_actions)
            == len(task.gold_replies)
            == len(task.user_actions or task.user_turns)
        )
        assert [c.name for turn in task.user_actions for c in turn] == [
            a.name for a in actions if a.requestor == "user"
        ]
        assert [c.name for c in task.flat_gold()] == [a.name for a in actions if a.requestor == "assistant"]
        for i, calls in enumerate(task.user_actions):  # the reply before a turn of user actions asks for them
            if calls:
                assert i > 0 and all(c.name in task.gold_replies[i - 1] for c in calls)
    assert sum(bool(t.user_actions) for t in telecom) == 94  # the 20 others only need a transfer to a human
    retail = [t2.convert_task("retail", x) for x in t2._domain_info("retail")["tasks"][:5]]
    assert all(not t.user_tools and not t.user_actions for t in retail)


def test_task_with_user_side_round_trips_through_json(telecom):
    task = two_toggles(telecom)
    again = Task.from_dict(json.loads(json.dumps(task.to_dict())))
    assert (
        again.to_dict() == task.to_dict()
        and again.user_actions == task.user_actions
        and again.user_tools == task.user_tools
    )


def test_llm_user_prompt_has_tau2s_tool_guidelines_and_the_user_tools(telecom):
    prompt = t2.LLMUser.system_prompt(two_toggles(telecom))
    assert t2.get_global_user_sim_guidelines(use_tools=True) in prompt
    assert '"name": "toggle_airplane_mode"' in prompt and "<tool_response>" in prompt
    retail = t2.convert_task("retail", t2._domain_info("retail")["tasks"][0])
    assert "# Your tools" not in t2.LLMUser.system_prompt(retail)


# ---------------------------------------------------------------------------------------------- the user's side


def test_user_calls_run_in_the_agents_environment_and_share_its_state(telecom):
    task = by_id(telecom, "[service_issue]airplane_mode_on|overdue_bill_suspension[PERSONA:None]")
    env = make_env(task)

    def bill_status() -> str:
        bills = env.call(ToolCall("get_bills_for_customer", {"customer_id": "C1001"}))
        return next(b["status"] for b in bills if b["bill_id"] == "B1234321")

    assert bill_status() == "Overdue"
    assert "No payment request" in env.user_call(ToolCall("check_payment_request"))
    env.call(ToolCall("send_payment_request", {"customer_id": "C1001", "bill_id": "B1234321"}))  # agent side
    assert "B1234321" in env.user_call(ToolCall("check_payment_request"))  # seen on the user's phone
    assert "has been made" in env.user_call(ToolCall("make_payment"))
    assert bill_status() == "Paid"  # the user's payment reached the agent's database (tau2's sync_tools)
    assert env.n_calls == 3 and env.n_user_calls == 3


def test_invalid_user_calls_are_error_observations_never_exceptions(telecom):
    task = two_toggles(telecom)
    for env in (make_env(task), None):
        side = UserSide(task, env)
        obs, source = side.call(ToolCall("refuel_data", {}))  # an agent tool is not the user's
        assert source == "validation" and obs["error"]["kind"] == "unknown_tool"
        obs, source = side.call(ToolCall("grant_app_permission", {"app_name": 3, "permission": "sms"}))
        assert source == "validation" and obs["error"]["kind"] == "bad_arguments"
        obs, source = side.call(ToolCall("toggle_wifi", {"bogus": 1}))  # fits the schema; the tool itself refuses
        if env is None:
            assert (obs, source) == (UNEXECUTED, "unexecuted")
        else:
            assert source == "real" and obs["error"]["kind"] == "tool_error"
    obs = make_env(task).call(ToolCall("toggle_airplane_mode"))  # and the agent cannot touch the phone
    assert obs["error"]["kind"] == "unknown_tool"


# ---------------------------------------------------------------------------------------------- gold replay


def test_gold_replay_with_the_scripted_users_actions_gets_full_reward(tokenizer, sample):
    assert sum(bool(t.user_actions) for t in sample) >= 3
    trajs = gold_trajectories(tokenizer, sample, RolloutConfig(**BIG), mode="real")
    failures = [(t.id, tr.env_outcome) for t, tr in zip(sample, trajs) if not tr.env_outcome["success"]]
    assert not failures, failures
    for task, tr in zip(sample, trajs):
        done = [c for s in tr.user_steps for c in s.calls]
        assert done == [c for turn in task.user_actions for c in turn]
        assert all(s.sources == ["real"] and not is_error_obs(s.observations[0]) for s in tr.user_steps)
        assert tr.counters.get("user/calls_real", 0) == len(done)
    # without the user's actions the same agent fails every task that needs them
    bare = [copy.deepcopy(t) for t in sample]
    for t in bare:
        t.user_actions = []
    trajs = gold_trajectories(tokenizer, bare, RolloutConfig(**BIG), mode="real")
    assert [tr.env_outcome["success"] for tr in trajs] == [not t.user_actions for t in sample]


@pytest.mark.parametrize("shadow", [False, True])
def test_in_rehearsal_user_actions_run_nowhere_and_count_when_scored(tokenizer, sample, monkeypatch, shadow):
    envs = []
    real_call = UserSide.call
    monkeypatch.setattr(UserSide, "call", lambda self, call: envs.append(self.env) or real_call(self, call))
    trajs = gold_trajectories(tokenizer, sample, RolloutConfig(**BIG), shadow=shadow)
    assert envs and all(e is None for e in envs)  # no real environment, not even the shadow copy
    for task, tr in zip(sample, trajs):
        assert all(s.sources == ["unexecuted"] and s.observations == [UNEXECUTED] for s in tr.user_steps)
        assert len(tr.user_steps) == sum(len(turn) for turn in task.user_actions)
        assert (tr.env_outcome is not None) == shadow
        assert t2.score_trajectory(task, tr).success  # scoring applies them in their place


def test_scoring_puts_user_calls_before_the_message_of_their_turn(tokenizer, telecom):
    task = two_toggles(telecom)
    (tr,) = gold_trajectories(tokenizer, [task], RolloutConfig(**BIG), mode="real")
    msgs = t2.tau2_messages(task, tr)
    kinds = [("user-calls" if m.is_tool_call() else "user") if isinstance(m, UserMessage) else m.role for m in msgs]
    assert kinds == ["user", "assistant", "user-calls", "tool", "user-calls", "tool", "user", "assistant"]
    assert [tc.requestor for m in msgs if isinstance(m, UserMessage) and m.is_tool_call() for tc in m.tool_calls] == [
        "user",
        "user",
    ]
    again = Trajectory.from_dict(json.loads(json.dumps(tr.to_dict())))
    assert again.user_steps == tr.user_steps and t2.score_trajectory(task, again).success
    tr.user_steps[1].sources = ["validation"]  # a call that failed validation never happened
    assert not t2.score_trajectory(task, tr).success


# ---------------------------------------------------------------------------------------------- the LLM user


def test_llm_user_acts_on_its_phone_and_only_its_text_reaches_the_agent(tokenizer, telecom):
    task = two_toggles(telecom)
    replies = [
        "My mobile data is not working.",
        call_text("toggle_airplane_mode"),
        "<tool_call>{not json}</tool_call>",
        call_text("refuel_data", customer_id="C1001"),  # the agent's tool: not on the phone
        call_text("toggle_roaming"),
        "I toggled both.",
        "Great, it works. ###STOP###",
    ]
    tr, user = run_llm_user(tokenizer, task, replies)
    assert [m.content for m in tr.messages if m.role == "user"] == ["My mobile data is not working.", "I toggled both."]
    assert not any("tool_call" in m.content or "Roaming" in m.content for m in tr.messages[1:])
    assert [s.sources for s in tr.user_steps] == [[], ["real"], [], ["validation"], ["real"], [], []]
    assert tr.user_steps[2].parse_error["error"]["kind"] == "bad_format"
    assert (
        tr.counters["user/generations"] == 7
        and tr.counters["user/calls_real"] == 2
        and tr.counters["user/parse_errors"] == 1
    )
    assert tr.env_outcome["success"], tr.env_outcome  # its calls ran in the task's environment
    # its own context: the agent's text as user, its moves and their real results, never the agent's tool traffic
    last = user.seen[5]
    assert last[2:4] == [
        {"role": "assistant", "content": "My mobile data is not working."},
        {"role": "user", "content": task.gold_replies[0]},
    ]
    assert last[-2]["content"] == call_text("toggle_roaming") and "Data Roaming is now ON" in last[-1]["content"]
    assert "bad_format" in last[7]["content"] and "unknown_tool" in last[9]["content"]
    # its generations are no training rows: only Act's
    assert [r.role for r in tr.rows] == ["act"] * tr.counters["act/steps"]
    tr.reward = 1.0
    rows, _, _ = rows_with_advantages([tr], "rolewise", ("act", "rehearse"))
    assert rows == tr.rows


def test_the_llm_user_is_a_config_setting_opened_once_per_process(telecom):
    """``rollout.user_model`` names the user's model (here the tiny one), as a config or ``--set`` gives it; the
    engine opens it once, and its generations are the user's, never training rows."""
    from envace.rollout.engine import user_backend_for

    task = two_toggles(telecom)
    cfg = RolloutConfig(user="llm", user_model="tiny-random", max_steps=2, max_steps_per_turn=1)
    gold = GoldTeacher(user_backend_for("tiny-random").tokenizer, [task])
    (tr,) = RolloutEngine(gold, cfg, mode="real").run([task], group_prefix="t", group_size=1)
    assert RolloutEngine(gold, cfg).user_backend is user_backend_for("tiny-random")
    assert tr.counters["user/generations"] >= 1 and tr.user_steps and {r.role for r in tr.rows} <= {"act", "rehearse"}


def test_llm_user_in_rehearsal_is_told_its_action_ran_nowhere(tokenizer, telecom):
    task = two_toggles(telecom)
    replies = [
        "My data is broken.",
        call_text("toggle_airplane_mode"),
        call_text("toggle_roaming"),
        "Done both.",
        "###STOP###",
    ]
    tr, user = run_llm_user(tokenizer, task, replies, mode="rehearsal")
    assert [s.sources for s in tr.user_steps if s.calls] == [["unexecuted"], ["unexecuted"]]
    assert UNEXECUTED["note"] in user.seen[3][-1]["content"]
    assert tr.env_outcome is None and t2.score_trajectory(task, tr).success


def test_llm_user_that_only_calls_tools_ends_the_conversation(tokenizer, telecom):
    task = two_toggles(telecom)
    tr, _ = run_llm_user(tokenizer, task, ["Help."], default=call_text("check_status_bar"))
    assert tr.counters["user/max_moves"] == 1
    assert [m.content for m in tr.messages if m.role == "user"] == ["Help."]
    assert sum(bool(s.calls) for s in tr.user_steps) == 10  # max_moves generations in the second turn
    with pytest.raises(ValueError, match="user_backend"):
        RolloutEngine(GoldTeacher(tokenizer, [task]), RolloutConfig(user="llm", **BIG), mode="real").run([task])


def test_the_llm_user_s_default_tool_format_is_hermes_word_for_word(telecom):
    task = two_toggles(telecom)
    assert t2.USER_TOOL_INSTRUCTIONS == (
        "These tools act on your own side (your device); only you can use them. To use one, answer with "
        '<tool_call>{"name": NAME, "arguments": {...}}</tool_call> and nothing else; its result comes back to you '
        "in <tool_response> tags and is not shown to the agent. A message without a tool call goes to the agent."
    )
    user = t2.LLMUser(ChatScript([]))  # a backend without a tokenizer, as a chat-only server
    assert t2.LLMUser.system_prompt(task).endswith("\n\n" + t2.USER_TOOL_INSTRUCTIONS)
    assert user.conversation(task, [])[0]["content"] == t2.LLMUser.system_prompt(task)


@pytest.mark.parametrize("fmt, hint", [("llama3_json", "<|python_tag|>"), ("mistral", "[TOOL_CALLS]")])
def test_an_llm_user_is_asked_for_and_parsed_in_its_own_model_s_tool_format(tokenizer, telecom, fmt, hint):
    """A Llama-3 / Mistral user model (its tokenizer's template says so) is told its own call syntax, and its
    calls in that syntax are moves on its phone; a hermes block from it is plain text to the agent."""
    from envace.chat.parsing import TOOL_FORMATS

    task = two_toggles(telecom)
    own = TOOL_FORMATS.get(fmt)
    replies = [
        "My mobile data is not working.",
        own.render([ToolCall("toggle_airplane_mode", {})]),
        own.render([ToolCall("toggle_roaming", {})]),
        call_text("toggle_airplane_mode"),  # hermes: not this model's syntax
        "Great, it works. ###STOP###",
    ]
    user_tok = SimpleNamespace(chat_template="{{ '" + hint + "' }}", added_tokens_encoder={})
    tr, user = run_llm_user(tokenizer, task, replies, user_tokenizer=user_tok)
    assert [s.sources for s in tr.user_steps] == [[], ["real"], ["real"], [], []]
    assert [m.content for m in tr.messages if m.role == "user"] == [replies[0], replies[3]]
    assert tr.env_outcome["success"], tr.env_outcome  # its two toggles ran on the phone
    system = user.seen[0][0]["content"]
    assert "<tool_call>" not in system and own.call in system


def test_llm_user_without_user_tools_never_parses_tool_calls(telecom):
    retail = t2.convert_task("retail", t2._domain_info("retail")["tasks"][0])
    backend = ChatScript([call_text("toggle_wifi")])
    user = USERS.get("llm")(retail, backend=backend, params=SamplingParams(temperature=0.0))
    assert user.reply(retail, [], 0) == call_text("toggle_wifi")  # plain text to the agent, as before
