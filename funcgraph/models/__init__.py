"""Reference models, each a :class:`funcgraph.Model`.

They are reachable by name (``conv4``, ``mlp``, ``resnet``, ``resnet12``, ``early_exit_cnn``,
``rnn_classifier``, ``sequence_encoder``) through the one name -> Model table, the factory's
registry (:data:`funcgraph.factory.REGISTRY`); a run records its model as
``{"name": "conv4", **hyperparams}`` and :func:`funcgraph.runs.resolve_model` rebuilds it.
"""

from __future__ import annotations

from .conv4 import conv4
from .early_exit import early_exit_cnn
from .mlp import mlp
from .resnet import resnet
from .resnet12 import resnet12
from .rnn import rnn_classifier, sequence_encoder

__all__ = ["conv4", "early_exit_cnn", "mlp", "resnet", "resnet12", "rnn_classifier",
           "sequence_encoder"]


_MODULES = ("conv4", "early_exit", "mlp", "resnet", "resnet12", "rnn")
"""The submodules the docs cite: with ``__all__``, all that ``dir()`` lists."""


def __dir__() -> list[str]:
    """The public names and the documented submodules; nothing else."""
    return sorted({*__all__, *_MODULES})
