"""Grouping token sequences by common prefix, for computing a shared prefix once (the HF backend's prefill,
the update's micro-batches).

Sequences are sorted (lexicographically) so that those sharing a prefix are neighbours; ``adjacent[i]`` is the
length of the prefix shared by sorted sequences i and i+1. A run is cut where that link is shorter than
``min_prefix``, or weak next to a neighbouring link (less than half of it): the K prompts of one task share
system prompt, tool schemas and first turn (~600 tokens) and are not merged with another task's prompts that
share only a 150-token preamble. A run's common prefix is the smallest link inside it.
"""

from __future__ import annotations


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the common prefix of ``a`` and ``b``, at most ``limit``."""
    n = 0
    limit = min(limit, len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def prefix_runs(adjacent: list[int], min_prefix: int) -> list[tuple[int, int, int]]:
    """Runs of sorted sequences worth sharing a prefix: (first, end, common prefix length), end exclusive;
    sequences in no run are left out. ``adjacent``: the n - 1 links of n sorted sequences."""
    n = len(adjacent) + 1
    cut = []
    for i, a in enumerate(adjacent):
        strongest_neighbour = max(adjacent[i - 1] if i > 0 else 0, adjacent[i + 1] if i + 1 < len(adjacent) else 0)
        cut.append(a < min_prefix or 2 * a < strongest_neighbour)
    runs, start = [], 0
    for i in range(n):
        if i == n - 1 or cut[i]:
            if i > start:
                runs.append((start, i + 1, min(adjacent[start:i])))
            start = i + 1
    return runs
