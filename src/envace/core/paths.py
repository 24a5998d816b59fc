"""Checks that an output path can be written, made before the work whose result goes there (a model load, an
evaluation), so that a bad path fails at once with one line instead of after the work, losing it. They create
nothing: a run that fails its checks leaves no empty folder behind."""

from __future__ import annotations

import os


def _nearest_existing(path: str) -> str:
    """``path`` itself if it exists, else its closest existing ancestor (at worst the root)."""
    p = os.path.abspath(path)
    while not os.path.lexists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    return p


def check_writable_dir(path: str, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` (e.g. ``out_dir``) unless folder ``path`` exists and is writable, or can
    be made: its closest existing ancestor is a writable folder."""
    base = _nearest_existing(path)
    if not os.path.isdir(base):
        raise ValueError(f"{what} {path!r} cannot be made: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path!r} cannot be written: {base} is not writable")


def check_writable_file(path: str, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` (e.g. ``--out``) unless a file can be written at ``path``: it is not a
    folder, and either it is a writable file or its folder is writable or can be made (:func:`check_writable_dir`)."""
    p = os.path.abspath(path)
    if os.path.isdir(p):
        raise ValueError(f"{what} {path!r} is a folder; give a file path")
    if os.path.exists(p):
        if not os.access(p, os.W_OK):
            raise ValueError(f"{what} {path!r} cannot be written: permission denied")
        return
    check_writable_dir(os.path.dirname(p), what + " folder")
