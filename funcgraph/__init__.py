"""funcgraph: dynamic-graph deep learning as pure functions over parameter dicts.

The core names (``Model``, ``bind``, ``cond``, ``Params``...) and the subpackages (``nn``,
``meta``, ``nas``, ``data``, ...) load on first use (PEP 562), so ``import funcgraph`` imports
no torch and ``funcgraph --help`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._exports import lazy_exports
from .version import __version__

if TYPE_CHECKING:
    from . import debug, factory, meta, models, nas, nn, params, random
    from .control import cond
    from .errors import FuncgraphError
    from .model import Model, bind, stateless
    from .nn.torch_module import from_module
    from .params import Params, State

_CORE = {"cond": "control", "FuncgraphError": "errors", "Model": "model", "bind": "model",
         "from_module": "nn.torch_module", "stateless": "model", "Params": "params",
         "State": "params"}
"""Core name -> the module defining it, imported on first use of the name."""

_MODULES = ("allocator", "checks", "control", "data", "debug", "distributed", "errors", "export",
            "factory", "files", "meta", "model", "models", "nas", "nn", "params", "placement",
            "plugins", "precision", "random", "runs", "testing", "train")
"""The subpackages and modules the docs cite, each reachable as ``funcgraph.<name>`` after a
plain ``import funcgraph`` (imported on first use)."""


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

__getattr__, __dir__ = lazy_exports(__name__, __all__, submodules=_MODULES, homes=_CORE)
