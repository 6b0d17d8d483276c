"""Initialisers drawn purely from a key: ``init(key, shape, dtype) -> Tensor``.

The defaults reproduce ``torch.nn``'s default initialisation in distribution (not in bits:
funcgraph never uses torch's global generator). A ``dtype`` of ``None`` is
``torch.get_default_dtype()`` when the init runs, as torch's layers use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .. import random
from ..errors import ShapeError
from ..random import Key


def fan_in_and_out(shape: Sequence[int]) -> tuple[int, int]:
    """``(fan_in, fan_out)`` as ``torch.nn.init`` computes them for a weight of ``shape``."""
    if len(shape) < 2:
        raise ShapeError(f"fan_in_and_out: need a weight with >= 2 dims, got shape {tuple(shape)}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def uniform(
    key: Key, shape: Sequence[int], low: float, high: float, dtype: torch.dtype | None
) -> Tensor:
    """Uniform in ``[low, high)``."""
    return random.uniform(key, shape, dtype=dtype, low=low, high=high)


def fan_in_uniform(
    key: Key, shape: Sequence[int], fan_in: int, dtype: torch.dtype | None
) -> Tensor:
    """``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``: torch's default for Linear/Conv weights and biases.

    (``kaiming_uniform_(a=sqrt(5))`` reduces to exactly this bound.)
    """
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return uniform(key, shape, -bound, bound, dtype)


__all__ = ["fan_in_and_out", "fan_in_uniform", "uniform"]
