"""Weak references to what a piece of code makes -- HF backends with their models, KV caches -- for tests that check
it is all freed when the code is done, by reference counting alone: with the cyclic garbage collector off
(:func:`no_cyclic_gc`) an object that only a reference cycle keeps counts as alive, as it is in a long process
until the collector's next full pass (an experiment runs every arm in one process)."""

import contextlib
import gc
import weakref
from typing import Any, Iterator


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """The cyclic garbage collector off inside (garbage made before is collected first)."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Made:
    """Weak references to every HFBackend (and its model, with ``backends``) and every KV cache (prefill
    ``SlabCache``, stream ``_Stream``) made while the test's ``monkeypatch`` holds."""

    def __init__(self, monkeypatch: Any, backends: bool = True):
        from envace.backends import kvcache
        from envace.backends.hf import HFBackend

        self.refs: list[tuple[str, weakref.ref]] = []
        for cls in (kvcache.SlabCache, kvcache._Stream) + ((HFBackend,) if backends else ()):
            self._track(monkeypatch, cls)

    def _track(self, monkeypatch: Any, cls: type) -> None:
        init = cls.__init__

        def tracked(obj: Any, *args: Any, **kwargs: Any) -> None:
            init(obj, *args, **kwargs)
            self.refs.append((type(obj).__name__, weakref.ref(obj)))
            if hasattr(obj, "model"):  # a backend's model
                self.refs.append((f"{type(obj).__name__}.model", weakref.ref(obj.model)))

        monkeypatch.setattr(cls, "__init__", tracked)

    def kinds(self) -> set[str]:
        """The kinds of object made."""
        return {name for name, _ in self.refs}

    def alive(self) -> list[str]:
        """The kinds of those still alive, one entry per object."""
        return [name for name, ref in self.refs if ref() is not None]
