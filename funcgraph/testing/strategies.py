"""Hypothesis strategies for funcgraph's inputs: tensors, keys, params, padded sequences.

Import as ``from funcgraph.testing import strategies as fst``. This module needs the
``hypothesis`` package (``pip install funcgraph[test]``); the rest of
:mod:`funcgraph.testing` does not.

Values are drawn element by element (they shrink to small, readable counterexamples), so keep
shapes small: the defaults stay at 4-5 per side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch import Tensor

from .. import random
from ..model import Model

Strategy = st.SearchStrategy

_NUMPY_FLOAT: dict[torch.dtype, tuple[Any, Literal[16, 32, 64]]] = {
    torch.float16: (np.float16, 16),
    torch.bfloat16: (np.float32, 32),  # numpy has no bfloat16: draw float32, then round
    torch.float32: (np.float32, 32),
    torch.float64: (np.float64, 64),
}
_NUMPY_INT: dict[torch.dtype, Any] = {
    torch.int8: np.int8, torch.uint8: np.uint8, torch.int16: np.int16,
    torch.int32: np.int32, torch.int64: np.int64,
}


def available_devices() -> list[str]:
    """``"cpu"`` plus every CUDA device and MPS that torch sees on this machine."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        found.append("mps")
    return found


def devices() -> Strategy[str]:
    """One of :func:`available_devices`; shrinks to ``"cpu"``."""
    return st.sampled_from(available_devices())


def shapes(
    *, min_dims: int = 1, max_dims: int = 4, min_side: int = 1, max_side: int = 5
) -> Strategy[tuple[int, ...]]:
    """Tensor shapes with ``min_dims..max_dims`` dims of ``min_side..max_side`` each."""
    return st.lists(
        st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims
    ).map(tuple)


def _arrays(dtype: torch.dtype, shape: tuple[int, ...], low: float, high: float) -> Strategy[Any]:
    if dtype in _NUMPY_FLOAT:
        np_dtype, width = _NUMPY_FLOAT[dtype]
        elements: Strategy[Any] = st.floats(
            low, high, allow_nan=False, allow_infinity=False, width=width
        )
        return hnp.arrays(np_dtype, shape, elements=elements)
    if dtype in _NUMPY_INT:
        info = np.iinfo(_NUMPY_INT[dtype])
        ints = st.integers(max(int(np.ceil(low)), int(info.min)), min(int(high), int(info.max)))
        return hnp.arrays(_NUMPY_INT[dtype], shape, elements=ints)
    if dtype == torch.bool:
        return hnp.arrays(np.bool_, shape, elements=st.booleans())
    raise ValueError(f"tensors: unsupported dtype {dtype}")


def tensors(
    shape: Sequence[int] | Strategy[tuple[int, ...]] | None = None,
    *,
    dtype: torch.dtype | Strategy[torch.dtype] = torch.float32,
    device: str | torch.device | Strategy[str] = "cpu",
    min_value: float = -10.0,
    max_value: float = 10.0,
) -> Strategy[Tensor]:
    """Tensors of finite values in ``[min_value, max_value]``.

    Arguments:
        shape: a fixed shape, a strategy of shapes, or ``None`` for :func:`shapes` defaults.
        dtype: a dtype or a strategy of dtypes (floating, integer or ``torch.bool``).
        device: a device or a strategy such as :func:`devices`.
        min_value, max_value: the value range (integers are drawn from its integer part).

    Example::

        @given(fst.tensors((3, 4), dtype=torch.float64))
        def test_relu_is_nonnegative(x): ...
    """
    shape_st = shapes() if shape is None else (
        shape if isinstance(shape, st.SearchStrategy) else st.just(tuple(shape))
    )
    dtype_st = dtype if isinstance(dtype, st.SearchStrategy) else st.just(dtype)
    device_st = device if isinstance(device, st.SearchStrategy) else st.just(str(device))

    @st.composite
    def draw_tensor(draw: st.DrawFn) -> Tensor:
        sh, dt, dev = draw(shape_st), draw(dtype_st), draw(device_st)
        array = draw(_arrays(dt, sh, min_value, max_value))
        return torch.from_numpy(np.ascontiguousarray(array)).to(device=dev, dtype=dt)

    return draw_tensor()


def keys(*, device: str | torch.device = "cpu") -> Strategy[Tensor]:
    """funcgraph random keys from seeds in ``[0, 2**64)``; shrinks towards ``key(0)``."""
    return st.integers(0, 2**64 - 1).map(lambda seed: random.key(seed, device=device))


def params_for(
    model: Model,
    *,
    min_value: float | None = None,
    max_value: float | None = None,
    with_state: bool = False,
) -> Strategy[Any]:
    """Parameter dicts for ``model``: names, shapes and dtypes exactly as ``model.init``.

    By default the values are ``model.init(key)`` for a drawn key, i.e. realistic
    initialisations. With ``min_value``/``max_value``, every floating tensor is instead drawn
    element by element from that range (integer tensors keep their init values), which finds
    edge cases such as all-zero or saturating weights. With ``with_state=True`` the strategy
    gives ``(params, state)`` where ``state`` is the model's initial state.

    Example::

        @given(fst.params_for(model), fst.tensors((2, 3)))
        def test_finite(params, x): ...
    """
    if (min_value is None) != (max_value is None):
        raise ValueError("params_for: give both min_value and max_value, or neither")

    @st.composite
    def draw_params(draw: st.DrawFn) -> Any:
        k = draw(keys())
        params, state = model.init(k)
        if min_value is not None and max_value is not None:
            params = {
                name: draw(tensors(tuple(t.shape), dtype=t.dtype, device=str(t.device),
                                   min_value=min_value, max_value=max_value))
                if t.is_floating_point() else t
                for name, t in params.items()
            }
        return (params, state) if with_state else params

    return draw_params()


def padded_sequences(
    features: int = 3,
    *,
    min_batch: int = 1,
    max_batch: int = 4,
    min_length: int = 1,
    max_length: int = 6,
    dtype: torch.dtype = torch.float32,
    min_value: float = -3.0,
    max_value: float = 3.0,
) -> Strategy[tuple[Tensor, Tensor]]:
    """Padded batches ``(inputs (B, T, F), lengths (B,) int64)``, the input of
    ``funcgraph.nn.lstm``/``gru`` with ``batch_first=True``.

    ``T`` is the longest length in the batch; steps at and after a sequence's length are zero.
    Lengths range over ``min_length..max_length`` (length-1 sequences included by default).
    """
    if min_length < 1 or max_length < min_length:
        raise ValueError(
            f"padded_sequences: need 1 <= min_length <= max_length, got {min_length}, {max_length}"
        )

    @st.composite
    def draw_batch(draw: st.DrawFn) -> tuple[Tensor, Tensor]:
        lengths = draw(st.lists(st.integers(min_length, max_length),
                                min_size=min_batch, max_size=max_batch))
        steps = max(lengths)
        x = draw(tensors((len(lengths), steps, features), dtype=dtype,
                         min_value=min_value, max_value=max_value))
        lens = torch.tensor(lengths, dtype=torch.int64)
        valid = torch.arange(steps) < lens.unsqueeze(-1)  # (B, T)
        return x * valid.unsqueeze(-1).to(dtype), lens

    return draw_batch()


__all__ = [
    "available_devices",
    "devices",
    "keys",
    "padded_sequences",
    "params_for",
    "shapes",
    "tensors",
]
