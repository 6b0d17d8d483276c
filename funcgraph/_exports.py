"""What every funcgraph package shows and loads on attribute access (PEP 562), written once.

A package lists its public names in ``__all__`` and the submodules its docs cite; ``dir()``
shows those and nothing else, loaded or not. A cited submodule the package does not import
itself is imported on first attribute access, and a package whose names load on first use
(the top level, ``meta``, ``data``) maps each such name to the module that defines it::

    __getattr__, __dir__ = lazy_exports(__name__, __all__, submodules=_MODULES, homes=_HOME)

A package that imports its names itself makes the call under ``if not TYPE_CHECKING:``, so
that type checkers resolve its names through those imports (a module ``__getattr__`` they
can see would let any misspelt name pass). This module imports nothing but
:mod:`importlib` and :mod:`sys`, so ``import funcgraph`` stays free of torch.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str,
    public: Iterable[str] | None = None,
    *,
    submodules: Iterable[str],
    homes: Mapping[str, str] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``(__getattr__, __dir__)`` of ``package``.

    Arguments:
        package: the package's ``__name__``.
        public: its ``__all__``; ``None`` reads the package's ``__all__`` when ``dir()`` is
            first called, for a package that lists its names after this call (its list then
            ends the file).
        submodules: the submodules its docs cite, reachable as ``package.<name>``: with
            ``public``, all that ``dir()`` lists.
        homes: public name -> the module defining it, relative to ``package`` (``"control"``,
            ``"nn.torch_module"``; a leading dot climbs: ``"..model"``), imported on first
            use of the name. A name found here is that module's attribute, not a submodule.

    ``__dir__()`` is ``public`` and ``submodules``, sorted. ``__getattr__(name)`` gives a name
    of ``homes`` or one of ``submodules``, else raises the AttributeError Python would.
    """
    home_of = dict(homes or {})
    cited = frozenset(submodules)
    listed: list[str] = []

    def getattr_(name: str) -> Any:
        if name in home_of:
            home = home_of[name]
            module = importlib.import_module(home if home.startswith(".") else f".{home}",
                                             package)
            return getattr(module, name)
        if name in cited:
            return importlib.import_module(f".{name}", package)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        if not listed:
            names = public if public is not None else sys.modules[package].__all__
            listed.extend(sorted({*names, *cited}))
        return list(listed)

    getattr_.__doc__ = (f"A name or documented submodule of {package} that is not loaded "
                           "yet, imported on first use (PEP 562).")
    dir_.__doc__ = f"The public names and the documented submodules of {package}; nothing else."
    return getattr_, dir_


__all__ = ["lazy_exports"]
