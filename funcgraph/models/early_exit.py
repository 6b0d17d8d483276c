"""A spatially adaptive early-exit CNN: the second block runs only for the samples that need it.

It is :func:`funcgraph.nn.early_exit` over two conv blocks with a learned gate::

    h      = block1(x)                          (B, width, H/2, W/2)
    early  = exit_head(h)                       (B, classes)   logits if the sample exits
                                                               (4x4 average pool + linear)
    p      = sigmoid(decision(mean of h))       (B,)           probability of continuing
    go     = p > threshold        (evaluation)  or  uniform(key) < p   (training)
    deep   = head(mean of block2(h[go]))        (G, classes)   only the G continuing samples
    logits = early with rows go replaced by deep

Batch norm uses running statistics in evaluation, so a sample's output does not depend on the
rest of the batch. Shapes depend on the data, so this model runs eagerly (and under ``grad``),
not under ``vmap`` or ``torch.export``.

The output is :class:`~funcgraph.nn.ExitOutput`; :func:`~funcgraph.nn.early_exit_loss` (also
importable from here) trains the exit head and the decision head too: the target of the
decision is "the exit head is wrong on this sample".
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .. import nn
from ..checks import check_sizes
from ..model import Model
from ..nn.early_exit import ExitOutput, early_exit_loss
from ..params import Params, State
from ..random import Key


def _conv_bn_relu(c_in: int, c_out: int, stride: int = 1) -> dict[str, Model]:
    return {"conv": nn.conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
            "bn": nn.batch_norm(c_out), "relu": nn.relu()}


def _on_mean(model: Model, post: Callable[[Tensor], Tensor] | None = None) -> Model:
    """``model`` applied to the spatial mean of a ``(B, C, H, W)`` input (then ``post``), under
    ``model``'s own param names: ``head.weight``, not the ``head.1.weight`` of
    ``serial(pool, linear)``, the names this network's checkpoints hold."""

    def apply(
        params: Params, state: State, x: Tensor, *, key: Key | None = None, train: bool = False
    ) -> tuple[Tensor, State]:
        y, state = model.apply(params, state, x.mean(dim=(2, 3)), key=key, train=train)
        return (y if post is None else post(y)), state

    return Model(model.init, apply, model.name, dict(model.meta))


def early_exit_cnn(
    *,
    num_classes: int = 10,
    in_channels: int = 1,
    width: int = 32,
    threshold: float = 0.5,
) -> Model:
    """The early-exit CNN of the module docstring.

    Arguments:
        num_classes: classes of both heads.
        in_channels: image channels.
        width: channels of the first block (one stride-2 conv); the second block has three convs of
            ``2 * width`` channels, two of them at the first block's resolution, so it holds
            almost all of the multiply-adds.
        threshold: evaluation continues a sample when ``continue_prob > threshold``
            (:func:`funcgraph.nn.with_threshold` changes it on the built model).
    Returns:
        A Model mapping ``(B, in_channels, H, W)`` to :class:`~funcgraph.nn.ExitOutput`;
        training needs a key (the continue decisions are sampled).
    """
    check_sizes("early_exit_cnn", num_classes=num_classes, in_channels=in_channels, width=width)
    blocks = {
        "block1": nn.serial(_conv_bn_relu(in_channels, width, stride=2)),
        "block2": nn.serial({
            "conv1": nn.serial(_conv_bn_relu(width, 2 * width)),
            "conv2": nn.serial(_conv_bn_relu(2 * width, 2 * width)),
            "pool": nn.max_pool2d(2),
            "conv3": nn.serial(_conv_bn_relu(2 * width, 2 * width)),
        }),
    }
    heads = {
        # A 4x4 pooled grid keeps where the strokes are; a global mean of one conv layer's
        # features alone is near chance on 100 glyph classes.
        "exit_head": nn.serial({"pool": nn.adaptive_avg_pool2d(4), "flatten": nn.flatten(),
                                "fc": nn.linear(16 * width, num_classes)}),
        "head": _on_mean(nn.linear(2 * width, num_classes)),
    }
    gates = {"decision": _on_mean(nn.linear(width, 1), lambda z: torch.sigmoid(z.squeeze(-1)))}
    return nn.early_exit(blocks, heads, gates=gates, threshold=threshold, name="early_exit_cnn",
                         num_classes=num_classes, width=width)


__all__ = ["ExitOutput", "early_exit_cnn", "early_exit_loss"]
