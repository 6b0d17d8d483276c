"""funcgraph: dynamic-graph deep learning as pure functions over parameter dicts.

The core names (``Model``, ``bind``, ``cond``, ``Params``...) load with the package; the
subpackages (``nn``, ``meta``, ``nas``, ``data``, ...) load on first use, so ``import
funcgraph`` and ``funcgraph --help`` stay light.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from .control import cond
from .errors import FuncgraphError
from .model import Model, bind, from_module, stateless
from .params import Params, State

if TYPE_CHECKING:
    from . import debug, factory, meta, models, nas, nn, params, random

__version__ = "0.1.0"

SUBPACKAGES = ("data", "debug", "factory", "meta", "models", "nas", "nn", "params", "random",
               "runs", "testing", "train")
"""Subpackages reachable as ``funcgraph.<name>`` after a plain ``import funcgraph``."""


def __getattr__(name: str) -> ModuleType:
    """Import a subpackage on first attribute access (PEP 562)."""
    if name in SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FuncgraphError",
    "Model",
    "Params",
    "State",
    "__version__",
    "bind",
    "cond",
    "debug",
    "factory",
    "from_module",
    "meta",
    "models",
    "nas",
    "nn",
    "params",
    "random",
    "stateless",
]
