"""Parameter-free layers: activations, pooling, flatten, and :func:`lift` to make more.

Each is a Model with no params and no state, so it slots into ``serial`` like any layer and
accepts (and ignores) ``key`` and ``train``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_ints
from ..control import in_transform
from ..errors import ConfigError
from ..model import Model
from ..params import Params, State
from ..random import Key


def channels_last(x: Tensor) -> Tensor:
    """``x`` (4-D) laid out channels-last (NHWC in memory), for faster CPU convolutions,
    batch norm and pooling downstream; the same values.

    ``x.contiguous(memory_format=torch.channels_last)`` leaves a contiguous one-channel
    tensor as it is (both layouts are valid for it), so convolutions would still produce
    NCHW outputs; here such a tensor gets the channels-last strides as a view (no copy), which
    convolutions read as a request for channels-last outputs.
    """
    if x.dim() == 4 and x.shape[1] == 1 and x.is_contiguous():
        return x.as_strided(x.shape, (x.stride(0), 1, x.stride(2), x.stride(3)))
    return x.contiguous(memory_format=torch.channels_last)


def max_pool(x: Tensor, kernel_size: int | tuple[int, int],
             stride: int | tuple[int, int] | None = None, padding: int | tuple[int, int] = 0,
             dilation: int | tuple[int, int] = 1, ceil_mode: bool = False) -> Tensor:
    """``F.max_pool2d(x, ...)``: the same values and the same gradients (each window's first
    maximum takes its gradient), faster on CPU inside ``torch.func`` transforms.

    Inside ``vmap`` and ``grad`` a 4-D activation is laid out NCHW (channels-last cannot be
    asked for there), where torch's CPU max-pool searches each window more slowly than on a
    channels-last layout (the measured figures: ``benchmarks/max_pool.py``'s record,
    ``results/max_pool.jsonl``, on the benchmarks results page). So the windows' maxima are
    found on a channels-last copy, outside autograd, and the result is a ``gather`` of ``x``
    at those indices, whose gradient (and the gradient of that, for second-order MAML) is
    torch's own. Elsewhere (outside transforms, on a GPU, or while ``torch.compile`` traces:
    the compiler makes its own kernel) this is ``F.max_pool2d``.
    """
    if (x.device.type != "cpu" or x.dim() != 4 or not in_transform()
            or torch.compiler.is_compiling()):
        return F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode)
    with torch.no_grad():
        laid_out = x.movedim(1, -1).contiguous().movedim(-1, 1)  # NCHW view of NHWC memory
        _, where = F.max_pool2d(laid_out, kernel_size, stride, padding, dilation,
                                ceil_mode=ceil_mode, return_indices=True)
    return x.flatten(2).gather(2, where.flatten(2)).view(where.shape)


def lift(fn: Callable[[Tensor], Tensor], name: str | None = None, **meta: Any) -> Model:
    """A parameter-free Model computing ``fn(x)``."""

    def init(key: Key) -> tuple[Params, State]:
        return {}, {}

    def apply(
        params: Params, state: State, x: Tensor, *, key: Key | None = None, train: bool = False
    ) -> tuple[Tensor, State]:
        return fn(x), state

    return Model(init, apply, name or str(getattr(fn, "__name__", "lift")), dict(meta))


def relu() -> Model:
    return lift(F.relu, "relu")


def gelu() -> Model:
    return lift(F.gelu, "gelu")


def tanh() -> Model:
    return lift(torch.tanh, "tanh")


def sigmoid() -> Model:
    return lift(torch.sigmoid, "sigmoid")


def elu(alpha: float = 1.0) -> Model:
    return lift(lambda x: F.elu(x, alpha), "elu", alpha=alpha)


def leaky_relu(negative_slope: float = 0.01) -> Model:
    return lift(lambda x: F.leaky_relu(x, negative_slope), "leaky_relu", slope=negative_slope)


def softmax(dim: int = -1) -> Model:
    return lift(lambda x: F.softmax(x, dim=dim), "softmax", dim=dim)


def identity() -> Model:
    return lift(lambda x: x, "identity")


def flatten(start_dim: int = 1, end_dim: int = -1) -> Model:
    """``x.flatten(start_dim, end_dim)``, as ``nn.Flatten`` (batch dim kept by default)."""
    return lift(lambda x: torch.flatten(x, start_dim, end_dim), "flatten", start_dim=start_dim)


def _check_pool(fn: str, kernel_size: object, stride: object, padding: object) -> None:
    """A pooling window's sizes: kernel and stride ints >= 1 (stride None: the kernel), padding
    ints >= 0 and at most half the kernel, as torch requires."""
    kernel = check_ints(fn, "kernel_size", kernel_size, dims=2)
    if stride is not None:
        check_ints(fn, "stride", stride, dims=2)
    pads = check_ints(fn, "padding", padding, dims=2, minimum=0)
    if any(2 * p > k for p, k in zip(pads, kernel, strict=True)):
        raise ConfigError(f"{fn}: padding must be at most half of kernel_size, got "
                          f"padding={padding!r}, kernel_size={kernel_size!r}")


def max_pool2d(
    kernel_size: int | tuple[int, int],
    stride: int | tuple[int, int] | None = None,
    padding: int | tuple[int, int] = 0,
    *,
    ceil_mode: bool = False,
) -> Model:
    """Max pooling over ``(B, C, H, W)``, as ``nn.MaxPool2d``."""
    _check_pool("max_pool2d", kernel_size, stride, padding)
    return lift(
        lambda x: max_pool(x, kernel_size, stride, padding, ceil_mode=ceil_mode),
        "max_pool2d", kernel_size=kernel_size, stride=stride, padding=padding,
    )


def avg_pool2d(
    kernel_size: int | tuple[int, int],
    stride: int | tuple[int, int] | None = None,
    padding: int | tuple[int, int] = 0,
    *,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> Model:
    """Average pooling over ``(B, C, H, W)``, as ``nn.AvgPool2d``."""
    _check_pool("avg_pool2d", kernel_size, stride, padding)
    return lift(
        lambda x: F.avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad),
        "avg_pool2d", kernel_size=kernel_size, stride=stride, padding=padding,
    )


def adaptive_avg_pool2d(output_size: int | tuple[int, int]) -> Model:
    """Average pooling to a fixed ``output_size``, as ``nn.AdaptiveAvgPool2d``."""
    return lift(lambda x: F.adaptive_avg_pool2d(x, output_size), "adaptive_avg_pool2d",
                output_size=output_size)


def adaptive_max_pool2d(output_size: int | tuple[int, int]) -> Model:
    """Max pooling to a fixed ``output_size``, as ``nn.AdaptiveMaxPool2d``."""
    return lift(lambda x: F.adaptive_max_pool2d(x, output_size), "adaptive_max_pool2d",
                output_size=output_size)


__all__ = [
    "adaptive_avg_pool2d",
    "adaptive_max_pool2d",
    "avg_pool2d",
    "channels_last",
    "elu",
    "flatten",
    "gelu",
    "identity",
    "leaky_relu",
    "lift",
    "max_pool2d",
    "relu",
    "sigmoid",
    "softmax",
    "tanh",
]
