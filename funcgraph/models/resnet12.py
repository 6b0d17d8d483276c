"""ResNet-12, the few-shot backbone of TADAM, MetaOptNet and most ProtoNet baselines since.

Four residual blocks (Oreshkin et al., 2018; Lee et al., 2019), widths ``(64, 160, 320, 640)``
by default. Each block is three 3x3 ``conv -> batch norm`` layers (LeakyReLU(0.1) after the
first two), plus a ``1x1 conv -> batch norm`` shortcut, summed, then LeakyReLU and a 2x2
max-pool: 84 -> 42 -> 21 -> 10 -> 5. A global average pool gives the ``widths[-1]``
embedding (640), and ``ways`` adds a linear head. Convolutions have no bias (batch norm
follows each).

Batch norm uses the statistics of the batch it sees (``track_running_stats=False``), as
conv4 does: the model is stateless, so MAML adapts it and ProtoNet embeds with it through
``funcgraph.bind(model, {})``, and under ``vmap`` over tasks its second-order gradients are
exact (see :mod:`funcgraph.nn.norm`).

``drop_block`` regularises as MetaOptNet does: dropout with that probability after blocks 1
and 2, DropBlock (:func:`funcgraph.nn.dropblock.drop_block`, ``block_size`` 5) after blocks
3 and 4, in training only and from the call's key (MetaOptNet also ramps the DropBlock rate
up over its first 40,000 steps; here it is constant). 0 (the default) turns both off.

The max-pool runs before the block's last LeakyReLU: ``max_pool(leaky_relu(z)) ==
leaky_relu(max_pool(z))`` (it is increasing), with the same gradients, on a quarter of the
values. Params are named as :func:`resnet12_module`'s ``state_dict``:
``layer{1..4}.{conv1,bn1,conv2,bn2,conv3,bn3}.*``, ``layer{1..4}.downsample.{0,1}.*``,
``head.*``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch import nn as torch_nn

from .. import nn
from ..checks import check_fraction, check_int, check_sequence, check_sizes
from ..errors import ConfigError
from ..model import Model
from ..nn.dropblock import drop_block as drop_block_layer

WIDTHS = (64, 160, 320, 640)
"""The channels of the four blocks in the published ResNet-12."""

SLOPE = 0.1
"""LeakyReLU's negative slope in ResNet-12."""


def _widths(fn: str, widths: object) -> tuple[int, ...]:
    values = check_sequence(fn, "widths", widths, "four channel counts")
    if len(values) != 4:
        raise ConfigError(f"{fn}: widths must give the channels of 4 blocks, got {len(values)}")
    return tuple(check_int(fn, f"widths[{i}]", w) for i, w in enumerate(values))


def _block(channels_in: int, channels: int, eps: float, dtype: torch.dtype | None) -> Model:
    """One residual block's layers (its forward is in :func:`resnet12`)."""

    def conv(c_in: int, kernel: int) -> Model:
        return nn.conv2d(c_in, channels, kernel, padding=kernel // 2, bias=False, dtype=dtype)

    def norm() -> Model:
        return nn.batch_norm(channels, eps=eps, track_running_stats=False, dtype=dtype)

    children = {"conv1": conv(channels_in, 3), "bn1": norm(), "conv2": conv(channels, 3),
                "bn2": norm(), "conv3": conv(channels, 3), "bn3": norm(),
                "downsample": nn.serial(conv(channels_in, 1), norm())}

    def forward(run: nn.Children, x: Tensor) -> Tensor:
        h = F.leaky_relu(run("bn1", run("conv1", x)), SLOPE)
        h = F.leaky_relu(run("bn2", run("conv2", h)), SLOPE)
        h = run("bn3", run("conv3", h)) + run("downsample", x)
        return F.leaky_relu(F.max_pool2d(h, 2), SLOPE)  # pooled first: see the module docstring

    return nn.composite("resnet12_block", children, forward, channels=channels)


def resnet12(
    ways: int | None = None,
    *,
    in_channels: int = 3,
    widths: Sequence[int] = WIDTHS,
    drop_block: float = 0.0,
    block_size: int = 5,
    eps: float = 1e-5,
    dtype: torch.dtype | None = None,
) -> Model:
    """ResNet-12 (see the module docstring).

    Arguments:
        ways: classes of the linear head; ``None`` for the embedding network (ProtoNet).
        in_channels: image channels (3 for RGB, 1 for glyphs).
        widths: channels of the four blocks.
        drop_block: drop probability of the dropout (blocks 1-2) and DropBlock (blocks 3-4)
            applied in training; 0 for none (MetaOptNet uses 0.1).
        block_size: DropBlock's square side.
        eps: batch-norm epsilon.
    Returns:
        A stateless :class:`~funcgraph.Model` mapping ``(B, in_channels, H, W)`` (H, W >= 16)
        to ``(B, ways)`` logits or ``(B, widths[-1])`` features. With ``drop_block > 0``,
        training needs a key.

    Example::

        model = resnet12(5)
        params, state = model.init(funcgraph.random.key(0))
        logits = funcgraph.bind(model, state)(params, images)   # (B, 5)
    """
    fn = "resnet12"
    sizes = _widths(fn, widths)
    check_sizes(fn, in_channels=in_channels, block_size=block_size)
    check_fraction(fn, "drop_block", drop_block)
    if ways is not None:
        check_int(fn, "ways (classes of the head, or None for no head)", ways)
    children: dict[str, Model] = {}
    channels = in_channels
    for i, width in enumerate(sizes):
        children[f"layer{i + 1}"] = _block(channels, width, eps, dtype)
        if drop_block > 0:
            children[f"drop{i + 1}"] = (nn.dropout(drop_block) if i < 2 else
                                        drop_block_layer(drop_block, block_size))
        channels = width
    if ways is not None:
        children["head"] = nn.linear(channels, ways, dtype=dtype)

    def forward(run: nn.Children, x: Tensor) -> Tensor:
        for i in range(len(sizes)):
            x = run(f"layer{i + 1}", x)
            if drop_block > 0:
                x = run(f"drop{i + 1}", x)
        x = x.mean(dim=(2, 3))  # (B, widths[-1])
        return run("head", x) if ways is not None else x

    return nn.composite(fn, children, forward, ways=ways, in_channels=in_channels,
                        widths=sizes, drop_block=drop_block, block_size=block_size, eps=eps)


class _TorchBlock(torch_nn.Module):
    def __init__(self, channels_in: int, channels: int) -> None:
        super().__init__()

        def conv(c_in: int, kernel: int) -> torch_nn.Conv2d:
            return torch_nn.Conv2d(c_in, channels, kernel, padding=kernel // 2, bias=False)

        def norm() -> torch_nn.BatchNorm2d:
            return torch_nn.BatchNorm2d(channels, track_running_stats=False)

        self.conv1, self.bn1 = conv(channels_in, 3), norm()
        self.conv2, self.bn2 = conv(channels, 3), norm()
        self.conv3, self.bn3 = conv(channels, 3), norm()
        self.downsample = torch_nn.Sequential(conv(channels_in, 1), norm())
        self.act = torch_nn.LeakyReLU(SLOPE)
        self.pool = torch_nn.MaxPool2d(2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.bn1(self.conv1(x)))
        h = self.act(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        return self.pool(self.act(h + self.downsample(x)))


class _TorchResNet12(torch_nn.Module):
    def __init__(self, ways: int | None, in_channels: int, widths: tuple[int, ...]) -> None:
        super().__init__()
        channels = in_channels
        for i, width in enumerate(widths):
            self.add_module(f"layer{i + 1}", _TorchBlock(channels, width))
            channels = width
        self.head: torch_nn.Module = (torch_nn.Linear(channels, ways) if ways is not None
                                      else torch_nn.Identity())  # Identity: no params

    def forward(self, x: Tensor) -> Tensor:
        for i in range(4):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.head(x.mean(dim=(2, 3)))


def resnet12_module(
    ways: int | None = None, *, in_channels: int = 3, widths: Sequence[int] = WIDTHS
) -> torch_nn.Module:
    """ResNet-12 as a plain ``torch.nn`` module with the same parameter names (``Conv2d``,
    ``BatchNorm2d(track_running_stats=False)``, ``LeakyReLU(0.1)``, ``MaxPool2d(2)`` after
    the activation, as MetaOptNet writes it; no dropout): the reference the tests compare
    :func:`resnet12` against. ``load_state_dict(params)`` takes resnet12's params."""
    sizes = _widths("resnet12_module", widths)
    check_sizes("resnet12_module", in_channels=in_channels)
    if ways is not None:
        check_int("resnet12_module", "ways", ways)
    return _TorchResNet12(ways, in_channels, sizes)


__all__ = ["SLOPE", "WIDTHS", "resnet12", "resnet12_module"]
