"""Pure layers and combinators. Every constructor returns a :class:`funcgraph.Model`."""

from typing import TYPE_CHECKING

from .._exports import lazy_exports
from .compose import Children, composite, parallel, residual, serial
from .conv_norm import conv_batch_norm, patch_moments
from .dropout import dropout, embedding
from .early_exit import (
    ExitOutput,
    early_exit,
    early_exit_loss,
    masked_exits,
    per_sample_exits,
    with_threshold,
)
from .functional import (
    adaptive_avg_pool2d,
    adaptive_max_pool2d,
    avg_pool2d,
    channels_last,
    elu,
    flatten,
    gelu,
    identity,
    leaky_relu,
    lift,
    max_pool,
    max_pool2d,
    relu,
    sigmoid,
    softmax,
    tanh,
)
from .linear import conv1d, conv2d, linear
from .norm import BatchStatisticsWarning, batch_norm, group_norm, layer_norm
from .recurrent import gru, lstm
from .stochastic_depth import Warmup, blocks_ran, linear_decay, ran_metrics, stochastic_depth

if not TYPE_CHECKING:  # type checkers see the names and submodules through the imports
    __getattr__, __dir__ = lazy_exports(__name__, submodules=(
        "compose", "conv_norm", "dropblock", "dropout", "early_exit", "functional", "init",
        "linear", "norm", "recurrent", "stochastic_depth", "torch_chain", "torch_module"))


__all__ = [
    "BatchStatisticsWarning",
    "Children",
    "ExitOutput",
    "Warmup",
    "adaptive_avg_pool2d",
    "adaptive_max_pool2d",
    "avg_pool2d",
    "batch_norm",
    "blocks_ran",
    "channels_last",
    "composite",
    "conv1d",
    "conv2d",
    "conv_batch_norm",
    "dropout",
    "early_exit",
    "early_exit_loss",
    "masked_exits",
    "per_sample_exits",
    "elu",
    "embedding",
    "flatten",
    "gelu",
    "group_norm",
    "gru",
    "identity",
    "layer_norm",
    "leaky_relu",
    "lift",
    "linear",
    "linear_decay",
    "lstm",
    "max_pool",
    "max_pool2d",
    "parallel",
    "patch_moments",
    "ran_metrics",
    "relu",
    "residual",
    "serial",
    "sigmoid",
    "softmax",
    "stochastic_depth",
    "tanh",
    "with_threshold",
]
