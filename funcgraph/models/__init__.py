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
from .early_exit import early_exit_cnn
from .mlp import mlp
from .resnet import resnet
from .rnn import rnn_classifier, sequence_encoder

REGISTRY: dict[str, Callable[..., Model]] = {
    "conv4": conv4,
    "mlp": mlp,
    "resnet": resnet,
    "early_exit_cnn": early_exit_cnn,
    "rnn_classifier": rnn_classifier,
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


__all__ = ["REGISTRY", "build", "conv4", "early_exit_cnn", "mlp", "resnet", "rnn_classifier",
           "sequence_encoder"]
