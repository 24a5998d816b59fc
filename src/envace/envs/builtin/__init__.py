"""Built-in, procedurally generated tool environments: ``bank``, ``shop`` and ``files``.

Each domain is a :class:`~envace.envs.builtin.common.ToolEnv` with real, stateful Python tools and a set of task
templates. Task ``i`` of a split is a pure function of (domain, split, i). Splits (details in
:mod:`~envace.envs.builtin.common`):

======== =========================================================================================================
split    holds out
======== =========================================================================================================
train    nothing (the training distribution: in-distribution templates and name pools)
val      part of train's distribution with disjoint keys (1 in 15 parameter combinations, carved out of train):
         the split to choose settings on (hyper-parameters, checkpoints), so that ``test`` is only reported
test     requests: parameter combinations disjoint from train (see :func:`~envace.envs.builtin.common.split_of`),
         same templates, phrasings and name pools as train
ood      templates (``ood_*``, never in train/test) and entity names: account, memo, product, directory, file
         names and file text from held-out pools (``Domain.pools``)
======== =========================================================================================================

Every task has ``metadata["kind"]`` (:func:`~envace.envs.builtin.common.task_kind`): ``recovery``, ``chained``,
``read_only_report`` or ``simple``; every split of every domain has tasks of the first three kinds.

Two kinds of world:

* fresh (``bank``, ``shop``, ``files``): every task draws a new random world that no prompt shows, so a tool's
  result cannot be predicted from anything learnt on other tasks (Rehearse can only guess a balance).
* persistent (``bank-world``, ``shop-world``, ``files-world``): the same tools and templates, but every task starts
  from the record of one of eight customers (:data:`~envace.envs.builtin.common.CUSTOMERS`), the same record each
  time the customer comes back (shop: one fixed catalog for all), and the user says who they are. Train, val and
  test tasks are about the same customers (their records can be learnt in training: test holds out requests, not
  the world); ``ood`` tasks are about four other customers with held-out names (transfer). Reference examples are
  the customer's own records from other train tasks (an ``ood`` customer, who has none, gets every customer's).

Registered here: environments ``bank``, ``shop``, ``files`` in :data:`~envace.envs.registry.ENVS`, and suites
``bank``, ``shop``, ``files``, ``builtin`` (the three interleaved), ``bank-world``, ``shop-world``,
``files-world``, ``builtin-world`` and ``shop-world-decide`` (shop-world's customers with requests whose right
action depends on what the tools return) in :data:`~envace.envs.registry.SUITES`, all with the signature
``loader(spec, split="train", n=None, seed=0) -> list[Task]``.
"""

from __future__ import annotations

from typing import Callable

from ...core.types import Task
from ..registry import ENVS, SUITES, TASK_AT
from .bank import BANK, BANK_WORLD, BankEnv
from .common import (
    DEFAULT_N,
    INDEX_SPACE,
    KINDS,
    OOD_CUSTOMERS_SPLIT,
    OOD_SPLIT,
    SPLITS,
    Domain,
    TaskBuilder,
    ToolEnv,
    split_indices,
    task_kind,
    tool,
)
from .files import FILES, FILES_WORLD, FilesEnv
from .shop import SHOP, SHOP_WORLD, SHOP_WORLD_DECIDE, ShopEnv

DOMAINS: dict[str, Domain] = {d.name: d for d in (BANK, SHOP, FILES)}
WORLD_DOMAINS: dict[str, Domain] = {d.name: d for d in (BANK_WORLD, SHOP_WORLD, FILES_WORLD)}
"""The persistent suites (``bank-world``, ...): the same tools and templates on the fixed records of a few
customers that persist across tasks (:class:`~envace.envs.builtin.common.Population`)."""
EXTRA_DOMAINS: dict[str, Domain] = {d.name: d for d in (SHOP_WORLD_DECIDE,)}
"""Persistent suites beside the three (not in a mix): ``shop-world-decide``, shop-world's customers and catalog with
requests whose right action depends on what the tools return."""
ALL_DOMAINS: dict[str, Domain] = DOMAINS | WORLD_DOMAINS | EXTRA_DOMAINS
"""Every single-domain suite by name: the fresh, the persistent and the extra ones (not the mixes)."""
MIXES: dict[str, dict[str, Domain]] = {"builtin": DOMAINS, "builtin-world": WORLD_DOMAINS}
"""The suites that interleave three domains, by name."""


def make_task(domain: str, split: str, index: int) -> Task:
    """Task ``index`` of ``split`` of one domain or persistent suite (``"bank-train-000123"`` is
    ``make_task("bank", "train", 123)``, ``"bank-world-test-000007"`` is ``make_task("bank-world", "test", 7)``)."""
    return ALL_DOMAINS[domain].make_task(split, index)


def task_from_id(task_id: str) -> Task:
    """The task of a domain or persistent suite whose id is ``task_id`` (``"<suite>-<split>-<index>"``, as
    :func:`make_task` names them): what a saved result's per-task row or a record names, rebuilt."""
    suite, split, index = task_id.rsplit("-", 2)
    return make_task(suite, split, int(index))


def load_mix(spec: str = "builtin", split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
    """Three domains interleaved (``builtin``: bank, shop, files; ``builtin-world``: their persistent suites):
    position k is task k // 3 of domain k % 3; any split."""
    return [mix_task(spec, split, k) for k in split_indices(n, seed)]


def mix_task(spec: str, split: str, k: int) -> Task:
    """Position ``k`` of a mix (:func:`load_mix`): task k // 3 of domain k % 3."""
    domains = list(MIXES[spec].values())
    return domains[k % 3].make_task(split, k // 3)


def indexer(make: Callable[[str, str, int], Task], end: int) -> Callable[[str, str, int], Task]:
    """A generated suite's ``TASK_AT`` entry: ``make(spec, split, index)`` for an index below ``end``."""

    def task_at(spec: str, split: str, index: int) -> Task:
        if not 0 <= index < end:
            raise ValueError(f"task index {index} is past the end of suite {spec!r}: its indices are 0..{end - 1}")
        return make(spec, split, index)

    return task_at


for _name, _domain in DOMAINS.items():
    ENVS.add(_name, _domain.env_cls)
    SUITES.add(_name, _domain.load)
for _name, _domain in (WORLD_DOMAINS | EXTRA_DOMAINS).items():
    SUITES.add(_name, _domain.load)  # tasks name their domain's environment (env "bank"): no ENVS entry of their own
for _name, _domain in ALL_DOMAINS.items():
    TASK_AT.add(_name, indexer(lambda spec, split, i, d=_domain: d.make_task(split, i), INDEX_SPACE))
for _name in MIXES:
    SUITES.add(_name, load_mix)
    TASK_AT.add(_name, indexer(mix_task, 3 * INDEX_SPACE))

__all__ = [
    "BankEnv",
    "ShopEnv",
    "FilesEnv",
    "ToolEnv",
    "Domain",
    "TaskBuilder",
    "DOMAINS",
    "WORLD_DOMAINS",
    "EXTRA_DOMAINS",
    "ALL_DOMAINS",
    "SPLITS",
    "OOD_SPLIT",
    "OOD_CUSTOMERS_SPLIT",
    "KINDS",
    "DEFAULT_N",
    "load_mix",
    "make_task",
    "task_from_id",
    "task_kind",
    "tool",
]
