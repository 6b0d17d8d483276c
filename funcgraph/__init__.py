"""funcgraph: dynamic-graph deep learning as pure functions over parameter dicts."""

from . import debug, factory, meta, models, nas, nn, params, random
from .control import cond
from .errors import FuncgraphError
from .model import Model, bind, from_module, stateless
from .params import Params, State

__version__ = "0.1.0"

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
