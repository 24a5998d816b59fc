"""Environments: the protocol (``base``), the registries (``registry``), suite loading (``suites``), user
simulators (``users``), reference examples (``references``), the built-in suites and the benchmark adapters."""

from __future__ import annotations

from .plugins import PLUGINS, PluginError, load_plugins
from .base import (
    FAULT_KINDS,
    UNPREPARED,
    CheckReport,
    EnvStartupError,
    Environment,
    Play,
    Prepare,
    ReplayNotAllowedError,
    Score,
    ToolError,
    alive_bound,
    call_with_timeout,
    check_env,
    final_outcome,
    make_env,
    prepare_groups,
    prepare_tasks,
    replay,
    replay_allowed,
    require_prepared,
    unprepared,
)
from .registry import _EXTRAS, _PROVIDERS, ENVS, SUITES, SUMMARIES, TASK_AT, MissingExtraError, ensure_registered
from .suites import load_tasks, load_tasks_of_kinds, suite_summary, task_at
from .users import UNEXECUTED, USERS, ScriptedUser, UserSide, UserSimulator


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
