"""A 2-D convolution followed by batch norm, fused when the convolution's patches are narrow.

``conv_batch_norm`` has the params, state, values and gradients of
``serial({"conv": conv2d(...), "norm": batch_norm(...)})``. When batch norm uses batch
statistics and the convolution reads few values per output (``in_channels * kh * kw``, the
*patch width* ``d``, at most half of ``out_channels``; a first layer over one- or
three-channel images), it never materialises the un-normalised output: the statistics of a
convolution are those of its input patches, ::

    z[c] = w[c] . patch + b[c]       mean(z[c]) = w[c] . m + b[c]       var(z[c]) = w[c]' S w[c]

with ``m`` the mean and ``S`` the ``(d, d)`` covariance of the patches (:func:`patch_moments`,
one pass over a tensor ``d / out_channels`` the size of the output), so the normalisation
folds into the weights::

    batch_norm(conv(x, w, b)) == conv(x, w * s, beta + s * (b - mean(z)))
    s = gamma / sqrt(var(z) + eps)

One convolution replaces a convolution and a batch norm over the full output, forward and
backward; in the second-order MAML step on 28x28 glyphs the first block's batch norm and its
double backward are gone (``docs/meta-learning.md``). Everything is plain differentiable ops,
so ``grad``, ``vmap`` and second order hold as for the unfused pair (tested against it in
float64). The conv bias cancels in the normalisation; the folded bias writes it as
``b - mean(z)`` so that its gradient is exactly zero and it stays in the graph.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_ints, check_sizes
from ..errors import ShapeError
from ..model import Model
from ..params import Params, State, add_prefix, select
from ..precision import autocast_float32, full_precision
from ..random import Key
from .compose import serial
from .linear import conv2d
from .norm import batch_norm, running_stats_update, warn_if_one_example

PATCH_WIDTH_RATIO = 2
"""Fuse when ``out_channels >= PATCH_WIDTH_RATIO * d`` (``d = in_channels * kh * kw``): the
patch covariance (``d * d`` multiply-adds per output position) then costs at most half the
convolution (``d * out_channels``), and it saves a batch norm over the whole output."""


def patch_moments(
    x: Tensor,
    kernel_size: tuple[int, ...],
    *,
    stride: tuple[int, ...] = (1, 1),
    padding: tuple[int, ...] = (0, 0),
    dilation: tuple[int, ...] = (1, 1),
) -> tuple[Tensor, Tensor, int]:
    """Mean ``(d,)``, population covariance ``(d, d)`` and number of the convolution patches
    of ``x``.

    ``x: (B, C, H, W)``; a patch is the ``d = C * kh * kw`` values (zero padding included)
    one output position of ``conv2d(x, w, stride=stride, padding=padding, dilation=dilation)``
    reads, in the order of ``w.reshape(out, d)``. Centred before the product (two-pass), as
    batch norm's variance.
    """
    cols = F.unfold(x, kernel_size, dilation, padding, stride)  # (B, d, L)
    count = cols.shape[0] * cols.shape[2]
    mean = cols.mean(dim=(0, 2))
    centred = cols - mean[:, None]
    # one (d, d) product per image, then their sum: no copy of cols, pairwise over images
    cov = torch.bmm(centred, centred.transpose(1, 2)).sum(dim=0) / count
    return mean, cov, count


def conv_batch_norm(
    in_channels: int,
    out_channels: int,
    kernel_size: int | tuple[int, int],
    *,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    bias: bool = True,
    eps: float = 1e-5,
    momentum: float = 0.1,
    affine: bool = True,
    track_running_stats: bool = True,
    dtype: torch.dtype | None = None,
) -> Model:
    """``conv2d`` then ``batch_norm`` over its channels, fused where that is cheaper.

    Arguments are those of :func:`~funcgraph.nn.conv2d` (``groups=1``) and
    :func:`~funcgraph.nn.batch_norm`. Params and state are named as the unfused pair:
    ``conv.weight``, ``conv.bias``, ``norm.weight``, ``norm.bias`` and ``norm.running_*``.
    """
    fn = "conv_batch_norm"
    check_sizes(fn, in_channels=in_channels, out_channels=out_channels)
    kernel = check_ints(fn, "kernel_size", kernel_size, dims=2)
    stride2 = check_ints(fn, "stride", stride, dims=2)
    padding2 = check_ints(fn, "padding", padding, dims=2, minimum=0)  # ints: the patches need them
    dilation2 = check_ints(fn, "dilation", dilation, dims=2)
    unfused = serial({
        "conv": conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                       dilation=dilation, bias=bias, dtype=dtype),
        "norm": batch_norm(out_channels, eps=eps, momentum=momentum, affine=affine,
                           track_running_stats=track_running_stats, dtype=dtype),
    }, name="conv_batch_norm")
    width = in_channels * kernel[0] * kernel[1]
    fuses = out_channels >= PATCH_WIDTH_RATIO * width

    def apply(
        params: Params, state: State, x: Tensor, *, key: Key | None = None, train: bool = False
    ) -> tuple[Tensor, State]:
        if x.dim() != 4 or x.shape[1] != in_channels:
            raise ShapeError(f"conv_batch_norm: expected input (B, {in_channels}, H, W), got "
                             f"{tuple(x.shape)}")
        if not (fuses and (train or not track_running_stats)):
            return unfused.apply(params, state, x, key=key, train=train)
        with full_precision(x):  # the statistics in float32 under bfloat16 autocast
            mean, cov, count = patch_moments(autocast_float32(x), kernel, stride=stride2,
                                             padding=padding2, dilation=dilation2)
            if train and count < 2:  # one value per channel: the unfused pair's error
                return unfused.apply(params, state, x, key=key, train=train)
            warn_if_one_example("conv_batch_norm", x)
            w = params["conv.weight"]
            flat = w.reshape(out_channels, width)
            b = params.get("conv.bias")
            out_mean = flat @ mean if b is None else flat @ mean + b  # (out,) mean of conv(x)
            out_var = ((flat @ cov) * flat).sum(dim=1).clamp_min(0)  # (out,) its variance
            scale = torch.rsqrt(out_var + eps)
            shift = -scale * out_mean if b is None else scale * (b - out_mean)
            if affine:
                scale = scale * params["norm.weight"]
                shift = shift * params["norm.weight"] + params["norm.bias"]
        y = F.conv2d(x, w * scale.reshape(-1, 1, 1, 1), shift, stride2, padding2, dilation2)
        if train and track_running_stats:
            norm_state = running_stats_update(select(state, "norm"), out_mean, out_var, count,
                                              momentum)
            return y, add_prefix(norm_state, "norm")
        return y, state

    meta: dict[str, Any] = {"in_channels": in_channels, "out_channels": out_channels,
                            "kernel_size": kernel, "stride": stride2, "padding": padding2,
                            "fused": fuses}
    return Model(unfused.init, apply, "conv_batch_norm", meta)


__all__ = ["PATCH_WIDTH_RATIO", "conv_batch_norm", "patch_moments"]
