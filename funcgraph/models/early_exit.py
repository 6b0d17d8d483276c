"""A spatially adaptive early-exit CNN: the second block runs only for the samples that need it.

::

    h      = block1(x)                          (B, width, H/2, W/2)
    pooled = mean over positions of h           (B, width)
    early  = exit_head(h)                       (B, classes)   logits if the sample exits
                                                               (4x4 average pool + linear)
    p      = sigmoid(decision(pooled))          (B,)           probability of continuing
    go     = p > threshold        (evaluation)  or  uniform(key) < p   (training)
    deep   = head(block2(h[go]))                (G, classes)   only the G continuing samples
    logits = early with rows go replaced by deep

The continuing samples are gathered with ``index_select`` and the deep logits scattered back
with ``index_copy``, so an exiting sample costs nothing in ``block2`` (a mask would compute it
and throw it away). Batch norm uses running statistics in evaluation, so a sample's output
does not depend on the rest of the batch. Shapes depend on the data, so this model runs
eagerly (and under ``grad``), not under ``vmap`` or ``torch.export``.

The output is :class:`ExitOutput` (``logits`` first, so ``supervised.classification_loss``
works on it); :func:`early_exit_loss` also trains the exit head and the decision head: the
target of the decision is "the exit head is wrong on this sample".
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import nn, random
from ..checks import check_fraction, check_sizes
from ..errors import KeyMissingError
from ..model import Model
from ..nn.compose import Children


class ExitOutput(NamedTuple):
    """What the early-exit CNN returns.

    Attributes:
        logits: ``(B, classes)`` the exit head's logits for exiting samples, the final head's
            for the others.
        exited: ``(B,)`` bool, True where the sample skipped the second block.
        continue_prob: ``(B,)`` the decision head's probability of continuing.
        exit_logits: ``(B, classes)`` the exit head's logits for every sample.
    """

    logits: Tensor
    exited: Tensor
    continue_prob: Tensor
    exit_logits: Tensor


def _conv_bn_relu(c_in: int, c_out: int, stride: int = 1) -> dict[str, Model]:
    return {"conv": nn.conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
            "bn": nn.batch_norm(c_out), "relu": nn.relu()}


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
        threshold: evaluation continues a sample when ``continue_prob > threshold``.
    Returns:
        A Model mapping ``(B, in_channels, H, W)`` to :class:`ExitOutput`; training needs a
        key (the continue decisions are sampled).
    """
    check_sizes("early_exit_cnn", num_classes=num_classes, in_channels=in_channels, width=width)
    check_fraction("early_exit_cnn", "threshold", threshold, allow_one=True)
    children = {
        "block1": nn.serial(_conv_bn_relu(in_channels, width, stride=2)),
        # A 4x4 pooled grid keeps where the strokes are; a global mean of one conv layer's
        # features alone is near chance on 100 glyph classes.
        "exit_head": nn.serial({"pool": nn.adaptive_avg_pool2d(4), "flatten": nn.flatten(),
                                "fc": nn.linear(16 * width, num_classes)}),
        "decision": nn.linear(width, 1),
        "block2": nn.serial({
            "conv1": nn.serial(_conv_bn_relu(width, 2 * width)),
            "conv2": nn.serial(_conv_bn_relu(2 * width, 2 * width)),
            "pool": nn.max_pool2d(2),
            "conv3": nn.serial(_conv_bn_relu(2 * width, 2 * width)),
        }),
        "head": nn.linear(2 * width, num_classes),
    }

    def forward(run: Children, x: Tensor) -> ExitOutput:
        h = run("block1", x)  # (B, width, H/2, W/2)
        pooled = h.mean(dim=(2, 3))  # (B, width)
        early = run("exit_head", h)  # (B, classes)
        p = torch.sigmoid(run("decision", pooled).squeeze(-1))  # (B,)
        if run.train:
            if run.own_key is None:
                raise KeyMissingError(
                    "early_exit_cnn: training samples the exit decisions; call apply(..., "
                    "key=funcgraph.random.key(0), train=True) or pass train=False"
                )
            go = random.uniform(run.own_key, p.shape).to(p.device) < p.detach()
        else:
            go = p > threshold
        idx = go.nonzero().squeeze(1)  # (G,) samples that continue
        logits = early
        if idx.numel() > 0:
            deep = run("block2", h.index_select(0, idx))  # (G, 2 width, H/4, W/4)
            logits = early.index_copy(0, idx, run("head", deep.mean(dim=(2, 3))))
        return ExitOutput(logits, ~go, p, early)

    return nn.composite("early_exit_cnn", children, forward, num_classes=num_classes,
                        width=width, threshold=threshold)


def early_exit_loss(y: ExitOutput, labels: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Cross-entropy of the returned logits and of the exit head, plus the decision head's
    binary cross-entropy against "the exit head is wrong here" (continue only when needed).

    Metrics: ``accuracy`` (of the returned logits), ``exit_rate``, ``exit_accuracy``.
    """
    wrong = (y.exit_logits.argmax(-1) != labels).to(y.continue_prob.dtype)
    loss = (F.cross_entropy(y.logits, labels) + F.cross_entropy(y.exit_logits, labels)
            + F.binary_cross_entropy(y.continue_prob, wrong))
    metrics = {
        "accuracy": (y.logits.argmax(-1) == labels).float().mean(),
        "exit_rate": y.exited.float().mean(),
        "exit_accuracy": 1.0 - wrong.float().mean(),
    }
    return loss, metrics


__all__ = ["ExitOutput", "early_exit_cnn", "early_exit_loss"]
