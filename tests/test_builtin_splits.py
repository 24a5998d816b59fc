"""The built-in suites' validation and out-of-distribution splits and task kinds: what ``val`` and ``ood`` hold
out, that every split has every kind, that the labels are derived correctly, and that the in-distribution test
split (and, outside the carved-out val keys, train) did not change."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import zlib
from typing import Any

import pytest

from envace.envs import load_tasks
from envace.envs.builtin import DOMAINS, KINDS, SPLITS, BankEnv, Domain, make_task, task_kind
from envace.envs.builtin.common import MONEY_RE, TEST_SHARE, VAL_SHARE, carried, split_of
from envace.core.types import Task, ToolCall

DOMAIN_NAMES = ["bank", "shop", "files"]
N = 100
NEEDED_KINDS = {"chained", "recovery", "read_only_report"}


@pytest.fixture(scope="module")
def tasks() -> dict[tuple[str, str], list[Task]]:
    return {(d, s): load_tasks(d, s, n=N) for d in [*DOMAIN_NAMES, "builtin"] for s in SPLITS}


# ------------------------------------------------------------------------------------- the ood split


def test_ood_is_a_split_of_every_builtin_suite(tasks):
    assert SPLITS == ("train", "val", "test", "ood")
    for d in DOMAIN_NAMES:
        ts = tasks[(d, "ood")]
        assert [t.id for t in ts[:2]] == [f"{d}-ood-000000", f"{d}-ood-000001"]
        assert all(t.split == "ood" and t.env == d for t in ts)
        assert make_task(d, "ood", 7).to_dict() == ts[7].to_dict()  # a pure function of (domain, split, index)
        a, b = load_tasks(d, "ood", n=5, seed=3), load_tasks(d, "ood", n=5, seed=3)
        assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
        assert {t.id for t in a}.isdisjoint({t.id for t in load_tasks(d, "ood", n=5, seed=4)})
    assert [t.env for t in tasks[("builtin", "ood")][:6]] == DOMAIN_NAMES * 2
    assert tasks[("builtin", "ood")][3].id == "bank-ood-000001"


def test_ood_shares_no_template_with_train_or_test(tasks):
    for d in DOMAIN_NAMES:
        dom = DOMAINS[d]
        held = {t.metadata["template"] for t in tasks[(d, "ood")]}
        seen = {t.metadata["template"] for s in ("train", "test") for t in tasks[(d, s)]}
        assert held == set(dom.template_names("ood")) == dom.held_out and len(held) >= 4
        assert held.isdisjoint(seen)
        assert (
            set(dom.template_names("train"))
            == set(dom.template_names("test"))
            == set(dom.templates.names()) - dom.held_out
        )


def _strings(x: Any) -> list[str]:
    """Every string (keys included) inside a JSON value."""
    if isinstance(x, dict):
        return [s for k, v in x.items() for s in (k, *_strings(v))]
    if isinstance(x, list):
        return [s for v in x for s in _strings(v)]
    return [x] if isinstance(x, str) else []


def _texts(t: Task) -> list[str]:
    """What a task says: user turns, gold replies, expected outputs, gold-call arguments, the initial state."""
    return [
        *t.user_turns,
        *t.gold_replies,
        *t.expected_outputs,
        *_strings([c.arguments for c in t.flat_gold()]),
        *_strings(t.env_config),
    ]


def _mentions(texts: list[str], names: set[str]) -> set[str]:
    pattern = re.compile(
        "|".join(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])" for n in sorted(names, key=len, reverse=True))
    )
    return {m.group(0) for s in texts for m in pattern.finditer(s)}


def test_ood_shares_no_entity_name_with_train_or_test(tasks):
    for d in DOMAIN_NAMES:
        dom = DOMAINS[d]
        assert dom.pools and dom.entities is not None
        seen_pool = {n for a, _ in dom.pools.values() for n in a}
        held_pool = {n for _, b in dom.pools.values() for n in b}
        ood = tasks[(d, "ood")]
        in_dist = tasks[(d, "train")] + tasks[(d, "test")]
        # the states' entities (accounts and memos, product names, path parts) never overlap
        ood_names = set().union(*(dom.entities(t.env_config) for t in ood))
        seen_names = set().union(*(dom.entities(t.env_config) for t in in_dist))
        assert ood_names and seen_names and ood_names.isdisjoint(seen_names), sorted(ood_names & seen_names)
        # and no text of a task names an entity of the other side's pools
        assert _mentions([s for t in ood for s in _texts(t)], seen_pool) == set()
        assert _mentions([s for t in in_dist for s in _texts(t)], held_pool) == set()
        # the scan does find names where there are some
        assert _mentions(_texts(ood[0]), held_pool) and _mentions(_texts(in_dist[0]), seen_pool)


def test_a_domain_refuses_a_pool_whose_halves_overlap():
    with pytest.raises(ValueError, match="'rent'"):
        Domain(BankEnv, pools={"accounts": (("rent", "car"), ("boat", "rent"))})


def test_unknown_split_names_the_valid_ones():
    with pytest.raises(ValueError, match="train, val, test, ood"):
        DOMAINS["bank"].template_names("validation")


# ------------------------------------------------------------------------------------- task kinds


def test_every_split_of_every_suite_has_all_three_kinds(tasks):
    for (suite, split), ts in tasks.items():
        assert len(ts) >= 100
        kinds = {t.metadata["kind"] for t in ts}
        assert kinds <= set(KINDS)
        assert NEEDED_KINDS <= kinds, (suite, split, kinds)
        for t in ts:  # the old metadata keys stay
            assert {"template", "n_turns", "n_gold_calls", "read_only", "kind"} <= set(t.metadata)


# (domain, template) -> kind, checked by hand against the templates' gold episodes
HAND_CHECKED = {
    ("bank", "sweep"): "chained",  # moves the balance that get_balance returned
    ("bank", "transfer"): "simple",
    ("bank", "check_then_transfer"): "simple",  # the user names the amount
    ("bank", "balance_question"): "read_only_report",
    ("bank", "frozen_transfer"): "recovery",
    ("bank", "insufficient_funds"): "recovery",
    ("bank", "ood_undo_last_payment"): "chained",  # deposits the amount get_transactions returned
    ("bank", "ood_top_up_from_largest"): "chained",  # the source account comes from list_accounts
    ("bank", "ood_transfer_with_fallback"): "recovery",
    ("bank", "ood_combined_balance"): "read_only_report",
    ("bank", "ood_two_deposits"): "simple",
    ("shop", "buy_by_name"): "chained",  # the product id comes from search_products
    ("shop", "price_then_buy"): "chained",
    ("shop", "buy_by_id"): "simple",
    ("shop", "cancel_shipped"): "recovery",
    ("shop", "pending_orders_question"): "read_only_report",
    ("shop", "ood_reorder_same"): "chained",
    ("shop", "ood_refund_by_product"): "chained",  # the order id comes from list_orders
    ("shop", "ood_cancel_else_refund"): "recovery",
    ("shop", "ood_cheaper_of_two"): "read_only_report",
    ("shop", "ood_cancel_two"): "simple",
    ("files", "copy"): "chained",  # writes the content cat returned
    ("files", "read_then_append"): "chained",  # old content plus a new line
    ("files", "grep_and_delete"): "chained",  # deletes the path grep returned
    ("files", "mkdir_and_move"): "simple",
    ("files", "read_or_create"): "recovery",
    ("files", "grep_question"): "read_only_report",
    ("files", "ood_append_file"): "chained",
    ("files", "ood_move_mention"): "chained",
    ("files", "ood_list_missing_folder"): "recovery",  # read-only, but its path goes through an error
    ("files", "ood_save_into_missing_folder"): "recovery",
    ("files", "ood_read_two"): "read_only_report",
}


def test_kind_labels_match_hand_checked_templates(tasks):
    found = set()
    for (d, _), ts in tasks.items():
        for t in ts:
            want = HAND_CHECKED.get((t.env, t.metadata["template"]))
            if want is not None:
                assert t.metadata["kind"] == want, (t.id, t.metadata["template"])
                found.add((t.env, t.metadata["template"]))
            if t.metadata["template"] == "conditional_transfer":  # depends on the branch the balance picks
                assert t.metadata["kind"] == ("read_only_report" if t.metadata["read_only"] else "simple"), t.id
    assert found == set(HAND_CHECKED)


def _first(tasks, domain: str, template: str) -> Task:
    return next(t for s in SPLITS for t in tasks[(domain, s)] if t.metadata["template"] == template)


def test_kind_follows_the_episode_not_the_template(tasks):
    env_cls = DOMAINS["bank"].env_cls
    # a sweep whose user names the amount no longer needs the lookup's value
    sweep = copy.deepcopy(_first(tasks, "bank", "sweep"))
    amount = sweep.flat_gold()[1].arguments["amount"]
    assert task_kind(sweep, env_cls) == "chained"
    sweep.user_turns = [sweep.user_turns[0] + f" That is ${amount}."]
    assert task_kind(sweep, env_cls) == "simple"
    # a transfer that first tries too much (a tool error) and then the right amount is a recovery
    tr = copy.deepcopy(_first(tasks, "bank", "transfer"))
    good = tr.gold_actions[0][0]
    tr.gold_actions = [[ToolCall("transfer", {**good.arguments, "amount": 10**6}), good]]
    assert task_kind(tr, env_cls) == "recovery"
    # a read-only question whose answer need not be reported is simple
    q = copy.deepcopy(_first(tasks, "bank", "balance_question"))
    assert task_kind(q, env_cls) == "read_only_report"
    q.expected_outputs = []
    assert task_kind(q, env_cls) == "simple"


def test_carried_values_come_from_observations_and_not_from_the_user():
    obs = ["142.50", "-12.25", "P-101", "buy milk\nfeed the cat", 3]
    assert carried(142.5, obs, "Move all of it.")
    assert not carried(142.5, obs, "Move $142.50 from a to b.")
    assert carried(12.25, obs, "Refund the last payment.")  # sign ignored
    assert not carried(99, obs, "Move everything.")
    assert carried("P-101", obs, "Buy the blue mug.")
    assert not carried("P-101", obs, "Buy P-101.")
    assert carried("buy milk\nfeed the cat\nnew line", obs, "Add 'new line' to it.")  # old content plus a line
    assert not carried("new line", obs, "Add 'new line' to it.")
    assert not carried(True, [True], "")


# ------------------------------------------------------------------------------------- test split unchanged

# sha256 (first 12 hex digits) of to_dict() of the first 20 test tasks, without references and metadata["kind"],
# captured from the code before the ood split and the kinds existed
TEST_HASHES = {
    "bank": "1c2d5e5c65c1 6314b0f9811b 5d9a9805acaa a3e7b786cd1d ab86a3e6031b 5dc1e109545e 00eba14b1d42 9b11209a406b "
    "bcbafb72924a c7c0e54d53b7 f8fdb22a3149 20e2a243d75b a4598b053b16 990c45c31c70 "
    "ea90487a0d31 36a1f919728a 34276a184312 ebcb83abba49 284a53c3d525 0dfaf2e42367",
    "shop": "a820fe49326e 566a94121d85 c652035fcbd6 85abead760ad 0f1a18d298f9 f05fd560798f f36266194f80 019df476a62b "
    "d4f847b5470e 51a26154bc85 8eb13b12f765 7c4c4696e089 62afadf518bb d729278f7281 "
    "f5e8b8ebac6f c4385cb5c6e9 0c131ae32ab2 2ea2fc2385a9 9c0bbf0a0d24 ecc0a82efab8",
    "files": "ffc1ae7c55f0 65940cc117e8 46a4cd93322d 6f61d4b76aff de42cd5f09da 0a6be1ae9e38 d8f00984d644 4f6313729a6a "
    "1ad90f3dc11a 0c1b8c0ee398 c19ad729a195 d265106f2269 d809f56a8448 d4820dc0f1db "
    "fe50e0fe5872 069c43a70327 d2941020fb6a 6f573f4c3705 aa91f8fa041f 19c772b4fc9c",
}


def _content(t: Task) -> dict:
    """The task's to_dict() as these digests were taken: without references, nor the tools' later read_only flag
    (derived from each tool's `mutates`, tested in test_builtin_envs)."""
    d = t.to_dict()
    d.pop("references", None)
    for tool in d["tools"]:
        tool.pop("read_only", None)
    return d


def _hash(t: Task) -> str:
    d = _content(t)
    d["metadata"] = {k: v for k, v in d["metadata"].items() if k != "kind"}  # to_dict() shares the dict
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def test_in_distribution_test_tasks_are_unchanged(tasks):
    for d in DOMAIN_NAMES:
        ts = tasks[(d, "test")][:20]
        assert [t.id for t in ts] == [f"{d}-test-{i:06d}" for i in range(20)]
        assert [_hash(t) for t in ts] == TEST_HASHES[d].split(), d


# ------------------------------------------------------------------------------------- the val split

SCAN = 300  # tasks per (domain, split) scanned for key overlaps


def _key(t: Task) -> str:
    """The task's parameter combination, as :meth:`TaskBuilder.split_key` computes it."""
    return t.metadata["template"] + "|" + MONEY_RE.sub("$#", "\n".join(t.user_turns))


@pytest.fixture(scope="module")
def scanned() -> dict[tuple[str, str], list[Task]]:
    return {(d, s): load_tasks(d, s, n=SCAN) for d in DOMAIN_NAMES for s in ("train", "val", "test")}


def test_val_is_a_split_of_every_builtin_suite(tasks):
    for d in [*DOMAIN_NAMES, "builtin"]:
        ts = tasks[(d, "val")]
        assert len(ts) == N and all(t.split == "val" for t in ts)
    for d in DOMAIN_NAMES:
        ts = tasks[(d, "val")]
        assert [t.id for t in ts[:2]] == [f"{d}-val-000000", f"{d}-val-000001"] and all(t.env == d for t in ts)
        assert make_task(d, "val", 7).to_dict() == ts[7].to_dict()
        a, b = load_tasks(d, "val", n=5, seed=3), load_tasks(d, "val", n=5, seed=3)
        assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    assert [t.id for t in tasks[("builtin", "val")][:4]] == [
        "bank-val-000000",
        "shop-val-000000",
        "files-val-000000",
        "bank-val-000001",
    ]


def test_train_val_and_test_keys_are_pairwise_disjoint(scanned):
    for d in DOMAIN_NAMES:
        keys = {s: {_key(t) for t in scanned[(d, s)]} for s in ("train", "val", "test")}
        for s, ks in keys.items():
            assert all(split_of(k) == s for k in ks), (d, s)
            assert len(ks) >= SCAN // 3, (d, s, len(ks))  # many combinations, not a few repeated ones
        assert keys["train"].isdisjoint(keys["val"]), d
        assert keys["train"].isdisjoint(keys["test"]), d
        assert keys["val"].isdisjoint(keys["test"]), d
        turns = {s: {tuple(t.user_turns) for t in scanned[(d, s)]} for s in ("train", "val", "test")}
        assert turns["val"].isdisjoint(turns["train"] | turns["test"]), d


def test_val_is_train_distribution_with_every_kind_and_template(scanned):
    for d in DOMAIN_NAMES:
        val = scanned[(d, "val")]
        assert {t.metadata["kind"] for t in val} == set(KINDS), d
        assert {t.metadata["template"] for t in val} == set(DOMAINS[d].template_names("train")), d
        assert DOMAINS[d].template_names("val") == DOMAINS[d].template_names("train")


def test_split_of_gives_test_and_val_their_shares():
    counts = {s: 0 for s in ("train", "val", "test")}
    n = 30_000
    for i in range(n):
        counts[split_of(f"k{i}")] += 1
    assert abs(counts["test"] / n - 1 / TEST_SHARE) < 0.01
    assert abs(counts["val"] / n - 1 / (TEST_SHARE * VAL_SHARE)) < 0.008
    # test is the old rule exactly: crc32 % TEST_SHARE == 0, whatever val takes
    assert all((split_of(f"k{i}") == "test") == (zlib.crc32(f"k{i}".encode()) % TEST_SHARE == 0) for i in range(2000))


def _digest(ts: list[Task]) -> str:
    """sha256 (16 hex digits) of the tasks' to_dict() without references (metadata["kind"] included)."""

    def one(t: Task) -> str:
        d = _content(t)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]

    return hashlib.sha256(" ".join(one(t) for t in ts).encode()).hexdigest()[:16]


# _digest of the first 20 tasks of each suite, captured from the code before the val split existed
BEFORE_VAL = {
    ("bank", "test"): "06a48a2479062213",
    ("shop", "test"): "d86e2e55c83f81ec",
    ("files", "test"): "b956e664626c2d20",
    ("builtin", "test"): "0d7cbc930d98a76f",
    ("bank", "ood"): "30a02a4e2248cde6",
    ("shop", "ood"): "c9e7706f3c7c6e62",
    ("files", "ood"): "be17185dab95e70f",
    ("builtin", "ood"): "67ef80d44724f89c",
}
# of the first 256 train tasks, the indices whose first accepted draw had a key that is now val (so a later
# sub-seed decides them now), and _digest of the other indices' tasks, captured before the val split existed
TRAIN_CHANGED = {
    "bank": (
        [20, 28, 66, 67, 87, 101, 105, 115, 133, 146, 154, 162, 165, 171, 186, 194, 196, 202, 204, 206, 242, 249],
        "5021ee58503aa164",
    ),
    "shop": (
        [
            22,
            67,
            70,
            73,
            81,
            83,
            99,
            105,
            127,
            132,
            136,
            137,
            141,
            153,
            166,
            200,
            204,
            205,
            212,
            218,
            226,
            233,
            241,
            247,
        ],
        "68025e4dcd78de3d",
    ),
    "files": ([3, 10, 21, 33, 46, 56, 58, 69, 79, 81, 94, 159, 190, 205, 210, 220], "85c07886fe769fe4"),
}


def test_test_and_ood_splits_did_not_change_when_val_was_carved_out(tasks):
    for (suite, split), digest in BEFORE_VAL.items():
        assert _digest(tasks[(suite, split)][:20]) == digest, (suite, split)


def test_train_changed_only_where_a_draw_fell_into_val(scanned):
    for d, (changed, digest) in TRAIN_CHANGED.items():
        train = scanned[(d, "train")][:256]
        assert _digest([t for i, t in enumerate(train) if i not in set(changed)]) == digest, d
        assert len(changed) <= 256 // 10  # about one in twelve
