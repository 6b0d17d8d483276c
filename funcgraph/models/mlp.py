"""A multilayer perceptron: the 40-40 ReLU network of the MAML paper's sinusoid regression."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .. import nn
from ..errors import ConfigError
from ..model import Model


def mlp(
    in_features: int = 1,
    out_features: int = 1,
    *,
    hidden: Sequence[int] = (40, 40),
    dtype: torch.dtype = torch.float32,
) -> Model:
    """``linear -> ReLU -> ... -> linear``, params ``layers.{i}.weight/bias``.

    Arguments:
        in_features: input width (1 for sinusoid x).
        out_features: output width (1 for sinusoid y).
        hidden: widths of the hidden layers; ``(40, 40)`` as in MAML.
    Returns:
        A stateless Model mapping ``(B, in_features)`` to ``(B, out_features)``.
    """
    widths = [in_features, *hidden, out_features]
    if any(not isinstance(w, int) or w < 1 for w in widths):
        raise ConfigError(f"mlp: widths must be positive ints, got {widths}")
    layers = {f"layers.{i}": nn.linear(a, b, dtype=dtype)
              for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True))}
    last = f"layers.{len(layers) - 1}"

    def forward(run: nn.Children, x: Tensor) -> Tensor:
        for name in layers:
            x = run(name, x)
            if name != last:
                x = torch.relu(x)
        return x

    return nn.composite("mlp", layers, forward, in_features=in_features,
                        out_features=out_features, hidden=list(hidden))


__all__ = ["mlp"]
