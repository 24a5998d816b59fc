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

Registered here: environments ``bank``, ``shop``, ``files`` in :data:`~envace.envs.base.ENVS`, and suites
``bank``, ``shop``, ``files`` and ``builtin`` (the three interleaved) in :data:`~envace.envs.base.SUITES`, all
with the signature ``loader(spec, split="train", n=None, seed=0) -> list[Task]``.
"""

from __future__ import annotations

from ...core.types import Task
from ..base import ENVS, SUITES
from .bank import BANK, BankEnv
from .common import DEFAULT_N, KINDS, OOD_SPLIT, SPLITS, Domain, TaskBuilder, ToolEnv, split_indices, task_kind, tool
from .files import FILES, FilesEnv
from .shop import SHOP, ShopEnv

DOMAINS: dict[str, Domain] = {d.name: d for d in (BANK, SHOP, FILES)}


def make_task(domain: str, split: str, index: int) -> Task:
    """Task ``index`` of ``split`` of one domain (``"bank-train-000123"`` is ``make_task("bank", "train", 123)``)."""
    return DOMAINS[domain].make_task(split, index)


def load_mix(spec: str = "builtin", split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
    """The three domains interleaved: position k is task k // 3 of domain k % 3 (bank, shop, files); any split."""
    names = list(DOMAINS)
    return [DOMAINS[names[k % 3]].make_task(split, k // 3) for k in split_indices(n, seed)]


for _name, _domain in DOMAINS.items():
    ENVS.add(_name, _domain.env_cls)
    SUITES.add(_name, _domain.load)
SUITES.add("builtin", load_mix)

__all__ = [
    "BankEnv",
    "ShopEnv",
    "FilesEnv",
    "ToolEnv",
    "Domain",
    "TaskBuilder",
    "DOMAINS",
    "SPLITS",
    "OOD_SPLIT",
    "KINDS",
    "DEFAULT_N",
    "load_mix",
    "make_task",
    "task_kind",
    "tool",
]
