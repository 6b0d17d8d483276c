"""Affine layers: ``linear`` and ``conv1d``/``conv2d``, named like ``nn.Linear``/``nn.Conv*d``."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import random
from ..model import Model
from ..params import Params, State
from ..random import Key
from .init import fan_in_uniform


def _check_positive(fn: str, **values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{fn}: {name} must be a positive int, got {v!r}")


def linear(
    in_features: int, out_features: int, *, bias: bool = True, dtype: torch.dtype = torch.float32
) -> Model:
    """``y = x @ weight.T + bias``; params ``weight (out, in)``, ``bias (out,)``."""
    _check_positive("linear", in_features=in_features, out_features=out_features)

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


def _pair(v: int | tuple[int, ...], n: int) -> tuple[int, ...]:
    return (v,) * n if isinstance(v, int) else tuple(v)


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
    dtype: torch.dtype = torch.float32,
) -> Model:
    fn_name = f"conv{dims}d"
    _check_positive(fn_name, in_channels=in_channels, out_channels=out_channels, groups=groups)
    if in_channels % groups or out_channels % groups:
        raise ValueError(
            f"{fn_name}: in_channels ({in_channels}) and out_channels ({out_channels}) "
            f"must be divisible by groups ({groups})"
        )
    kernel = _pair(kernel_size, dims)
    weight_shape = (out_channels, in_channels // groups, *kernel)
    fan_in = (in_channels // groups) * math.prod(kernel)
    conv = F.conv1d if dims == 1 else F.conv2d
    pad: Any = padding if isinstance(padding, str) else _pair(padding, dims)

    def init(key: Key) -> tuple[Params, State]:
        kw, kb = random.split(key)
        params = {"weight": fan_in_uniform(kw, weight_shape, fan_in, dtype)}
        if bias:
            params["bias"] = fan_in_uniform(kb, (out_channels,), fan_in, dtype)
        return params, {}

    def apply(
        params: Params, state: State, x: Tensor, *, key: Key | None = None, train: bool = False
    ) -> tuple[Tensor, State]:
        y = conv(x, params["weight"], params.get("bias"), _pair(stride, dims), pad,
                 _pair(dilation, dims), groups)
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
