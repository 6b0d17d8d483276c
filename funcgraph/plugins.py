"""A user's own modules brought in by name (``--import MODULE``): the layers, models, ops,
algorithms and datasets they register become nameable.

One place imports them, for the commands and for the processes a command spawns (``funcgraph
tune --workers N``), so a module that fails is the same one-line error everywhere.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable

from .errors import ConfigError


def import_plugins(modules: Iterable[str] | None) -> None:
    """Import each module named in ``modules`` (the working directory on the path, as
    ``python -m`` would see it); one that fails is a :class:`ConfigError` naming it."""
    if "" not in sys.path:
        sys.path.insert(0, "")
    for name in modules or []:
        try:
            importlib.import_module(name)
        except Exception as e:  # any failure of the user's module is reported alike
            raise ConfigError(f"--import {name}: {type(e).__name__}: {e}") from None


__all__ = ["import_plugins"]
