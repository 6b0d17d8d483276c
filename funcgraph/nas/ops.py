"""The eight DARTS candidate operations, as pure Models (Liu et al., 2019, ``operations.py``).

Every op maps ``(B, C, H, W)`` to ``(B, C, H, W)`` at stride 1 and to ``(B, C, H/2, W/2)`` at
stride 2. Convolutions come in ReLU-conv-BN order; ``affine=False`` gives the parameter-free
batch norm DARTS uses during the search (so the architecture weights, not per-op scales,
decide which op matters). Names match the original ``nn.Module`` layout (``op.1.weight``,
``conv_1.weight``, ``bn.running_mean``) so a torch reference loads our params directly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError, ShapeError
from ..model import Model
from ..nn import Children, batch_norm, composite, conv2d, identity, lift, relu, serial

PRIMITIVES: tuple[str, ...] = (
    "none",
    "max_pool_3x3",
    "avg_pool_3x3",
    "skip_connect",
    "sep_conv_3x3",
    "sep_conv_5x5",
    "dil_conv_3x3",
    "dil_conv_5x5",
)
"""The DARTS search space, in the paper's order (the order of the architecture columns)."""

OpFactory = Callable[[int, int, bool], Model]


def relu_conv_bn(
    c_in: int, c_out: int, kernel_size: int, stride: int, padding: int, *, affine: bool = True
) -> Model:
    """ReLU, conv (no bias), batch norm: the cells' input preprocessing."""
    return serial({"op": serial(
        relu(),
        conv2d(c_in, c_out, kernel_size, stride=stride, padding=padding, bias=False),
        batch_norm(c_out, affine=affine),
    )}, name="relu_conv_bn")


def dil_conv(
    c_in: int, c_out: int, kernel_size: int, stride: int, padding: int, dilation: int,
    *, affine: bool = True,
) -> Model:
    """ReLU, dilated depthwise conv, pointwise conv, batch norm."""
    return serial({"op": serial(
        relu(),
        conv2d(c_in, c_in, kernel_size, stride=stride, padding=padding, dilation=dilation,
               groups=c_in, bias=False),
        conv2d(c_in, c_out, 1, bias=False),
        batch_norm(c_out, affine=affine),
    )}, name="dil_conv")


def sep_conv(
    c_in: int, c_out: int, kernel_size: int, stride: int, padding: int, *, affine: bool = True
) -> Model:
    """A depthwise-separable conv applied twice (only the first one strides), as in DARTS."""
    return serial({"op": serial(
        relu(),
        conv2d(c_in, c_in, kernel_size, stride=stride, padding=padding, groups=c_in, bias=False),
        conv2d(c_in, c_in, 1, bias=False),
        batch_norm(c_in, affine=affine),
        relu(),
        conv2d(c_in, c_in, kernel_size, padding=padding, groups=c_in, bias=False),
        conv2d(c_in, c_out, 1, bias=False),
        batch_norm(c_out, affine=affine),
    )}, name="sep_conv")


def factorized_reduce(c_in: int, c_out: int, *, affine: bool = True) -> Model:
    """Halve H and W with two stride-2 1x1 convs on offset grids, concatenated: a skip
    connection that changes resolution without discarding every other pixel."""
    if c_out % 2:
        raise ConfigError(f"factorized_reduce: c_out must be even (two halves of c_out // 2 "
                          f"channels), got {c_out!r}")
    children = {
        "conv_1": conv2d(c_in, c_out // 2, 1, stride=2, bias=False),
        "conv_2": conv2d(c_in, c_out // 2, 1, stride=2, bias=False),
        "bn": batch_norm(c_out, affine=affine),
    }

    def forward(run: Children, x: Tensor) -> Tensor:
        if x.shape[-1] % 2 or x.shape[-2] % 2:
            raise ShapeError(f"factorized_reduce: H and W must be even, got {tuple(x.shape)}; "
                             "DARTS networks need image sides divisible by 4")
        x = torch.relu(x)
        out = torch.cat([run("conv_1", x), run("conv_2", x[:, :, 1:, 1:])], dim=1)
        return run("bn", out)

    return composite("factorized_reduce", children, forward)


def _window3(x: Tensor, pad_value: float, combine: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """Combine each pixel's 3x3 neighbourhood (padded with ``pad_value``), separably."""
    h, w = x.shape[-2:]
    p = F.pad(x, (1, 1, 1, 1), value=pad_value)
    rows = combine(combine(p[..., 0:h, :], p[..., 1:h + 1, :]), p[..., 2:h + 2, :])
    return combine(combine(rows[..., 0:w], rows[..., 1:w + 1]), rows[..., 2:w + 2])


def max_pool_3x3(stride: int) -> Model:
    """``F.max_pool2d(x, 3, stride, 1)`` as shifted maxima: the same values, but ~25x faster
    than torch 2.13's CPU kernel at the small sizes a search uses (the search's hot spot)."""

    def fn(x: Tensor) -> Tensor:
        return _window3(x, -torch.inf, torch.maximum)[..., ::stride, ::stride]

    return lift(fn, "max_pool_3x3", stride=stride)


def avg_pool_3x3(stride: int) -> Model:
    """``F.avg_pool2d(x, 3, stride, 1, count_include_pad=False)`` as shifted sums divided by
    the number of in-image pixels of each window (fast for the same reason as max pooling)."""

    def fn(x: Tensor) -> Tensor:
        ones = torch.ones((1, 1, *x.shape[-2:]), dtype=x.dtype, device=x.device)
        avg = _window3(x, 0.0, torch.add) / _window3(ones, 0.0, torch.add)
        return avg[..., ::stride, ::stride]

    return lift(fn, "avg_pool_3x3", stride=stride)


def zero(stride: int) -> Model:
    """The ``none`` op: zeros of the output shape (it still carries the input's graph)."""
    return lift(lambda x: x[:, :, ::stride, ::stride] * 0.0, "zero", stride=stride)


OPS: dict[str, OpFactory] = {
    "none": lambda c, stride, affine: zero(stride),
    "avg_pool_3x3": lambda c, stride, affine: avg_pool_3x3(stride),
    "max_pool_3x3": lambda c, stride, affine: max_pool_3x3(stride),
    "skip_connect": lambda c, stride, affine: (
        identity() if stride == 1 else factorized_reduce(c, c, affine=affine)
    ),
    "sep_conv_3x3": lambda c, stride, affine: sep_conv(c, c, 3, stride, 1, affine=affine),
    "sep_conv_5x5": lambda c, stride, affine: sep_conv(c, c, 5, stride, 2, affine=affine),
    "dil_conv_3x3": lambda c, stride, affine: dil_conv(c, c, 3, stride, 2, 2, affine=affine),
    "dil_conv_5x5": lambda c, stride, affine: dil_conv(c, c, 5, stride, 4, 2, affine=affine),
}
"""``OPS[name](C, stride, affine) -> Model``, one entry per primitive."""


def make_op(name: str, c: int, stride: int, *, affine: bool = True) -> Model:
    """The candidate op ``name`` on ``c`` channels; a ConfigError for an unknown name."""
    if name not in OPS:
        raise ConfigError(f"make_op: unknown op {name!r}; expected one of {sorted(OPS)}")
    if stride not in (1, 2):
        raise ConfigError(f"make_op: stride must be 1 or 2, got {stride!r}")
    return OPS[name](c, stride, affine)


__all__ = [
    "OPS",
    "PRIMITIVES",
    "avg_pool_3x3",
    "dil_conv",
    "factorized_reduce",
    "make_op",
    "max_pool_3x3",
    "relu_conv_bn",
    "sep_conv",
    "zero",
]
