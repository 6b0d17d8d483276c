"""Reference models, each a :class:`funcgraph.Model`.

They are reachable by name (``conv4``, ``mlp``, ``resnet``, ``resnet12``, ``early_exit_cnn``,
``rnn_classifier``, ``sequence_encoder``) through the one name -> Model table, the factory's
registry (:data:`funcgraph.factory.REGISTRY`); a run records its model as
``{"name": "conv4", **hyperparams}`` and :func:`funcgraph.runs.resolve_model` rebuilds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._exports import lazy_exports
from .conv4 import conv4
from .early_exit import early_exit_cnn
from .mlp import mlp
from .resnet import resnet
from .resnet12 import resnet12
from .rnn import rnn_classifier, sequence_encoder

__all__ = ["conv4", "early_exit_cnn", "mlp", "resnet", "resnet12", "rnn_classifier",
           "sequence_encoder"]


if not TYPE_CHECKING:  # type checkers see the names and submodules through the imports
    __getattr__, __dir__ = lazy_exports(__name__, __all__, submodules=(
        "conv4", "early_exit", "mlp", "resnet", "resnet12", "rnn"))
