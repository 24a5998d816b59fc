"""The environment registries: environments and task suites by name, and the modules that fill them.

A name is the part of a task's ``env`` (or of a suite spec) before ``:``. The built-in suites and the benchmark
adapters register themselves when their module is imported; :func:`ensure_registered` imports the module that
provides a name when it is first asked for, so an optional benchmark's packages matter only when it is used.
The environment protocol is :mod:`envace.envs.base`, loading a suite's tasks :mod:`envace.envs.suites`.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Sequence

from ..core.registry import Registry, UnknownNameError
from ..core.types import Task

# name -> factory(task) -> Environment (envace.envs.base). The name is the part of ``task.env`` before ':'.
ENVS: Registry[Callable[[Task], Any]] = Registry("environment")
# name -> loader(spec, split, n, seed) -> list[Task]. ``spec`` is the full string (e.g. "bfcl:multi_turn_base").
SUITES: Registry[Callable[..., list[Task]]] = Registry("task suite")


# name -> task_at(spec, split, index) -> Task: a suite's task ``index`` of its stable order, built alone (the generated
# built-in suites, whose end is far off); :func:`task_at` loads the whole split of any other suite and indexes it.
TASK_AT: Registry[Callable[[str, str, int], Task]] = Registry("task indexer")


# name -> summary(per-task rows of an evaluation, suite spec) -> {"title", "text", ...}: a benchmark's own report of
# an evaluation of its tasks (BFCL's leaderboard table), shown after the metrics and saved with the result.
SUMMARIES: Registry[Callable[[Sequence[dict[str, Any]], str], dict[str, Any]]] = Registry("suite summary")


# Modules that register environments / suites, by name prefix. Optional adapters are imported lazily so that
# a missing extra only matters when that environment is asked for.
_PROVIDERS: dict[str, str] = {
    "builtin": "envace.envs.builtin",
    "bank": "envace.envs.builtin",
    "shop": "envace.envs.builtin",
    "files": "envace.envs.builtin",
    "builtin-world": "envace.envs.builtin",
    "bank-world": "envace.envs.builtin",
    "shop-world": "envace.envs.builtin",
    "shop-world-decide": "envace.envs.builtin",
    "files-world": "envace.envs.builtin",
    "bfcl": "envace.envs.bfcl.v4",
    "tau2": "envace.envs.tau2",
    "mcp": "envace.envs.mcp",
    "verifiers": "envace.envs.verifiers_env",
}
_EXTRAS = {"bfcl": "bfcl", "tau2": "tau2", "mcp": "mcp", "verifiers": "verifiers"}


class MissingExtraError(ImportError):
    pass


def ensure_registered(spec: str) -> None:
    """Import the module that provides ``spec``'s environment; a missing optional package names the extra."""
    prefix = spec.split(":", 1)[0]
    module = _PROVIDERS.get(prefix)
    if module is None and prefix not in ENVS and prefix not in SUITES:  # the registries may not be filled yet
        known = sorted(set(_PROVIDERS) | set(ENVS.names()) | set(SUITES.names()))
        raise UnknownNameError(f"unknown environment or task suite {prefix!r}; valid names: {', '.join(known)}")
    if module is None or prefix in ENVS:
        return
    try:
        importlib.import_module(module)
    except ImportError as e:
        extra = _EXTRAS.get(prefix)
        if extra and not module.endswith(str(getattr(e, "name", "")) or "\0"):
            raise MissingExtraError(
                f"environment {prefix!r} needs optional packages that are not installed ({e}); install the "
                f"'{extra}' extra with: bash requirements/install-bench-envs.sh <python> (a minimal pinned "
                f"set; a plain pip install 'envace[{extra}]' pulls the benchmark's full, multi-GB dependencies)"
            ) from e
        raise
