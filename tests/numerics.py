"""Comparing numbers that two computations give equal in exact arithmetic (a shared prefix run once against every
pack run whole, packed rows against row by row, two processes against one, a fused decoder against the model).

In float32 the two sides add the same terms in another order (other matmul shapes, blockings, reductions, and the
kernels a CPU picks: AVX-512 and AVX2 builds of the same op round differently), so they differ by rounding: about
``eps * sqrt(n)`` of the *terms'* magnitude, whatever the size of the element itself. A per-element ``rtol/atol``
pair is therefore either too tight (an element near 0 that is the difference of large terms misses a fixed atol by
a rounding) or too loose (an atol larger than the tensor). Here the tolerance is relative to each tensor:

- norm: ``||a - b|| <= rel * ||b||``; rounding gives ~1e-7 in float32 (measured: below 2e-7 for every gradient of
  the tiny model, AVX-512 and AVX2 alike); a real mismatch (a dropped term, a lost gradient path) gives >= 1e-3;
- element: ``max|a - b| <= elem * max(max|b|, floor)``, so that a mismatch confined to a few elements, which the
  norm dilutes, still fails (rounding: ~3e-7 of the largest element).

Log-probs are compared on the same scale with ``floor=1``: their rounding is that of the logits and of the
log-sum-exp, not of the (maybe tiny) log-prob itself.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import torch

REL = 1e-5
"""Default bound on ``||a - b|| / ||b||`` (float32 rounding is ~1e-7; ~100x margin)."""
ELEM = 1e-4
"""Default bound on ``max|a - b| / max|b|`` (rounding ~3e-7)."""
LOGPROB_ELEM = 1e-5
"""Per-element bound for log-probs, relative to ``max(max|logprob|, 1)``: ~1e-4 at the ~11 of a near-uniform 49k
vocabulary, where float32 rounding leaves ~1e-6."""
TINY = 1e-30


def _as_tensor(x: torch.Tensor | Sequence[float]) -> torch.Tensor:
    t = x.detach() if isinstance(x, torch.Tensor) else torch.tensor(list(x), dtype=torch.float64)
    return t.to(torch.float64).cpu()


def relative_errors(
    actual: torch.Tensor | Sequence[float], expected: torch.Tensor | Sequence[float], floor: float = 0.0
) -> tuple[float, float]:
    """``(||a - b|| / max(||b||, floor * sqrt(n)), max|a - b| / max(max|b|, floor))`` in float64: ``floor`` is the
    least magnitude an element's rounding is relative to."""
    a, b = _as_tensor(actual), _as_tensor(expected)
    d = a - b
    norm = float(d.norm() / max(float(b.norm()), floor * d.numel() ** 0.5, TINY)) if d.numel() else 0.0
    elem = float(d.abs().max() / max(float(b.abs().max()), floor, TINY)) if d.numel() else 0.0
    return norm, elem


def assert_close_rel(
    actual: torch.Tensor | Sequence[float],
    expected: torch.Tensor | Sequence[float],
    *,
    rel: float = REL,
    elem: float = ELEM,
    floor: float = 0.0,
    what: str = "tensor",
) -> None:
    """Assert that ``actual`` equals ``expected`` up to float rounding relative to the magnitude of ``expected``.

    Same shape, non-finite values at the same places and equal there, and over the finite entries
    ``||a - b|| <= rel * max(||b||, floor * sqrt(n))`` and ``max|a - b| <= elem * max(max|b|, floor)`` (see the
    module docstring)."""
    a, b = _as_tensor(actual), _as_tensor(expected)
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != expected {tuple(b.shape)}"
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    assert torch.equal(fa, fb) and torch.equal(a[~fa].nan_to_num(), b[~fb].nan_to_num()), (
        f"{what}: non-finite values differ"
    )
    a, b = a[fa], b[fb]
    norm, worst = relative_errors(a, b, floor)
    if norm > rel or worst > elem:
        i = int((a - b).abs().argmax()) if a.numel() else 0
        raise AssertionError(
            f"{what}: relative error {norm:.3g} (bound {rel:g}), worst element {worst:.3g} of max(max|expected|, "
            f"{floor:g}) (bound {elem:g}): flat index {i}, {float(a[i]):.9g} vs {float(b[i]):.9g}"
        )


def assert_all_close_rel(
    actual: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    *,
    rel: float = REL,
    elem: float = ELEM,
    what: str = "",
) -> None:
    """:func:`assert_close_rel` for every tensor of two dicts with the same keys (gradients, parameter updates)."""
    assert actual.keys() == expected.keys(), f"{what}: keys differ: {sorted(set(actual) ^ set(expected))}"
    for name in expected:
        assert_close_rel(actual[name], expected[name], rel=rel, elem=elem, what=f"{what}{name}")


def assert_logprobs_close(
    actual: Iterable[float] | torch.Tensor,
    expected: Iterable[float] | torch.Tensor,
    *,
    rel: float = REL,
    elem: float = LOGPROB_ELEM,
    what: str = "log-probs",
) -> None:
    """Log-probs of the same tokens computed two ways (see the module docstring for the ``floor=1`` scale)."""
    a = actual if isinstance(actual, torch.Tensor) else list(actual)
    b = expected if isinstance(expected, torch.Tensor) else list(expected)
    assert_close_rel(a, b, rel=rel, elem=elem, floor=1.0, what=what)
