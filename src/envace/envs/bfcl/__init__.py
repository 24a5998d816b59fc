"""BFCL-v4 (PyPI ``bfcl-eval``) as envace tasks and real environments.

- :mod:`.multi_turn`: the four multi-turn categories (their executable backends, BFCL's own checker); its public
  names are also this package's, as when ``envace.envs.bfcl`` was that one module.
- :mod:`.single_turn`: the single-turn categories (one response, scored by BFCL's AST checker).
- :mod:`.memory`: the agentic memory categories (``memory_kv``, ``memory_rec_sum``).
- :mod:`.v4`: the ``bfcl`` suite over all of them (category names and collections, options, the leaderboard
  summary) and the registration of the suite and of the environment factory of every BFCL task.

Importing this package imports ``bfcl_eval`` (the ``bfcl`` extra); ``envace.envs.ensure_registered`` imports
:mod:`.v4` when a ``bfcl`` suite or task is first asked for.
"""

from __future__ import annotations

from .multi_turn import (
    CATEGORIES,
    POOL_TASKS,
    SPLITS,
    SYSTEM_PROMPT,
    TEST_FRACTION,
    BFCLEnv,
    convert_entry,
    execute,
    format_result,
    instances_state,
    invoke,
    load_bfcl_tasks,
    make_instances,
    normalize_schema,
    parse_gold_call,
    reference_pool,
    score_turns,
    split_of,
    tool_spec,
    trajectory_turns,
)

__all__ = [
    "CATEGORIES",
    "POOL_TASKS",
    "SPLITS",
    "SYSTEM_PROMPT",
    "TEST_FRACTION",
    "BFCLEnv",
    "convert_entry",
    "execute",
    "format_result",
    "instances_state",
    "invoke",
    "load_bfcl_tasks",
    "make_instances",
    "normalize_schema",
    "parse_gold_call",
    "reference_pool",
    "score_turns",
    "split_of",
    "tool_spec",
    "trajectory_turns",
]
