"""Moved to :mod:`envace.evaluation.agreement` (issue 30: a measurement, so it lives with the other measurements).

This module is a one-version alias: each name is read from the new place on first use, so ``rewards`` (a lower
floor) imports nothing of ``evaluation`` when it is loaded. Import from ``envace.evaluation.agreement``.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    """A name of :mod:`envace.evaluation.agreement`, read from there (the one-version alias)."""
    return getattr(importlib.import_module("envace.evaluation.agreement"), name)
