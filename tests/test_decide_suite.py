"""``shop-world-decide``: requests whose right action depends on what the tools return. Acting without reading the
world must fail some task of every template (otherwise Rehearse would have nothing to decide), the gold episode
must succeed on every task, and the customers and catalog are shop-world's own."""

from __future__ import annotations

import re

import pytest

from envace.core.types import ToolCall, dumps
from envace.envs import load_tasks
from envace.envs.builtin.shop import SHOP_DECIDE
from envace.rewards.adversarial import gold_turns, real_trajectory

SUITE = "shop-world-decide"
DECISIONS = sorted(set(SHOP_DECIDE.template_names("train")))


def _tasks(template: str, n: int = 300) -> list:
    return [t for t in load_tasks(SUITE, "train", n=n) if t.metadata["template"] == template]


def _outcome(task, calls: list[ToolCall]) -> bool:
    """Success of one turn that makes ``calls`` and then replies with the gold reply (every fact stated)."""
    return real_trajectory(task, [(calls, task.gold_replies[0])]).env_outcome["success"]


def _blind(task, act: bool) -> list[ToolCall]:
    """What a policy that never reads an observation does: the gold reads, then always (``act``) or never the
    template's write, on what needs no observation: the first product named, the order the user names, or (to cancel
    "every pending order") the record's first order."""
    gold = task.flat_gold()
    reads = [c for c in gold if c.name in ("search_products", "get_order", "list_orders")]
    if not act:
        return reads
    template = task.metadata["template"]
    orders = sorted(task.env_config["orders"])
    if template == "buy_if_under" or template == "buy_cheaper":
        first = reads[0].arguments["query"]
        pid = next(p for p, x in task.env_config["catalog"].items() if x["name"] == first)
        q = 1 if template == "buy_cheaper" else int(re.search(r"\b(?:[Oo]rder|Buy) (\d+)\b", task.user_turns[0])[1])
        return reads + [ToolCall("place_order", {"product_id": pid, "quantity": q})]
    if template == "cancel_if_over":
        return reads + [ToolCall("cancel_order", {"order_id": gold[0].arguments["order_id"]})]
    return reads + [ToolCall("cancel_order", {"order_id": orders[0]})]  # cancel_pending: one order


@pytest.mark.parametrize("template", DECISIONS)
def test_the_gold_episode_succeeds_on_every_task_of_the_template(template):
    tasks = _tasks(template)
    assert len(tasks) >= 20
    assert all(real_trajectory(t, gold_turns(t)).env_outcome["success"] for t in tasks)


@pytest.mark.parametrize("template", DECISIONS)
def test_acting_without_reading_the_world_fails_some_tasks_either_way(template):
    tasks = _tasks(template)
    for act in (True, False):
        fails = sum(not _outcome(t, _blind(t, act)) for t in tasks)
        assert fails >= 3, (template, act, fails, len(tasks))


def test_decide_tasks_start_from_shop_worlds_own_records():
    world = {t.env_config["customer"]: dumps(t.env_config) for t in load_tasks("shop-world", "train", n=80)}
    for t in load_tasks(SUITE, "train", n=80):
        assert dumps(t.env_config) == world[t.env_config["customer"]]


def test_the_ood_split_is_shop_worlds_held_out_templates():
    got = {t.metadata["template"] for t in load_tasks(SUITE, "ood", n=120)}
    assert got == set(SHOP_DECIDE.held_out) and all(n.startswith("ood_") for n in got)
    assert not set(SHOP_DECIDE.template_names("train")) & got


def test_a_request_without_entities_is_split_by_customer():
    """cancel_pending names no order: the same words from two customers may fall in different splits, and a
    customer's request of the test split is never a train task of that customer."""

    def keys(split):
        return {
            (t.env_config["customer"], t.user_turns[0])
            for t in load_tasks(SUITE, split, n=400)
            if t.metadata["template"] == "cancel_pending"
        }

    train, test = keys("train"), keys("test")
    assert train and test and not train & test
    assert {u.split(". ", 1)[1] for _, u in train} & {u.split(". ", 1)[1] for _, u in test}


def _nothing_to_cancel() -> list:
    return [t for t in _tasks("cancel_pending") if not t.expected_outputs and len(t.flat_gold()) == 1]


def test_a_reply_without_looking_fails_a_request_that_needs_no_action():
    """A customer with no pending order: the right end state is the start state and the reply quotes no fact, so
    only the read tells an agent that looked from one that guessed; the guess fails, and the score says why."""
    tasks = _nothing_to_cancel()
    assert len(tasks) >= 5
    for t in tasks:
        guessed = real_trajectory(t, [([], task_reply := t.gold_replies[0])]).env_outcome
        assert not guessed["success"] and guessed["details"]["state_match"]
        assert guessed["details"]["unlooked_tools"] == ["list_orders"]
        looked = real_trajectory(t, [([ToolCall("list_orders", {})], task_reply)]).env_outcome
        assert looked["success"] and looked["details"]["unlooked_tools"] == []


def test_a_request_with_something_to_do_is_judged_by_its_outcome_alone():
    """Where the gold run changes the world, the end state is the evidence: cancelling the right orders without
    the listing read (ids known some other way) still succeeds, and nothing is reported unlooked."""
    t = next(t for t in _tasks("cancel_pending") if t.expected_outputs)
    cancels = [c for c in t.flat_gold() if c.name == "cancel_order"]
    out = real_trajectory(t, [(cancels, t.gold_replies[0])]).env_outcome
    assert out["success"] and out["details"]["unlooked_tools"] == []
