"""One hash split for the benchmark suites without a split of their own (BFCL's categories, tau2's mock domain):
``envace.envs.suites.hash_split`` gives every suite the splits it had when each suite computed its own."""

from __future__ import annotations

import hashlib

import pytest

from envace.envs import tau2
from envace.envs.bfcl import v4
from envace.envs.suites import hash_split


def old_split(key: str, test_fraction: float) -> str:
    """The rule each suite once wrote out (key prefixed with the suite's name)."""
    h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return "test" if h / 2**32 < test_fraction else "train"


def test_hash_split_is_the_rule_every_suite_wrote_out():
    keys = [f"{p}-{i}" for p in ("bfcl-multi-turn", "bfcl-memory", "bfcl-single-turn", "tau2-mock") for i in range(500)]
    for fraction in (0.0, 0.3, 0.5, 1.0):
        assert [hash_split(k, fraction) for k in keys] == [old_split(k, fraction) for k in keys]
    assert {hash_split(k, 0.3) for k in keys} == {"train", "test"}


# (entries, test entries, sha256 of the test ids joined by newlines, first 12 hex digits), computed before the
# suites shared hash_split
FINGERPRINTS = {
    "irrelevance": (240, 73, "7e091091bf67"),
    "live_irrelevance": (884, 251, "2a03e24e7bf4"),
    "live_multiple": (1053, 332, "7ca8f6117832"),
    "live_parallel": (16, 4, "12e540cd4234"),
    "live_parallel_multiple": (24, 8, "d4de607be9be"),
    "live_relevance": (16, 9, "0de104380621"),
    "live_simple": (258, 74, "c89ae4768c11"),
    "memory_kv": (155, 50, "21f46ca2dc80"),
    "memory_rec_sum": (155, 50, "1d268f8df7ec"),
    "multi_turn_base": (200, 59, "afb53a8d89f9"),
    "multi_turn_long_context": (200, 59, "6a7aec4cd96e"),
    "multi_turn_miss_func": (200, 59, "c665997af1c6"),
    "multi_turn_miss_param": (200, 59, "9e6444edc758"),
    "multiple": (200, 52, "ef2811207d75"),
    "parallel": (200, 56, "97d11172ec87"),
    "parallel_multiple": (200, 58, "363a1e9e2512"),
    "simple_java": (100, 32, "17d15391d6bb"),
    "simple_javascript": (50, 15, "e7776d630f49"),
    "simple_python": (400, 115, "c958b5ecf1ab"),
    "tau2:airline": (50, 20, "0ee45d772145"),
    "tau2:retail": (114, 40, "aeb36148c525"),
    "tau2:telecom": (114, 40, "32b953d78e52"),
    "tau2:mock": (9, 2, "2629fd7ac516"),
}


def fingerprint(all_ids: list[str], test_ids: list[str]) -> tuple[int, int, str]:
    return len(all_ids), len(test_ids), hashlib.sha256("\n".join(test_ids).encode()).hexdigest()[:12]


@pytest.mark.parametrize("name", [n for n in FINGERPRINTS if not n.startswith("tau2:")])
def test_every_bfcl_category_keeps_its_test_split(name):
    ids = v4.KINDS.get(v4.CATEGORIES.get(name).kind).ids
    assert fingerprint(ids(name, "all"), ids(name, "test")) == FINGERPRINTS[name]


@pytest.mark.parametrize("domain", tau2.DOMAINS)
def test_every_tau2_domain_keeps_its_test_split(domain):
    tasks = [tau2.convert_task(domain, t) for t in tau2._domain_info(domain)["tasks"]]
    got = fingerprint([t.id for t in tasks], [t.id for t in tasks if t.split == "test"])
    assert got == FINGERPRINTS[f"tau2:{domain}"]
