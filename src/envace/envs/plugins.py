"""Suites from outside envace: packages that declare an ``envace.environments`` entry point.

A package adds a task suite without editing envace by declaring, in its ``pyproject.toml``::

    [project.entry-points."envace.environments"]
    mysuite = "mypackage.suite:load_tasks"

The entry point's name is the suite's name (what ``--suite mysuite`` or ``--suite mysuite:hard`` selects) and its
object a loader of the shape :data:`SUITES` holds: ``load_tasks(spec, split="train", n=None, seed=0) -> list[Task]``
(``spec`` is the whole suite string). Importing ``envace.envs`` loads every such entry point, which imports its
module: the place where the package registers the environment factories its tasks name
(``ENVS.add("myenv", MyEnv)``, :class:`envace.envs.Environment`), as envace's own suites do. ``envace tasks --list``
lists the plug-in suites beside the built-in ones.

A plug-in that cannot be registered (its module does not import or raises, the object is not such a loader, the name
is taken or is not a suite name) is skipped with one line on stderr that names it; the other suites and envace go
on. A loader that raises, or returns anything but tasks of registered environments, is a one-line error of that suite
(:class:`PluginError`), never a traceback.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import re
import sys
from typing import Any, Callable, Collection, Iterable

from ..core.registry import UnknownNameError
from ..core.types import Task
from .registry import ENVS, SUITES, ensure_registered

GROUP = "envace.environments"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
"""A suite name: no ``:`` (the suite's own options follow it), ``@`` (a reference mode) or ``?``."""

PLUGINS: dict[str, str] = {}
"""Suite name -> where it comes from (``dist version (module:attr)``): the plug-in suites registered."""


class PluginError(ValueError):
    """A plug-in suite's loader failed or returned something that is not a list of tasks."""


def _text(e: BaseException) -> str:
    return f"{type(e).__name__}: " + " ".join(str(e).split())[:300]


def _origin(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    where = f"{dist.name} {dist.version}" if dist is not None else "an unnamed distribution"
    return f"{where} ({ep.value})"


def _check_loader(obj: Any) -> None:
    """Raise ``TypeError`` unless ``obj`` can be called as ``obj(spec, split=..., n=..., seed=...)``."""
    if not callable(obj):
        raise TypeError(f"{type(obj).__name__} object is not a loader(spec, split, n, seed)")
    try:
        inspect.signature(obj).bind("spec", split="train", n=None, seed=0)
    except ValueError:  # no signature to read (a builtin): take it on trust
        return
    except TypeError as e:
        raise TypeError(f"the loader cannot be called as loader(spec, split=, n=, seed=): {e}") from None


def guarded(name: str, origin: str, loader: Callable[..., Any]) -> Callable[..., list[Task]]:
    """``loader`` as a :data:`SUITES` entry whose failures are one-line :class:`PluginError` s naming the plug-in."""

    def load(spec: str, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        try:
            tasks = loader(spec, split=split, n=n, seed=seed)
        except Exception as e:  # noqa: BLE001 - a plug-in's failure is its suite's error, not envace's crash
            raise PluginError(f"plug-in suite {name!r} from {origin} failed: {_text(e)}") from e
        if not isinstance(tasks, list) or not all(isinstance(t, Task) for t in tasks):
            got = type(tasks).__name__ if not isinstance(tasks, list) else "a list holding non-Task items"
            raise PluginError(f"plug-in suite {name!r} from {origin} returned {got}; expected a list of envace Task")
        for env in sorted({t.domain for t in tasks}):
            try:
                ensure_registered(env)
            except UnknownNameError:
                pass  # said below, naming the plug-in
            if env not in ENVS:
                raise PluginError(
                    f"plug-in suite {name!r} from {origin} returned tasks of environment {env!r}, which no module "
                    f"registered (its module registers it with ENVS.add({env!r}, factory))"
                )
        return tasks

    load.__doc__ = getattr(loader, "__doc__", None)
    return load


def load_plugins(
    reserved: Collection[str], entry_points: Iterable[importlib.metadata.EntryPoint] | None = None
) -> dict[str, str]:
    """Register every ``envace.environments`` entry point's loader in :data:`SUITES` under its name; skip (one line
    on stderr each) those that fail or whose name is ``reserved`` (envace's own suites) or taken. Returns the
    plug-ins registered now, name -> origin (also added to :data:`PLUGINS`)."""
    try:
        found = list(importlib.metadata.entry_points(group=GROUP) if entry_points is None else entry_points)
    except Exception as e:  # noqa: BLE001 - broken metadata somewhere on sys.path must not stop envace
        print(
            f"envace: plug-in suites not loaded: reading the {GROUP} entry points failed: {_text(e)}", file=sys.stderr
        )
        return {}
    added: dict[str, str] = {}
    for ep in found:
        origin = _origin(ep)
        if not NAME.fullmatch(ep.name):
            why = "the name is not a suite name (letters, digits, '_', '.', '-'; no ':' '@' '?')"
        elif ep.name in reserved:
            why = f"the name is envace's own suite {ep.name!r}"
        elif ep.name in SUITES:
            why = f"the name is taken by {PLUGINS.get(ep.name, 'another suite')}"
        else:
            try:
                loader = ep.load()
                _check_loader(loader)
            except (Exception, SystemExit) as e:  # noqa: BLE001 - one broken plug-in never stops the others
                why = _text(e)
            else:
                SUITES.add(ep.name, guarded(ep.name, origin, loader))
                PLUGINS[ep.name] = added[ep.name] = origin
                continue
        print(f"envace: plug-in suite {ep.name!r} from {origin} skipped: {why}", file=sys.stderr)
    return added
