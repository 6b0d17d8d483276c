"""Models from config files: ``load_model("conv4")``, ``build(config)``, custom layers by name.

See ``docs/factory.md`` for the schema. Configs are data: types resolve only through the
registry (:func:`register_layer`, the ``funcgraph.layers`` entry points), references
(``"$hidden * 2"``) through a small safe evaluator, and every mistake raises
:class:`~funcgraph.errors.ConfigError` naming the config path.
"""

from typing import TYPE_CHECKING

from .._exports import lazy_exports
from .build import Built, LayerRow, build, shape_of
from .builtin_layers import channel_dim, last_dim
from .config import apply_overrides, load_config, parse_overrides, shipped_configs
from .inits import INITIALIZERS, with_init
from .layer_type import LayerType, Slot
from .load import check_model, load_model, resolve_source
from .meta_tensors import meta_init
from .registry import REGISTRY, Registry, register_layer

if not TYPE_CHECKING:  # type checkers see the names and submodules through the imports
    __getattr__, __dir__ = lazy_exports(__name__, submodules=(
        "adapters", "build", "builtin_layers", "config", "expr", "inits", "layer_type", "load",
        "meta_tensors", "registry", "values"))


__all__ = [
    "INITIALIZERS",
    "REGISTRY",
    "Built",
    "LayerRow",
    "LayerType",
    "Registry",
    "Slot",
    "apply_overrides",
    "build",
    "channel_dim",
    "check_model",
    "last_dim",
    "load_config",
    "load_model",
    "meta_init",
    "parse_overrides",
    "register_layer",
    "resolve_source",
    "shape_of",
    "shipped_configs",
    "with_init",
]
