"""Files written whole or not at all: a run killed while it writes (a session's end, Ctrl-C, the OOM killer) leaves
the previous version of the file or the new one, never a torn one that a resumed run would fail to read. The text
goes to ``<path>.tmp``, is flushed to disk and renamed over ``path`` (``os.replace`` is atomic on one filesystem)."""

from __future__ import annotations

import json
import os
from typing import Any


def write_text(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, making its folder if needed."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: str, obj: Any, **dump_kwargs: Any) -> None:
    """Replace ``path`` with ``obj`` as JSON atomically (``dump_kwargs`` as ``json.dumps``'s; indent 1 unless given)."""
    write_text(path, json.dumps(obj, **{"indent": 1, **dump_kwargs}))


def write_lines(path: str, lines: list[str]) -> None:
    """Replace ``path`` with ``lines`` (each ending in a newline, or given one) atomically."""
    write_text(path, "".join(line if line.endswith("\n") else line + "\n" for line in lines))
