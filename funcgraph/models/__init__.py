"""Reference models, each a :class:`funcgraph.Model`, and a registry to rebuild them by name.

A run directory stores its model as ``config["model"] = {"name": "conv4", **hyperparams}``;
:func:`build` turns that back into the Model. Each model module adds its builder to
``REGISTRY`` below (one line per model).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ConfigError
from ..model import Model
from .conv4 import conv4
from .mlp import mlp

REGISTRY: dict[str, Callable[..., Model]] = {
    "conv4": conv4,
    "mlp": mlp,
}


def build(config: Mapping[str, Any]) -> Model:
    """The Model described by ``{"name": NAME, **hyperparams}`` (a run's ``config["model"]``)."""
    cfg = dict(config)
    name = cfg.pop("name", None)
    if name not in REGISTRY:
        raise ConfigError(f"model.name: expected one of {sorted(REGISTRY)}, got {name!r}")
    try:
        return REGISTRY[name](**cfg)
    except TypeError as e:
        raise ConfigError(f"model: bad hyperparameters for {name!r}: {e}") from None


__all__ = ["REGISTRY", "build", "conv4", "mlp"]
