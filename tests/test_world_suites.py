"""The persistent suites (``bank-world``, ``shop-world``, ``files-world``, ``builtin-world``): every task starts from
the record of one customer of a fixed population, the same record each time, so a tool's result is a function of
a world that persists across tasks (METHOD.md section 6, "A world worth rehearsing")."""

from __future__ import annotations

import json

import pytest

from envace.core.types import dumps
from envace.envs import load_tasks
from envace.envs.builtin import DOMAINS, EXTRA_DOMAINS, WORLD_DOMAINS, make_task, task_from_id
from envace.envs.builtin.common import CUSTOMERS, OOD_CUSTOMERS

WORLDS = sorted(WORLD_DOMAINS | EXTRA_DOMAINS)


def _initial(task) -> str:
    return dumps(task.env_config)


@pytest.mark.parametrize("suite", WORLDS)
def test_a_customer_starts_every_task_from_the_same_record(suite):
    records: dict[str, set[str]] = {}
    for split in ("train", "val", "test"):
        for t in load_tasks(suite, split, n=40):
            records.setdefault(t.env_config["customer"], set()).add(_initial(t))
    assert len(records) >= 6, records.keys()  # the tasks are spread over the population
    assert all(len(r) == 1 for r in records.values()), {c: len(r) for c, r in records.items()}


@pytest.mark.parametrize("suite", WORLDS)
def test_in_distribution_splits_share_customers_and_ood_has_its_own(suite):
    seen = {t.env_config["customer"] for s in ("train", "val", "test") for t in load_tasks(suite, s, n=40)}
    ood = {t.env_config["customer"] for t in load_tasks(suite, "ood", n=40)}
    assert seen <= set(CUSTOMERS) and ood <= set(OOD_CUSTOMERS)
    assert not seen & ood


@pytest.mark.parametrize("suite", WORLDS)
def test_the_user_says_who_they_are_and_fresh_suites_do_not(suite):
    task = load_tasks(suite, "test", n=1)[0]
    assert task.user_turns[0].startswith(f"Hi, this is {task.env_config['customer']}. ")
    fresh = load_tasks(suite.split("-world")[0], "test", n=1)[0]
    assert "customer" not in fresh.env_config and not fresh.user_turns[0].startswith("Hi, this is")


@pytest.mark.parametrize("suite", WORLDS)
def test_a_persistent_task_is_a_pure_function_of_its_index(suite):
    a, b = load_tasks(suite, "test", n=5), load_tasks(suite, "test", n=5)
    assert [json.dumps(t.to_dict(), sort_keys=True) for t in a] == [json.dumps(t.to_dict(), sort_keys=True) for t in b]
    assert all(t.id.startswith(f"{suite}-test-") for t in a)


@pytest.mark.parametrize("domain", sorted(DOMAINS))
def test_every_template_of_the_domain_generates_on_the_population(domain):
    world = WORLD_DOMAINS[f"{domain}-world"]
    got = {t.metadata["template"] for t in world.load("", "train", n=300)}
    assert got == set(DOMAINS[domain].template_names("train"))
    assert {t.metadata["template"] for t in world.load("", "ood", n=120)} == set(DOMAINS[domain].template_names("ood"))


@pytest.mark.parametrize("suite", ["bank-world", "shop-world"])
def test_references_are_the_customers_own_records_of_other_train_tasks(suite):
    for t in load_tasks(suite, "test", n=30):
        for r in t.references:
            assert r.source != t.id and "-train-" in r.source
            src = make_task(suite, "train", int(r.source.rsplit("-", 1)[1]))
            assert src.env_config["customer"] == t.env_config["customer"], (t.id, r.source)


def test_shop_world_has_one_catalog_for_every_customer():
    catalogs = {dumps(t.env_config["catalog"]) for t in load_tasks("shop-world", "train", n=60)}
    assert len(catalogs) == 1
    assert len({dumps(t.env_config["catalog"]) for t in load_tasks("shop", "train", n=20)}) > 1


def test_a_frozen_account_stays_frozen_for_its_customer():
    """An error rule a model can learn: the same customer's same account fails the same way in every task."""
    frozen: dict[str, set[str]] = {}
    for t in load_tasks("bank-world", "train", n=80):
        names = {n for n, a in t.env_config["accounts"].items() if a["frozen"]}
        frozen.setdefault(t.env_config["customer"], set()).update(names)
        assert names == frozen[t.env_config["customer"]]
    assert any(frozen.values()) and not all(frozen.values())


def test_builtin_world_interleaves_the_three_persistent_suites():
    tasks = load_tasks("builtin-world", "test", n=6)
    assert [t.id.rsplit("-test-", 1)[0] for t in tasks] == ["bank-world", "shop-world", "files-world"] * 2
    assert [t.env for t in tasks] == ["bank", "shop", "files"] * 2


@pytest.mark.parametrize("suite", ["shop", *WORLDS])
def test_a_task_is_rebuilt_from_its_id(suite):
    """What a saved result or record names (``shop-world-decide-val-000007``) is the task itself, rebuilt."""
    for t in load_tasks(suite, "val", n=3) + load_tasks(suite, "ood", n=2):
        assert task_from_id(t.id).to_dict() == t.to_dict()


@pytest.mark.parametrize("suite", WORLDS)
def test_ood_customers_asks_train_s_kinds_of_request_about_customers_and_records_no_other_split_has(suite):
    """``ood_customers``: the in-distribution templates (not the held-out ones) about the ood customers, whose
    records name no entity of the train / test tasks; a pure function of the index, rebuilt from its id."""
    from envace.envs.builtin import ALL_DOMAINS

    dom = ALL_DOMAINS[suite]
    tasks = load_tasks(suite, "ood_customers", n=60)
    assert {t.env_config["customer"] for t in tasks} <= set(OOD_CUSTOMERS)
    templates = {t.metadata["template"] for t in tasks}
    assert templates <= set(dom.template_names("train")) and not templates & dom.held_out
    assert len(templates) >= min(3, len(dom.template_names("train")))
    seen = set().union(*(dom.entities(t.env_config) for s in ("train", "test") for t in load_tasks(suite, s, n=60)))
    new = set().union(*(dom.entities(t.env_config) for t in tasks))
    assert new and seen and not new & seen, sorted(new & seen)
    assert all(t.id.startswith(f"{suite}-ood_customers-") and t.split == "ood_customers" for t in tasks)
    assert task_from_id(tasks[7].id).to_dict() == tasks[7].to_dict()


def test_ood_customers_is_refused_by_a_fresh_suite_with_the_reason():
    with pytest.raises(ValueError, match="only for the persistent suites"):
        load_tasks("bank", "ood_customers", n=1)
    assert [t.id.rsplit("-ood_customers-", 1)[0] for t in load_tasks("builtin-world", "ood_customers", n=3)] == [
        "bank-world",
        "shop-world",
        "files-world",
    ]
