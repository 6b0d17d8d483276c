"""A multilayer perceptron: the 40-40 ReLU network of the MAML paper's sinusoid regression."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .. import nn
from ..checks import check_int, check_sequence, check_sizes
from ..model import Model


def mlp(
    in_features: int = 1,
    out_features: int = 1,
    *,
    hidden: Sequence[int] = (40, 40),
    dtype: torch.dtype | None = None,
) -> Model:
    """``linear -> ReLU -> ... -> linear``, params ``layers.{i}.weight/bias``.

    Arguments:
        in_features: input width (1 for sinusoid x).
        out_features: output width (1 for sinusoid y).
        hidden: widths of the hidden layers; ``(40, 40)`` as in MAML.
    Returns:
        A stateless Model mapping ``(B, in_features)`` to ``(B, out_features)``.
    """
    check_sizes("mlp", in_features=in_features, out_features=out_features)
    hidden = check_sequence("mlp", "hidden", hidden, "widths (ints >= 1), one per hidden layer")
    for i, w in enumerate(hidden):
        check_int("mlp", f"hidden[{i}]", w)
    widths = [in_features, *hidden, out_features]
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
