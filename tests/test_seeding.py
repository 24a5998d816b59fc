"""derive_seed gives every call site the seed it computed by hand before (so results do not change), and its salts
and primes keep the streams apart."""

import itertools

import pytest

from envace.core.seeding import SEED_MODULUS, derive_seed
from envace.training.trainer import ITERATION_PRIME
from envace.evaluation.tts import ATTEMPT_PRIME, PRIVATE_SALT, TTSConfig
from envace.rollout.engine import RolloutConfig

SEEDS = (0, 1, 7, 12345, 2**31 - 1, 2**40 + 3)


def test_derive_seed_equals_the_formulas_each_call_site_used():
    for seed, n in itertools.product(SEEDS, (0, 1, 2, 99, 10**6)):
        assert derive_seed(seed, n) == (seed * 1_000_003 + n) % 2**63  # rollout generate call n
        assert (
            derive_seed(seed, PRIVATE_SALT + n) == (seed * 1_000_003 + 500_009 + n) % 2**63
        )  # tts plans / reflections / memory
        assert derive_seed(seed, n, prime=ITERATION_PRIME) == seed * 100_003 + n  # training iteration n
        assert derive_seed(seed + 1, n, prime=ATTEMPT_PRIME) == (seed + 1) * 7919 + n  # tts attempt batch n
        assert derive_seed(n % 8, seed) == seed + 1_000_003 * (n % 8)  # process rank r of a launched run


def test_a_huge_or_negative_base_stays_a_valid_seed_congruent_to_the_old_value():
    for seed in (-5, -1, 2**62, 2**70):
        s = derive_seed(seed, 3)
        assert 0 <= s < SEED_MODULUS and (s - (seed * 1_000_003 + 3)) % 2**63 == 0
    assert derive_seed(-3 + 1, 0, prime=ATTEMPT_PRIME) % 2**63 == ((-3 + 1) * 7919) % 2**63


def test_the_attempt_seeds_of_test_time_rehearsal_are_the_old_ones_and_never_the_final_runs():
    for seed in SEEDS:
        cfg = TTSConfig(n=2, seed=seed)
        assert [cfg.attempt_seed(a) for a in range(3)] == [(seed + 1) * 7919 + a for a in range(3)]
        assert cfg.run_seed == seed and seed not in [cfg.attempt_seed(a) for a in range(3)]
        with pytest.warns(DeprecationWarning, match="seed"):  # the old spelling, one version: RolloutConfig.seed
            old = TTSConfig(n=2, rollout=RolloutConfig(seed=seed + 1))
        assert old.run_seed == seed + 1 and old.attempt_seed(0) == (seed + 2) * 7919


def test_nearby_bases_and_salts_do_not_collide():
    seen = {derive_seed(b, n) for b in range(50) for n in range(50)}
    assert len(seen) == 50 * 50
