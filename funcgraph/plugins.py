"""A user's own modules brought in by name (``--import MODULE``): the layers, models, ops,
algorithms and datasets they register become nameable.

One place imports them, for the commands and for the processes a command spawns (``funcgraph
tune --workers N``), so a module that fails is the same one-line error everywhere. It also
remembers what it imported: a run directory records those modules in its ``config.json``
(``"imports"``, see :meth:`funcgraph.train.Run.create`), and :func:`import_recorded` imports
them again for whatever reads the run later (``evaluate``, ``export``, ``--resume``), so no
command has to repeat ``--import``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .errors import ConfigError

_IMPORTED: list[str] = []


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
        if name not in _IMPORTED:
            _IMPORTED.append(name)


def imported_plugins() -> list[str]:
    """The modules :func:`import_plugins` has imported in this process, in order."""
    return list(_IMPORTED)


def import_recorded(config: Mapping[str, Any], run_dir: str | Path) -> None:
    """Import the modules a run recorded (its config's ``"imports"``), so the names they
    registered resolve; a module that is gone is one line saying which run needs it."""
    names = config.get("imports") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{run_dir}/config.json: 'imports' must be a list of module names, "
                          f"got {names!r}")
    try:
        import_plugins(names)
    except ConfigError as e:
        raise ConfigError(f"the run in {run_dir} was made with {e.args[0].split(':')[0]}, "
                          f"which does not import here ({str(e).split(': ', 1)[1]}); run from "
                          "the folder that holds the module or put it on PYTHONPATH") from None


__all__ = ["import_plugins", "import_recorded", "imported_plugins"]
