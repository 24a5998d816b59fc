"""Seeds: the process-wide seeding of a run and the one rule by which every other seed is derived from a base.

:func:`derive_seed` folds salts into a base, ``s = s * prime + salt`` for each salt, modulo 2**63 (a valid
generator seed). Each use keeps its own prime and salts, so the streams it derives stay apart and the values are
those envace has always used:

===============================  ==================================  =================================================
where                            seed                                call
===============================  ==================================  =================================================
rollout call n (and its stream)  ``seed * 1_000_003 + n``            ``derive_seed(seed, n)``
process r of a launched run      ``seed + 1_000_003 * r``            ``derive_seed(r, seed)``
training iteration i             ``seed * 100_003 + i``              ``derive_seed(seed, i, prime=ITERATION_PRIME)``
real share of iteration seed s   ``s * 1_000_003 + 1``               ``derive_seed(s, REAL_SALT)``
test-time attempt batch a        ``(seed + 1) * 7919 + a``           ``derive_seed(seed + 1, a, prime=ATTEMPT_PRIME)``
tts plan / reflection / memory   ``seed * 1_000_003 + 500_009 + n``  ``derive_seed(seed, PRIVATE_SALT + n)``
===============================  ==================================  =================================================

(``ITERATION_PRIME``, ``REAL_SALT``: envace.training.trainer; ``ATTEMPT_PRIME``, ``PRIVATE_SALT``:
envace.evaluation.tts.) A backend's stream seeded ``s`` seeds its call n with ``s * 1_000_003 + n`` too
(``Backend.generate_stream``, which computes it itself).

The modulo changes none of them for non-negative seeds below 2**63 / prime (every seed a config takes), and where
a negative base reaches it the result is congruent modulo 2**63 to the old one, which is all that the rollout's
own ``% 2**63`` afterwards sees.
"""

from __future__ import annotations

SEED_MODULUS = 2**63
PRIME = 1_000_003
"""The default multiplier of :func:`derive_seed` (a prime, so that the salts of nearby bases do not collide)."""


def derive_seed(base: int, *salts: int, prime: int = PRIME) -> int:
    """``base`` with each of ``salts`` folded in (``s = s * prime + salt``), modulo 2**63."""
    s = base
    for salt in salts:
        s = s * prime + salt
    return s % SEED_MODULUS


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (the start of a training or SFT run)."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
