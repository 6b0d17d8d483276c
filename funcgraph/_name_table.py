"""The table behind a registry that runs name their choices from (datasets, algorithms).

Entries by name in the order of registration (built-ins first); a taken name is refused
unless replacing; an unknown name is a :class:`~funcgraph.errors.ConfigError` whose message
the registry words, with the closest registered name as a hint. Imports no torch: the
registries are read by ``--help``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Generic, TypeVar

from .errors import ConfigError

E = TypeVar("E")


class NameTable(Generic[E]):
    """Name -> entry, in the order of registration.

    Arguments:
        register: the public registering function, named by the error for a taken name.
        unknown: ``(name, hint) -> message`` of the error for a name not registered;
            ``hint`` is ``" (did you mean 'x'?)"`` or empty.
    """

    def __init__(self, register: str, unknown: Callable[[object, str], str]) -> None:
        self._entries: dict[str, E] = {}
        self._register = register
        self._unknown = unknown

    def add(self, name: str, entry: E, *, replace: bool) -> E:
        """Register ``entry`` under ``name``; a ConfigError if the name is taken and
        ``replace`` is false."""
        if name in self._entries and not replace:
            raise ConfigError(f"{self._register}: {name!r} is already registered; pick another "
                              "name or pass replace=True")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        """Forget ``name`` (nothing happens if it is not registered)."""
        self._entries.pop(name, None)

    def names(self) -> list[str]:
        """Every registered name, in the order of registration."""
        return list(self._entries)

    def values(self) -> list[E]:
        """Every entry, in the order of registration."""
        return list(self._entries.values())

    def get(self, name: object) -> E:
        """The entry for ``name``; a ConfigError worded by ``unknown`` if there is none."""
        if isinstance(name, str) and name in self._entries:
            return self._entries[name]
        close = difflib.get_close_matches(str(name), list(self._entries), n=1)
        raise ConfigError(self._unknown(name, f" (did you mean {close[0]!r}?)" if close else ""))


__all__ = ["NameTable"]
