"""The float-rounding comparison of tests/numerics.py: rounding-level differences pass, real mismatches fail."""

import pytest
import torch

from numerics import ELEM, REL, assert_all_close_rel, assert_close_rel, assert_logprobs_close, relative_errors


def _two_orders(n: int = 4096, terms: int = 64, decades: float = 5.0):
    """The same sums of float32 terms added in two orders (x, y), and the exact sums (float64)."""
    g = torch.Generator().manual_seed(0)
    t = torch.randn(terms, n, generator=g) * torch.logspace(-decades, 0, n)  # element magnitudes over ``decades``
    forward = torch.zeros(n)
    for row in t:
        forward += row
    return forward, t.flip(0).sum(0), t.double().sum(0)


def test_float32_sums_in_another_order_are_close_though_elementwise_rtol_atol_fails():
    x, y, _ = _two_orders()
    assert not torch.equal(x, y)
    assert not torch.allclose(x, y, rtol=1e-6, atol=1e-7)  # a fixed per-element tolerance trips on rounding
    assert_close_rel(x, y)
    norm, elem = relative_errors(x, y)
    assert norm < REL / 10 and elem < ELEM / 10  # a wide margin


def test_a_real_mismatch_fails_by_norm_or_by_one_element():
    x, y, _ = _two_orders()
    with pytest.raises(AssertionError, match="relative error"):
        assert_close_rel(x * 1.001, y)  # every element 0.1% off
    x, y, _ = _two_orders(n=65536, terms=4, decades=0)  # a large tensor of like elements ...
    one = x.clone()
    one[7] += 3 * ELEM * y.abs().max()  # ... one of them off by 0.03% of the largest: the norm alone dilutes it
    assert relative_errors(one, y)[0] < REL
    with pytest.raises(AssertionError, match="worst element"):
        assert_close_rel(one, y)
    with pytest.raises(AssertionError, match="shape"):
        assert_close_rel(x[:-1], y)
    nan = x.clone()
    nan[0] = float("nan")
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close_rel(nan, y)


def test_dicts_name_the_tensor_that_differs():
    x, y, _ = _two_orders()
    assert_all_close_rel({"a": x, "b": 2 * x}, {"a": y, "b": 2 * y})
    with pytest.raises(AssertionError, match="grad of b"):
        assert_all_close_rel({"a": x, "b": 2 * x}, {"a": y, "b": 2.01 * y}, what="grad of ")
    with pytest.raises(AssertionError, match="keys"):
        assert_all_close_rel({"a": x}, {"a": y, "b": y})


def test_logprobs_are_compared_on_the_scale_of_the_logits_not_of_the_logprob():
    near_zero = [-1e-6, -2e-6, -5e-7]  # confident tokens: rounding of the logits still leaves ~1e-6
    assert_logprobs_close([v + 1e-6 for v in near_zero], near_zero)
    uniform = [-10.79] * 8
    assert_logprobs_close([v + 2e-6 for v in uniform], uniform)
    with pytest.raises(AssertionError):
        assert_logprobs_close([uniform[0] + 1e-3] + uniform[1:], uniform)  # one token off by 1e-3
