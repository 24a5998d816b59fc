"""Tiny named registries: a dict plus a decorator.

Registering a name twice is an error; looking up an unknown name raises an error that lists the valid ones.
A new variant of anything (advantage estimator, environment, backend, reward) is a new entry, not a flag.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """Raised for a name that no entry of a registry has; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            self.add(name, obj)
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = obj

    def remove(self, name: str) -> T:
        """Take an entry out (a test's temporary entry, say); an unknown name raises as :meth:`get` does."""
        entry = self.get(name)
        del self._entries[name]
        return entry

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(sorted(self._entries)) or "(none)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid names: {valid}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
