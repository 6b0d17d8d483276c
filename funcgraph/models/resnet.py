"""CIFAR-style ResNet (He et al., 2016, section 4.2) with stochastic depth (Huang et al., 2016).

Depth ``6n + 2`` (20, 56, 110...): a 3x3 stem, three stages of ``n`` basic blocks at ``width``,
``2 width`` and ``4 width`` channels (the second and third start with stride 2), global average
pooling and a linear head. Shortcuts are parameter-free (option A: subsample and zero-pad the
channels), as in the paper's CIFAR models and the stochastic-depth paper.

Every basic block is :func:`funcgraph.nn.stochastic_depth` over its body
``conv-bn-relu-conv-bn`` with ``post = relu``; the drop probability of the ``l``-th of ``L``
blocks follows :func:`~funcgraph.nn.stochastic_depth.linear_decay` (``final_drop_prob = 0.5``
as in the paper) unless ``drop_probs`` gives one per block. ``final_drop_prob=0`` is the
plain ResNet. Params are named ``conv1``, ``bn1``, ``layer{1,2,3}.{i}.body.{conv1,bn1,conv2,
bn2}``, ``fc``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor

from .. import nn
from ..checks import check_fraction, check_sequence, check_sizes
from ..errors import ConfigError
from ..model import Model
from ..nn.compose import Children
from ..nn.stochastic_depth import Mode, Warmup, linear_decay, stochastic_depth


def _downsample(channels_in: int, channels_out: int) -> Model:
    """Option-A shortcut: stride-2 subsampling and zero channels up to ``channels_out``."""
    extra = channels_out - channels_in

    def shortcut(x: Tensor) -> Tensor:
        x = x[:, :, ::2, ::2]  # (B, C_in, H/2, W/2)
        return F.pad(x, (0, 0, 0, 0, extra // 2, extra - extra // 2))  # (B, C_out, H/2, W/2)

    return nn.lift(shortcut, "downsample", channels_out=channels_out)


def _body(channels_in: int, channels_out: int, stride: int) -> Model:
    return nn.serial({
        "conv1": nn.conv2d(channels_in, channels_out, 3, stride=stride, padding=1, bias=False),
        "bn1": nn.batch_norm(channels_out),
        "relu": nn.relu(),
        "conv2": nn.conv2d(channels_out, channels_out, 3, padding=1, bias=False),
        "bn2": nn.batch_norm(channels_out),
    }, name="basic_block")


def resnet(
    depth: int = 20,
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    width: int = 16,
    final_drop_prob: float = 0.5,
    drop_probs: Sequence[float] | None = None,
    mode: Mode = "batch",
    warmup_steps: int | None = None,
    warmup_start_scale: float = 0.0,
) -> Model:
    """A CIFAR-style ResNet of ``depth = 6n + 2`` layers with stochastic depth.

    Arguments:
        depth: 20, 56, 110 or any ``6n + 2``.
        num_classes: outputs of the linear head.
        in_channels: image channels (3 for CIFAR, 1 for glyphs).
        width: channels of the first stage (16 in the paper).
        final_drop_prob: drop probability of the last block under the linear-decay rule;
            0 gives the plain ResNet.
        drop_probs: explicit drop probability per block (``3n`` values) instead of the rule.
        mode: stochastic-depth mode, ``"batch"`` (dropped blocks are skipped) or ``"row"``.
        warmup_steps: optional :class:`Warmup` of the drop probabilities: its steps.
        warmup_start_scale: the warm-up's starting scale of the drop probabilities.
    Returns:
        A :class:`~funcgraph.Model` mapping ``(B, in_channels, H, W)`` to ``(B, num_classes)``
        logits; training needs a key when any drop probability is positive. Its returned state
        holds each block's ``"ran"`` (see :func:`funcgraph.nn.blocks_ran`).

    Example::

        model = resnet(110, in_channels=3, num_classes=10)
        params, state = model.init(funcgraph.random.key(0))
        logits, state = model.apply(params, state, x, key=k, train=True)
    """
    if not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:  # (a bool is < 8)
        raise ConfigError(f"resnet: depth must be 6n + 2 with n >= 1 (20, 56, 110), got {depth!r}")
    check_sizes("resnet", num_classes=num_classes, in_channels=in_channels, width=width)
    check_fraction("resnet", "final_drop_prob", final_drop_prob)
    n = (depth - 2) // 6
    total = 3 * n
    if drop_probs is None:
        probs = linear_decay(total, final_drop_prob)
    else:
        given = check_sequence("resnet", "drop_probs", drop_probs, "drop probabilities in [0, 1)")
        probs = [check_fraction("resnet", f"drop_probs[{i}]", p) for i, p in enumerate(given)]
        if len(probs) != total:
            raise ConfigError(
                f"resnet: drop_probs needs one value per block ({total} for depth {depth}), "
                f"got {len(probs)}"
            )
    warmup = Warmup(warmup_steps, warmup_start_scale) if warmup_steps else None
    stages: dict[str, Model] = {}
    channels = width
    index = 0
    for s in range(3):
        out = width * 2**s
        blocks: dict[str, Model] = {}
        for i in range(n):
            stride = 2 if (s > 0 and i == 0) else 1
            shortcut = _downsample(channels, out) if stride == 2 else None
            blocks[str(i)] = stochastic_depth(
                _body(channels, out, stride), probs[index], shortcut=shortcut, post=nn.relu(),
                mode=mode, warmup=warmup,
            )
            channels = out
            index += 1
        stages[f"layer{s + 1}"] = nn.serial(blocks, name=f"layer{s + 1}")
    children = {
        "conv1": nn.conv2d(in_channels, width, 3, padding=1, bias=False),
        "bn1": nn.batch_norm(width),
        **stages,
        "fc": nn.linear(channels, num_classes),
    }

    def forward(run: Children, x: Tensor) -> Tensor:
        h = F.relu(run("bn1", run("conv1", x)))  # (B, width, H, W)
        for stage in stages:
            h = run(stage, h)
        return run("fc", h.mean(dim=(2, 3)))  # (B, 4 width) -> (B, num_classes)

    return nn.composite(f"resnet{depth}", children, forward, depth=depth, drop_probs=probs,
                        mode=mode, num_classes=num_classes)


__all__ = ["resnet"]
