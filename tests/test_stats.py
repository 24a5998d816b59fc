"""Intervals and paired tests by hand: known Wilson values, exact McNemar against a direct binomial sum, the
sign-flip test by enumeration, and a seeded paired bootstrap that is deterministic and covers the true difference."""

import math

import numpy as np
import pytest

from envace.math.stats import (
    unpaired_comparison,
    EXACT_FLIPS,
    fmt_rate,
    mcnemar_exact,
    paired_bootstrap,
    paired_comparison,
    rate_interval,
    seed_spread,
    sign_flip_p,
    seed_cluster_bootstrap,
    stratified_paired_bootstrap,
    wilson_interval,
)


def test_wilson_interval_matches_known_values():
    # textbook values (Newcombe 1998; Agresti & Coull 1998) for z = 1.96
    assert wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)  # upper = z^2 / (n + z^2)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)  # Newcombe's example 81/263
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_a_wilson_interval_always_contains_its_rate_even_at_0_and_1():
    """Rounding put the lower bound at 3e-18 for 0 of 100: an error bar drawn from it (rate - low) was negative, and
    matplotlib refused the whole report."""
    for n in (1, 7, 8, 100, 200, 300, 1000):
        for k in (0, n):
            lo, hi = wilson_interval(k, n)
            assert lo <= k / n <= hi, (k, n, lo, hi)
            rate, lo, hi = rate_interval([[bool(k)]] * n)
            assert lo <= rate <= hi, (k, n, lo, hi)


def test_rate_interval_is_wilson_over_tasks_of_the_per_task_means():
    assert rate_interval([[True], [False], [True], [True]]) == pytest.approx((0.75, *wilson_interval(3, 4)))
    # two samples per task: the tasks are the units (n = 4 tasks, not 8 trials), so the interval is wider
    two = [[True, True], [True, False], [False, True], [False, False]]
    rate, lo, hi = rate_interval(two)
    assert (rate, lo, hi) == pytest.approx((0.5, *wilson_interval(2, 4)))
    assert hi - lo > wilson_interval(4, 8)[1] - wilson_interval(4, 8)[0]
    with pytest.raises(ValueError, match="at least one sample"):
        rate_interval([[True], []])
    assert fmt_rate(*rate_interval([[True], [False]])) == "0.500 [0.095, 0.905]"


def test_seed_spread_is_mean_sample_std_min_and_max():
    assert seed_spread([0.5, 1.0]) == pytest.approx({"n": 2, "mean": 0.75, "std": 0.35355339, "min": 0.5, "max": 1.0})
    assert seed_spread([0.4]) == {"n": 1.0, "mean": 0.4, "std": 0.0, "min": 0.4, "max": 0.4}
    assert seed_spread([])["n"] == 0 and math.isnan(seed_spread([])["mean"])


def _binomial_two_sided(k: int, n: int) -> float:
    """Reference: sum of the Binomial(n, 1/2) probabilities of every outcome at most as likely as k."""
    pmf = [math.comb(n, i) / 2**n for i in range(n + 1)]
    return min(1.0, sum(p for p in pmf if p <= pmf[k] * (1 + 1e-12)))


@pytest.mark.parametrize("n01,n10,concordant", [(1, 6, 5), (0, 4, 0), (3, 3, 2), (2, 9, 10), (0, 0, 7), (5, 1, 0)])
def test_mcnemar_exact_is_the_binomial_test_of_the_discordant_pairs(n01, n10, concordant):
    a = [False] * n01 + [True] * n10 + [True] * concordant
    b = [True] * n01 + [False] * n10 + [True] * concordant
    expected = 1.0 if n01 + n10 == 0 else _binomial_two_sided(min(n01, n10), n01 + n10)
    assert mcnemar_exact(a, b) == pytest.approx(expected)
    assert mcnemar_exact(b, a) == pytest.approx(expected)  # symmetric


def test_mcnemar_exact_by_hand():
    # 1 vs 6 discordant: 2 * (C(7,0) + C(7,1)) / 2^7 = 2 * 8 / 128
    assert mcnemar_exact([0, 1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0, 0]) == pytest.approx(0.125)
    assert mcnemar_exact([0, 0, 0, 0], [1, 1, 1, 1]) == pytest.approx(0.125)  # 2 / 2^4
    with pytest.raises(ValueError):
        mcnemar_exact([True], [True, False])


def test_sign_flip_p_enumerates_the_sign_patterns_exactly():
    assert sign_flip_p([0, 0, 0], [1, 1, 1]) == pytest.approx(2 / 8)  # only all-plus and all-minus reach |sum| 3
    # differences (1, 1, -1, 0.5): zero differences are ignored; |sum| >= 1.5 in 6 of 16 patterns
    d = np.array([1, 1, -1, 0.5])
    signs = np.array([[s1, s2, s3, s4] for s1 in (1, -1) for s2 in (1, -1) for s3 in (1, -1) for s4 in (1, -1)])
    expected = float(np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-12))
    assert sign_flip_p([0, 0, 1, 0, 0.2], [1, 1, 0, 0.5, 0.2]) == pytest.approx(expected)
    assert sign_flip_p([0.5, 0.5], [0.5, 0.5]) == 1.0


def test_sign_flip_p_monte_carlo_is_seeded_and_close_to_the_exact_value():
    m = EXACT_FLIPS + 4  # past the exact limit
    a, b = [0.0] * m, [1.0] * (m - 4) + [0.0, 0.0, -1.0, -1.0]  # 14 non-zero differences of size 1, sum 10
    p = sign_flip_p(a, b, resamples=20_000, seed=3)
    assert p == sign_flip_p(a, b, resamples=20_000, seed=3)
    # exact: |sum of 14 random signs| >= 10, i.e. at least 12 of one sign: 2 * sum_{k>=12} C(14,k) / 2^14
    exact = 2 * sum(math.comb(14, k) for k in range(12, 15)) / 2**14
    assert p == pytest.approx(exact, abs=0.005)


def test_paired_bootstrap_is_deterministic_with_a_seed_and_exact_for_a_constant_difference():
    rng = np.random.default_rng(0)
    a, b = rng.random(40), rng.random(40) + 0.2  # per-task mean successes
    assert paired_bootstrap(a, b, seed=1) == paired_bootstrap(a, b, seed=1)
    assert paired_bootstrap(a, b, seed=1) != paired_bootstrap(a, b, seed=2)
    assert paired_bootstrap([0, 0, 0], [0.5, 0.5, 0.5]) == (0.5, 0.5)
    lo, hi = paired_bootstrap(np.zeros(200), np.r_[np.ones(60), np.zeros(140)])
    assert lo < 0.3 < hi and hi - lo == pytest.approx(2 * 1.96 * math.sqrt(0.3 * 0.7 / 200), abs=0.02)


def test_paired_bootstrap_covers_the_true_difference_about_95_percent_of_the_time():
    rng = np.random.default_rng(7)
    covered, reps = 0, 200
    for r in range(reps):  # true success 0.4 (A) and 0.6 (B), correlated through a per-task difficulty
        hard = rng.random(60)
        p_a = np.where(hard < 0.5, 0.2, 0.6)  # mean 0.4
        p_b = np.where(hard < 0.5, 0.4, 0.8)  # mean 0.6
        a, b = rng.random(60) < p_a, rng.random(60) < p_b
        lo, hi = paired_bootstrap(a, b, resamples=2_000, seed=r)
        covered += lo <= 0.2 <= hi
    assert 0.88 <= covered / reps <= 0.99


def test_seed_cluster_bootstrap_sees_outcomes_that_move_together_by_template():
    # a policy that acts by template: B gains 1 on every task of three templates and loses 1 on every task of the
    # fourth. Over tasks the gain looks sure; over templates (another draw could hold two losing ones) it is not.
    clusters = [t for t in "abcd" for _ in range(25)]
    d = np.array([-1.0 if t == "d" else 1.0 for t in clusters])
    lo, hi = paired_bootstrap(np.zeros(100), d)
    assert lo > 0.3
    out = seed_cluster_bootstrap(["0"] * 100, clusters, d)
    assert out["mean"] == pytest.approx(0.5) and (out["n_seeds"], out["n_clusters"], out["n"]) == (1, 4, 100)
    assert out["ci"][0] <= 0.0 < 0.5 < out["ci"][1]  # P(two or more of four draws are "d") = 0.26
    # a task on its own per cluster, one seed: the bootstrap over tasks, as wide
    rng = np.random.default_rng(5)
    x = (rng.random(80) < 0.6).astype(float) - (rng.random(80) < 0.4)
    one = seed_cluster_bootstrap([0] * 80, range(80), x, seed=2)
    lo, hi = paired_bootstrap(np.zeros(80), x, seed=2)
    assert one["mean"] == pytest.approx(x.mean())
    assert one["ci"][1] - one["ci"][0] == pytest.approx(hi - lo, abs=0.03)


def test_seed_cluster_bootstrap_resamples_training_seeds_and_weights_clusters_by_size():
    # seed 1's models gain 0.4 on every task, seed 2's nothing: over (seed, task) pairs a sure +0.2, over seeds
    # one draw in four has only seed 2 (the interval reaches 0) and one in four only seed 1 (0.4)
    seeds = ["1"] * 40 + ["2"] * 40
    clusters = [i % 8 for i in range(80)]
    v = np.r_[np.full(40, 0.4), np.zeros(40)]
    out = seed_cluster_bootstrap(seeds, clusters, v)
    assert out["mean"] == pytest.approx(0.2) and out["n_seeds"] == 2
    assert out["ci"] == pytest.approx((0.0, 0.4))
    # the point estimate is the plain mean (a cluster of 9 tasks weighs 9 times one of 1)
    sized = seed_cluster_bootstrap([0] * 10, ["a"] * 9 + ["b"], np.r_[np.ones(9), 0.0])
    assert sized["mean"] == pytest.approx(0.9)
    lone = seed_cluster_bootstrap(["0", "1"], ["a", "a"], [1.0, 0.0])  # one cluster: no spread to resample
    assert lone["mean"] == 0.5 and all(c != c for c in lone["ci"])
    assert seed_cluster_bootstrap([], [], [])["n"] == 0
    with pytest.raises(ValueError, match="a seed and a cluster"):
        seed_cluster_bootstrap(["0"], ["a", "b"], [1.0, 0.0])


def test_stratified_bootstrap_weights_every_stratum_equally_whatever_its_size():
    # B gains 1 on each of 2 tasks of stratum "r" and nothing on 18 tasks of stratum "w"
    strata = ["r"] * 2 + ["w"] * 18
    a, b = np.zeros(20), np.r_[np.ones(2), np.zeros(18)]
    out = stratified_paired_bootstrap(strata, a, b)
    assert out["diff"] == 0.5 and out["diff_ci"] == (0.5, 0.5)  # the plain mean would say 0.1
    assert (out["a"], out["b"], out["n_strata"], out["n_tasks"]) == (0.0, 0.5, 2, 20)
    more = stratified_paired_bootstrap(["r"] * 2 + ["w"] * 36, np.zeros(38), np.r_[np.ones(2), np.zeros(36)])
    assert more["diff"] == out["diff"]  # doubling one stratum's tasks changes nothing
    # one stratum: the plain paired mean, and an interval as wide as paired_bootstrap's
    rng = np.random.default_rng(3)
    x, y = rng.random(80) < 0.4, rng.random(80) < 0.6
    one = stratified_paired_bootstrap(["s"] * 80, x, y, seed=1)
    lo, hi = paired_bootstrap(x, y, seed=1)
    assert one["diff"] == pytest.approx(y.mean() - x.mean())
    assert one["diff_ci"][1] - one["diff_ci"][0] == pytest.approx(hi - lo, abs=0.03)
    assert stratified_paired_bootstrap([], [], [])["n_tasks"] == 0
    with pytest.raises(ValueError, match="one stratum each"):
        stratified_paired_bootstrap(["s"], [0.0, 1.0], [1.0, 0.0])


def test_paired_comparison_uses_mcnemar_for_one_binary_sample_and_sign_flip_otherwise():
    a = [[False]] * 6 + [[True]] * 4
    b = [[True]] * 6 + [[True]] * 4
    c = paired_comparison(a, b, resamples=2_000)
    assert c["p_method"] == "mcnemar_exact" and c["p"] == pytest.approx(2 / 2**6) and c["diff"] == pytest.approx(0.6)
    assert (
        c["a"] == pytest.approx(rate_interval(a)) and c["n_tasks"] == 10 and c["diff_ci"][0] <= 0.6 <= c["diff_ci"][1]
    )
    k2 = paired_comparison([[False, True]] * 3, [[True, True]] * 3)
    assert k2["p_method"] == "sign_flip" and k2["p"] == pytest.approx(2 / 8) and k2["diff_ci"] == (0.5, 0.5)
    with pytest.raises(ValueError, match="same tasks"):
        paired_comparison([[True]], [[True], [False]])


def test_unpaired_comparison_resamples_each_sample_on_its_own():
    c = unpaired_comparison([0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    # constant samples: every bootstrap mean is the sample mean; only the observed relabelling (the three ones on
    # b's side) reaches a difference of 1, so the permutation p is about 1 / C(7, 3) = 1 / 35
    assert c["diff"] == 1.0 and c["diff_ci"] == (1.0, 1.0) and (c["n_a"], c["n_b"]) == (4, 3)
    assert c["p"] == pytest.approx(1 / 35, abs=0.01) and c["p_method"] == "permutation"
    same = unpaired_comparison([0.2, 0.4, 0.6, 0.8], [0.8, 0.6, 0.4, 0.2])
    assert (
        same["diff"] == pytest.approx(0.0, abs=1e-12)
        and same["diff_ci"][0] < 0 < same["diff_ci"][1]
        and same["p"] > 0.9
    )
    assert math.isnan(unpaired_comparison([], [1.0])["diff"])


def test_the_permutation_p_does_not_depend_on_how_many_permutations_are_drawn_at_once(monkeypatch):
    import envace.math.stats as stats

    a, b = [0.1, 0.5, 0.3, 0.9, 0.2] * 4, [0.4, 0.6, 0.3, 0.9, 0.2] * 4
    whole = unpaired_comparison(a, b)
    assert 0.05 < whole["p"] < 0.95  # a p that the shuffles decide (not the floor or 1)
    for cells in (len(a) + len(b), 3 * (len(a) + len(b)) + 1):  # one permutation per chunk; chunks that do not divide
        monkeypatch.setattr(stats, "PERMUTATION_CELLS", cells)
        assert unpaired_comparison(a, b) == whole
