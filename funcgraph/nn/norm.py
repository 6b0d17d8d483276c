"""Normalisation layers with explicit state.

Inside ``torch.func`` transforms, batch norm with batch statistics is written with
``mean``/``var`` rather than the native ``F.batch_norm`` kernel: in torch 2.13, ``vmap`` over
native batch norm in training mode gives wrong second-order gradients for parameters upstream
of the norm (about 1e-2 off in float64), while this form matches a Python loop to rounding.
MAML over a ``vmap`` of tasks depends on it. Outside transforms (plain autograd, including
second order with ``create_graph``) the native kernel is exact and faster forward and
backward, so it is used there; the tests compare both forms' second-order gradients.
Evaluation with running statistics is a fixed affine map and always uses the native kernel.
Running statistics are returned as new state, never updated in place.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_fraction, check_ints, check_sizes
from ..control import in_transform
from ..errors import ConfigError, ShapeError
from ..model import Model
from ..params import Params, State
from ..precision import autocast_float32
from ..random import Key


class BatchStatisticsWarning(UserWarning):
    """A batch norm with batch statistics normalised a batch of one example: its output
    depends on which examples share the batch."""


_warned_one_example = False
"""Whether :func:`warn_if_one_example` has warned in this process (it warns once)."""


def warn_if_one_example(fn: str, x: Tensor) -> None:
    """Warn, once per process, when batch statistics are taken over a batch of fewer than two
    examples outside ``torch.func`` transforms: the same image gives another output inside a
    batch, which a user calling a trained model on one image does not expect. Inside
    transforms the caller (a meta-learner's task) chose its batch itself; on the meta device
    nothing is computed (a shape or memory probe, such as the run layer's, counts one
    example), so neither warns nor uses up the once."""
    global _warned_one_example
    if x.shape[0] < 2 and not _warned_one_example and not x.is_meta and not in_transform():
        _warned_one_example = True
        warnings.warn(
            f"{fn}: batch statistics over a batch of {x.shape[0]} example(s) of shape "
            f"{tuple(x.shape[1:])}: the output differs from the same example's inside a batch; "
            f"pass a batch of examples (e.g. a task's whole query set), or use running "
            f"statistics (track_running_stats=True, train=False)",
            BatchStatisticsWarning, stacklevel=3)


def running_stats_update(
    state: State, mean: Tensor, var: Tensor, count: int, momentum: float
) -> State:
    """Batch norm's new running statistics after a batch of ``count`` values per channel with
    these ``mean`` and population ``var`` (stored unbiased, as ``nn.BatchNorm*d``)."""
    unbiased = var * (count / max(count - 1, 1))
    return {
        "running_mean": (1 - momentum) * state["running_mean"] + momentum * mean.detach(),
        "running_var": (1 - momentum) * state["running_var"] + momentum * unbiased.detach(),
        "num_batches_tracked": state["num_batches_tracked"] + 1,
    }


def batch_norm(
    num_features: int,
    *,
    eps: float = 1e-5,
    momentum: float = 0.1,
    affine: bool = True,
    track_running_stats: bool = True,
    dtype: torch.dtype | None = None,
) -> Model:
    """Batch norm over the channel dim 1 of ``(B, C)``, ``(B, C, L)`` or ``(B, C, H, W)``.

    Training uses batch statistics and returns updated ``running_mean``/``running_var``
    (unbiased variance, as ``nn.BatchNorm*d``) and ``num_batches_tracked``. Evaluation uses
    the running statistics, or batch statistics when ``track_running_stats=False``
    (transductive batch norm, as MAML uses).
    """
    check_sizes("batch_norm", num_features=num_features)
    check_fraction("batch_norm", "momentum", momentum, allow_one=True)

    def init(key: Key) -> tuple[Params, State]:
        params: Params = {}
        state: State = {}
        if affine:
            params = {"weight": torch.ones(num_features, dtype=dtype),
                      "bias": torch.zeros(num_features, dtype=dtype)}
        if track_running_stats:
            state = {"running_mean": torch.zeros(num_features, dtype=dtype),
                     "running_var": torch.ones(num_features, dtype=dtype),
                     "num_batches_tracked": torch.zeros((), dtype=torch.int64)}
        return params, state

    def apply(
        params: Params, state: State, x: Tensor, *, key: Key | None = None, train: bool = False
    ) -> tuple[Tensor, State]:
        _check_input(x, num_features, train=train)
        x = autocast_float32(x)  # statistics in float32 under bfloat16 autocast
        if not train and track_running_stats:
            # Running statistics make the norm a fixed affine map: the native kernel is exact
            # here (the vmap bug needs batch statistics) and several times faster.
            y = F.batch_norm(x, state["running_mean"], state["running_var"],
                             params.get("weight"), params.get("bias"), False, 0.0, eps)
            return y, state
        warn_if_one_example("batch_norm", x)
        update = train and track_running_stats
        if not in_transform() and x.numel() > num_features:
            # (the native kernel refuses one value per channel; the form below gives var 0)
            return _native_batch_statistics(x, params, state, update=update, momentum=momentum,
                                            eps=eps)
        return _batch_statistics(x, params, state, update=update, affine=affine,
                                 momentum=momentum, eps=eps)

    return Model(init, apply, "batch_norm", {"num_features": num_features})


def _check_input(x: Tensor, num_features: int, *, train: bool) -> None:
    """Refuse an input batch norm cannot normalise: not ``(B, num_features, ...)``, or in
    training one value per channel."""
    if x.dim() < 2 or x.shape[1] != num_features:
        raise ShapeError(
            f"batch_norm: expected input (B, {num_features}, ...), got {tuple(x.shape)}"
        )
    if train and x.numel() // num_features < 2:
        raise ShapeError(
            f"batch_norm: training needs more than one value per channel, got input "
            f"{tuple(x.shape)}; use a larger batch or train=False"
        )


def _native_batch_statistics(
    x: Tensor, params: Params, state: State, *, update: bool, momentum: float, eps: float
) -> tuple[Tensor, State]:
    """Batch norm with batch statistics by the native kernel (exact outside transforms),
    ``update`` saying whether it also returns updated running statistics."""
    new_state = state
    if update:  # copies: the native kernel updates in place
        new_state = {"running_mean": state["running_mean"].clone(),
                     "running_var": state["running_var"].clone(),
                     "num_batches_tracked": state["num_batches_tracked"] + 1}
    y = F.batch_norm(x, new_state.get("running_mean"), new_state.get("running_var"),
                     params.get("weight"), params.get("bias"), True, momentum, eps)
    return y, new_state


def _batch_statistics(
    x: Tensor, params: Params, state: State, *, update: bool, affine: bool, momentum: float,
    eps: float,
) -> tuple[Tensor, State]:
    """Batch norm with batch statistics written with ``mean``/``var``, the form that stays
    exact under ``vmap`` (see the module docstring), ``update`` saying whether it also
    returns updated running statistics."""
    dims = [0, *range(2, x.dim())]
    shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
    mean = x.mean(dim=dims)
    # two-pass form: same value as x.var(unbiased=False), faster on CPU in torch 2.13
    # (benchmarks/batch_norm_variance.py; recorded in docs/results/benchmarks.md)
    var = (x - mean.reshape(shape)).square().mean(dim=dims)
    new_state = state
    if update:
        new_state = running_stats_update(state, mean, var, x.numel() // x.shape[1], momentum)
    y = (x - mean.reshape(shape)) * torch.rsqrt(var.reshape(shape) + eps)
    if affine:
        y = y * params["weight"].reshape(shape) + params["bias"].reshape(shape)
    return y, new_state


def layer_norm(
    normalized_shape: int | tuple[int, ...],
    *,
    eps: float = 1e-5,
    elementwise_affine: bool = True,
    dtype: torch.dtype | None = None,
) -> Model:
    """Layer norm over the trailing ``normalized_shape`` dims, as ``nn.LayerNorm``."""
    shape = check_ints("layer_norm", "normalized_shape", normalized_shape)

    def init(key: Key) -> tuple[Params, State]:
        if not elementwise_affine:
            return {}, {}
        return {"weight": torch.ones(shape, dtype=dtype),
                "bias": torch.zeros(shape, dtype=dtype)}, {}

    def apply(
        params: Params, state: State, x: Tensor, *, key: Key | None = None, train: bool = False
    ) -> tuple[Tensor, State]:
        return F.layer_norm(x, shape, params.get("weight"), params.get("bias"), eps), state

    return Model(init, apply, "layer_norm", {"normalized_shape": shape})


def group_norm(
    num_groups: int,
    num_channels: int,
    *,
    eps: float = 1e-5,
    affine: bool = True,
    dtype: torch.dtype | None = None,
) -> Model:
    """Group norm over channel groups of ``(B, C, ...)``, as ``nn.GroupNorm``."""
    check_sizes("group_norm", num_groups=num_groups, num_channels=num_channels)
    if num_channels % num_groups:
        raise ConfigError(
            f"group_norm: num_channels must be divisible by num_groups, got "
            f"num_channels={num_channels}, num_groups={num_groups}"
        )

    def init(key: Key) -> tuple[Params, State]:
        if not affine:
            return {}, {}
        return {"weight": torch.ones(num_channels, dtype=dtype),
                "bias": torch.zeros(num_channels, dtype=dtype)}, {}

    def apply(
        params: Params, state: State, x: Tensor, *, key: Key | None = None, train: bool = False
    ) -> tuple[Tensor, State]:
        if x.dim() < 2 or x.shape[1] != num_channels:
            raise ShapeError(
                f"group_norm: expected input (B, {num_channels}, ...), got {tuple(x.shape)}"
            )
        return F.group_norm(x, num_groups, params.get("weight"), params.get("bias"), eps), state

    return Model(init, apply, "group_norm", {"num_groups": num_groups,
                                             "num_channels": num_channels})


__all__ = ["BatchStatisticsWarning", "batch_norm", "group_norm", "layer_norm",
           "running_stats_update", "warn_if_one_example"]
