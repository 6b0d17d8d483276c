"""Affine layers: ``linear`` and ``conv1d``/``conv2d``, named like ``nn.Linear``/``nn.Conv*d``."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import random
from ..checks import check_ints, check_sizes
from ..errors import ConfigError
from ..model import Model
from ..params import Params, State
from ..random import Key
from .init import fan_in_uniform


def linear(
    in_features: int, out_features: int, *, bias: bool = True, dtype: torch.dtype | None = None
) -> Model:
    """``y = x @ weight.T + bias``; params ``weight (out, in)``, ``bias (out,)``."""
    check_sizes("linear", in_features=in_features, out_features=out_features)

    def init(key: Key) -> tuple[Params, State]:
        kw, kb = random.split(key)
        params = {"weight": fan_in_uniform(kw, (out_features, in_features), in_features, dtype)}
        if bias:
            params["bias"] = fan_in_uniform(kb, (out_features,), in_features, dtype)
        return params, {}

    def apply(
        params: Params, state: State, x: Tensor, *, key: Key | None = None, train: bool = False
    ) -> tuple[Tensor, State]:
        return F.linear(x, params["weight"], params.get("bias")), state

    return Model(init, apply, "linear", {"in_features": in_features, "out_features": out_features})


_PADDING_MODES = ("same", "valid")


def _padding(
    fn: str, padding: int | tuple[int, ...] | str, dims: int, strides: tuple[int, ...]
) -> tuple[int, ...] | str:
    """A convolution's checked padding: ints >= 0 (one, or one per dim), or ``"same"`` /
    ``"valid"`` as torch takes them (``"same"`` only without stride, as torch requires)."""
    if not isinstance(padding, str):
        return check_ints(fn, "padding", padding, dims=dims, minimum=0)
    if padding not in _PADDING_MODES:
        raise ConfigError(f"{fn}: padding must be ints >= 0 or one of {_PADDING_MODES}, "
                          f"got {padding!r}")
    if padding == "same" and any(s != 1 for s in strides):
        raise ConfigError(f"{fn}: padding='same' needs stride 1 (torch has no strided 'same'), "
                          f"got stride={strides}")
    return padding


def _conv(
    dims: int,
    in_channels: int,
    out_channels: int,
    kernel_size: int | tuple[int, ...],
    *,
    stride: int | tuple[int, ...] = 1,
    padding: int | tuple[int, ...] | str = 0,
    dilation: int | tuple[int, ...] = 1,
    groups: int = 1,
    bias: bool = True,
    dtype: torch.dtype | None = None,
) -> Model:
    fn_name = f"conv{dims}d"
    check_sizes(fn_name, in_channels=in_channels, out_channels=out_channels, groups=groups)
    if in_channels % groups or out_channels % groups:
        raise ConfigError(
            f"{fn_name}: in_channels and out_channels must be divisible by groups, got "
            f"in_channels={in_channels}, out_channels={out_channels}, groups={groups}"
        )
    kernel = check_ints(fn_name, "kernel_size", kernel_size, dims=dims)
    strides = check_ints(fn_name, "stride", stride, dims=dims)
    dilations = check_ints(fn_name, "dilation", dilation, dims=dims)
    pad: Any = _padding(fn_name, padding, dims, strides)
    weight_shape = (out_channels, in_channels // groups, *kernel)
    fan_in = (in_channels // groups) * math.prod(kernel)
    conv = F.conv1d if dims == 1 else F.conv2d

    def init(key: Key) -> tuple[Params, State]:
        kw, kb = random.split(key)
        params = {"weight": fan_in_uniform(kw, weight_shape, fan_in, dtype)}
        if bias:
            params["bias"] = fan_in_uniform(kb, (out_channels,), fan_in, dtype)
        return params, {}

    def apply(
        params: Params, state: State, x: Tensor, *, key: Key | None = None, train: bool = False
    ) -> tuple[Tensor, State]:
        y = conv(x, params["weight"], params.get("bias"), strides, pad, dilations, groups)
        return y, state

    meta = {"in_channels": in_channels, "out_channels": out_channels, "kernel_size": kernel,
            "stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    return Model(init, apply, fn_name, meta)


def conv1d(in_channels: int, out_channels: int, kernel_size: int | tuple[int], **kw: Any) -> Model:
    """1-D convolution over ``(B, C, L)``, options as ``nn.Conv1d``."""
    return _conv(1, in_channels, out_channels, kernel_size, **kw)


def conv2d(
    in_channels: int, out_channels: int, kernel_size: int | tuple[int, int], **kw: Any
) -> Model:
    """2-D convolution over ``(B, C, H, W)``: stride, padding, dilation, groups as ``nn.Conv2d``."""
    return _conv(2, in_channels, out_channels, kernel_size, **kw)


__all__ = ["conv1d", "conv2d", "linear"]
