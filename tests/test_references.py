"""Reference examples never leak a held-out task's answer: every suite's test split is scanned for references that
share a call with the task's gold actions, that reveal a value only its expected outputs hold, or that do not
come from another train task; plus the chooser's rules on a hand-made pool, the oracle ablation and the JSON form.

The scan helpers use only the task data model (no ``envace.envs.references``), so the scan also runs against
code from before references were drawn from other tasks (where it counted 40/40 BFCL and tau2 tasks leaking)."""

from __future__ import annotations

import json
import re

import pytest

from envace.envs import load_tasks
from envace.core.types import ReferenceExample, Task, ToolCall, ToolSpec, dumps


def _has(text: str, value: str) -> bool:
    """``value`` in ``text`` as a whole token, case-insensitively (``42.50`` is not in ``142.50``)."""
    return re.search(r"(?<![0-9a-z])" + re.escape(value.lower()) + r"(?![0-9a-z])", text.lower()) is not None


def answer_only_values(task: Task) -> list[str]:
    """Expected outputs the task does not show the agent (system prompt, user turns, tool schemas: a status
    such as "shipped" is an enum value of the schema), ``$`` dropped."""
    shown = "\n".join([task.system_prompt, *task.user_turns, *(json.dumps(t.to_dict()) for t in task.tools)])
    values = [e.strip().lstrip("$") for e in task.expected_outputs]
    return [v for v in values if len(v) >= 3 and not _has(shown, v)]


def leak_counts(tasks: list[Task], train_ids: set[str]) -> dict[str, int]:
    """How many tasks have a reference that is one of their gold calls, that reveals an answer-only value, or
    that is not a record of another train task."""
    gold_call = reveals = not_other_train = 0
    for t in tasks:
        gold = {c.key() for c in t.flat_gold()}
        hidden = answer_only_values(t)
        texts = [r.call.key() + " " + dumps(r.result) for r in t.references]
        gold_call += any(r.call.key() in gold for r in t.references)
        reveals += any(_has(text, v) for text in texts for v in hidden)
        not_other_train += any(
            getattr(r, "source", "") in ("", t.id) or getattr(r, "source", "") not in train_ids for r in t.references
        )
    return {"tasks": len(tasks), "gold_call": gold_call, "reveals_answer": reveals, "not_other_train": not_other_train}


def assert_no_leaks(tasks: list[Task], train_ids: set[str], min_with_refs: float) -> None:
    counts = leak_counts(tasks, train_ids)
    assert counts["tasks"] and counts == {**counts, "gold_call": 0, "reveals_answer": 0, "not_other_train": 0}, counts
    with_refs = sum(bool(t.references) for t in tasks)
    assert with_refs >= min_with_refs * len(tasks), (with_refs, len(tasks))  # grounding is kept, not dropped


@pytest.mark.parametrize("domain", ["bank", "shop", "files"])
def test_builtin_test_tasks_get_references_of_other_train_tasks_only(domain):
    tasks = load_tasks(domain, "test", n=100)
    train_ids = {f"{domain}-train-{i:06d}" for i in range(10_000)}
    assert_no_leaks(tasks, train_ids, min_with_refs=0.95)


@pytest.mark.parametrize("suite", ["bank-world", "shop-world", "files-world", "shop-world-decide"])
@pytest.mark.parametrize("split", ["val", "test"])
def test_persistent_suites_held_out_tasks_get_references_of_other_train_tasks_only(suite, split):
    """In a persistent world a record of another train task may show the same customer's data: none may be one of
    the task's gold calls or reveal one of its answers."""
    tasks = load_tasks(suite, split, n=100)
    train_ids = {f"{suite}-train-{i:06d}" for i in range(10_000)}
    assert_no_leaks(tasks, train_ids, min_with_refs=0.95)


def test_bfcl_test_tasks_of_every_category_get_references_of_other_train_tasks_only():
    from envace.envs.bfcl import multi_turn as bfcl

    tasks = load_tasks("bfcl", "test")
    assert {t.env_config["category"] for t in tasks} == set(bfcl.CATEGORIES)
    train_ids = {e["id"] for c in bfcl.CATEGORIES for e in bfcl._raw_entries(c)[0] if bfcl.split_of(e["id"]) == "train"}
    assert_no_leaks(tasks, train_ids, min_with_refs=0.95)


@pytest.mark.parametrize("domain,min_with_refs", [("airline", 0.9), ("retail", 0.9), ("mock", 0.5), ("telecom", 0.3)])
def test_tau2_test_tasks_get_references_of_other_train_tasks_only(domain, min_with_refs):
    from envace.envs import tau2

    tasks = load_tasks(f"tau2:{domain}", "test")
    train_ids = {
        t.id for t in (tau2.convert_task(domain, t2) for t2 in tau2._domain_info(domain)["tasks"]) if t.split == "train"
    }
    assert_no_leaks(tasks, train_ids, min_with_refs)


def test_train_tasks_never_get_their_own_records():
    tasks = load_tasks("bank", "train", n=80)  # the first 64 are the pool's sources
    assert all(r.source != t.id for t in tasks for r in t.references)
    assert leak_counts(tasks, {t.id for t in tasks} | {f"bank-train-{i:06d}" for i in range(200)})["gold_call"] == 0


# ------------------------------------------------------------------------------------------ the chooser


def _rec(name: str, source: str, result, **args) -> ReferenceExample:
    return ReferenceExample(ToolCall(name, args), result, source=source, state="s")


def _task() -> Task:
    tools = [ToolSpec("get_balance", "Balance of an account"), ToolSpec("transfer", "Move money")]
    return Task(
        id="t-1",
        env="bank",
        system_prompt="You are a bank assistant.",
        user_turns=["How much is in rent?"],
        tools=tools,
        gold_actions=[[ToolCall("get_balance", {"account": "rent"})]],
        expected_outputs=["$142.50"],
    )


def test_the_chooser_drops_own_gold_and_answer_records_and_keeps_the_rest():
    from envace.envs.references import ReferencePool, choose_references

    good = [
        _rec(
            "get_balance", "t-2", {"account": "school", "balance": "1142.50"}, account="school"
        ),  # 142.50 inside a longer number
        _rec("transfer", "t-3", {"from_balance": "3.00"}, from_account="a", to_account="b", amount=1),
    ]
    bad = [
        _rec("get_balance", "t-1", {"balance": "9.00"}, account="garden"),  # the task's own record
        _rec("get_balance", "t-4", {"balance": "7.00"}, account="rent"),  # the task's gold call
        _rec("get_balance", "t-5", {"balance": "142.50"}, account="travel"),  # reveals the expected output
        _rec("freeze_account", "t-6", {"frozen": True}, account="x"),
    ]  # not one of the task's tools
    pool = ReferencePool.from_records(bad + good)
    chosen = choose_references(_task(), pool, k=3)
    assert sorted(r.call.key() for r in chosen) == sorted(r.call.key() for r in good)
    assert choose_references(_task(), pool, k=3) == chosen  # deterministic per task
    assert (
        len(choose_references(_task(), pool, k=1)) == 1
        and choose_references(_task(), ReferencePool.from_records(bad)) == []
    )


def test_hidden_values_are_answer_and_looked_up_values_the_task_does_not_show():
    from envace.envs.references import hidden_values

    t = _task()
    t.gold_actions = [
        [ToolCall("find_user", {"email": "mia@example.com"}), ToolCall("get_order", {"order_id": "#W59", "n": 2})]
    ]
    t.user_turns = ["My email is mia@example.com; what did order... cost?"]
    assert hidden_values(t) == ["142.50", "#w59"]  # the email is shown; 2 is too short to tell


def test_pool_building_uses_raw_train_tasks_and_does_not_recurse():
    from envace.envs.builtin import DOMAINS

    pool = DOMAINS["files"].reference_pool()
    assert pool.sources and all(re.fullmatch(r"files-train-\d{6}", s) for s in pool.sources)
    assert {"cat", "ls"} <= set(pool.by_tool) and all(r.state for recs in pool.by_tool.values() for r, _, _ in recs)


# ------------------------------------------------------------------------------------------ oracle and JSON


def test_oracle_references_are_the_tasks_own_gold_results_and_say_so():
    from envace.envs import make_env

    plain = load_tasks("bank", "test", n=3)
    oracle = load_tasks("bank@oracle-references", "test", n=3)
    for p, o in zip(plain, oracle):
        assert o.id == p.id and o.metadata["references"] == "oracle" and "references" not in p.metadata
        assert [r.call for r in o.references] == o.flat_gold() and all(r.source == o.id for r in o.references)
        env = make_env(o)
        assert [r.result for r in o.references] == [env.call(c) for c in o.flat_gold()]


def test_a_spec_suffix_that_is_not_a_reference_mode_is_left_alone():
    from envace.envs.references import split_spec

    assert split_spec("bank@oracle-references") == ("bank", "oracle-references")
    assert split_spec("mcp:python server.py --user a@b") == ("mcp:python server.py --user a@b", None)


def test_reference_source_and_state_round_trip_through_json():
    r = ReferenceExample(ToolCall("ls", {"path": "/"}), {"entries": []}, source="files-train-000003", state="abc")
    assert ReferenceExample.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    assert ReferenceExample.from_dict({"call": {"name": "ls"}, "result": 1}) == ReferenceExample(ToolCall("ls"), 1)
    t = load_tasks("shop", "test", n=1)[0]
    assert Task.from_dict(json.loads(json.dumps(t.to_dict()))).references == t.references and t.references[0].source
