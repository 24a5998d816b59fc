"""Environments: the protocol, the registries, the built-in suites and the benchmark adapters."""

from __future__ import annotations

import importlib

from ..core.registry import UnknownNameError
from .plugins import PLUGINS, PluginError, load_plugins
from .base import (
    ENVS,
    FAULT_KINDS,
    SUITES,
    SUMMARIES,
    TASK_AT,
    USERS,
    UNEXECUTED,
    UNPREPARED,
    Play,
    Prepare,
    ScriptedUser,
    UserSide,
    UserSimulator,
    CheckReport,
    EnvStartupError,
    Environment,
    Score,
    ToolError,
    alive_bound,
    call_with_timeout,
    check_env,
    load_tasks,
    load_tasks_of_kinds,
    make_env,
    prepare_groups,
    prepare_tasks,
    require_prepared,
    unprepared,
    final_outcome,
    replay,
    replay_allowed,
    ReplayNotAllowedError,
    suite_summary,
    task_at,
)

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
    "files-world": "envace.envs.builtin",
    "bfcl": "envace.envs.bfcl_v4",
    "tau2": "envace.envs.tau2",
    "mcp": "envace.envs.mcp",
}
_EXTRAS = {"bfcl": "bfcl", "tau2": "tau2", "mcp": "mcp"}


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
                f"environment {prefix!r} needs optional packages that are not installed ({e}); "
                f"install the '{extra}' extra with: bash requirements/install-bench-envs.sh <python> "
                f"(a minimal pinned set; a plain pip install 'envace[{extra}]' pulls the benchmark's full, multi-GB dependencies)"
            ) from e
        raise


def registered_suites() -> dict[str, str]:
    """Every suite name ``--suite`` accepts -> where it comes from: envace's own (``built-in``, or the extra it
    needs) and the plug-ins' (:mod:`envace.envs.plugins`: ``dist version (module:attr)``)."""
    own = {name: f"built-in, extra '{_EXTRAS[name]}'" if name in _EXTRAS else "built-in" for name in _PROVIDERS}
    return dict(sorted({**own, **{n: f"plug-in: {o}" for n, o in PLUGINS.items()}}.items()))


# Suites of other packages (entry points of the group "envace.environments"): registered now, once, after every
# name above exists, so that a plug-in module may import them from envace.envs.
load_plugins(reserved=set(_PROVIDERS))

__all__ = [
    "ENVS",
    "FAULT_KINDS",
    "SUITES",
    "SUMMARIES",
    "TASK_AT",
    "USERS",
    "UNEXECUTED",
    "UNPREPARED",
    "Play",
    "Prepare",
    "ScriptedUser",
    "UserSide",
    "UserSimulator",
    "CheckReport",
    "EnvStartupError",
    "Environment",
    "Score",
    "ToolError",
    "alive_bound",
    "call_with_timeout",
    "check_env",
    "ensure_registered",
    "registered_suites",
    "PLUGINS",
    "PluginError",
    "load_tasks",
    "load_tasks_of_kinds",
    "make_env",
    "prepare_groups",
    "prepare_tasks",
    "require_prepared",
    "unprepared",
    "final_outcome",
    "replay",
    "replay_allowed",
    "ReplayNotAllowedError",
    "MissingExtraError",
    "suite_summary",
    "task_at",
]
