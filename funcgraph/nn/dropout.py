"""Dropout and embedding: the two simple layers that are not parameter-free maps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import random
from ..checks import check_fraction, check_sizes
from ..errors import ConfigError, KeyMissingError
from ..model import Model
from ..params import Params, State
from ..random import Key


def keyed_drop(name: str, drop_prob: float, drop: Callable[[Key, Tensor], Tensor],
               **meta: Any) -> Model:
    """A parameter-free layer that applies ``drop(key, x)`` in training and is the identity
    otherwise (or when ``drop_prob`` is 0): what dropout and DropBlock share. Training without
    a key is a :class:`KeyMissingError` saying what to pass."""

    def init(key: Key) -> tuple[Params, State]:
        return {}, {}

    def apply(
        params: Params, state: State, x: Tensor, *, key: Key | None = None, train: bool = False
    ) -> tuple[Tensor, State]:
        if not train or drop_prob == 0.0:
            return x, state
        if key is None:
            raise KeyMissingError(
                f"{name}: training mode needs a key; call apply(..., key=funcgraph.random."
                "key(0), train=True) or pass train=False"
            )
        return drop(key, x), state

    return Model(init, apply, name, {"drop_prob": drop_prob, **meta})


def dropout(drop_prob: float = 0.5) -> Model:
    """Zero each element with probability ``drop_prob`` in training, scaling the rest by
    ``1 / (1 - drop_prob)`` (inverted dropout, as ``nn.Dropout``); identity in evaluation.

    Training needs a ``key``; the mask is a pure function of it.
    """
    check_fraction("dropout", "drop_prob", drop_prob)

    def drop(key: Key, x: Tensor) -> Tensor:
        keep = random.bernoulli(key, 1.0 - drop_prob, x.shape)
        return torch.where(keep, x / (1.0 - drop_prob), torch.zeros_like(x))

    return keyed_drop("dropout", drop_prob, drop)


def embedding(
    num_embeddings: int,
    embedding_dim: int,
    *,
    padding_idx: int | None = None,
    dtype: torch.dtype | None = None,
) -> Model:
    """A lookup table ``weight (num_embeddings, embedding_dim)``, as ``nn.Embedding``
    (initialised N(0, 1); the ``padding_idx`` row is zero and gets no gradient)."""
    check_sizes("embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim)
    if padding_idx is not None and not (
        isinstance(padding_idx, int) and not isinstance(padding_idx, bool)
        and -num_embeddings <= padding_idx < num_embeddings
    ):
        raise ConfigError(f"embedding: padding_idx must be None or an int in [-{num_embeddings}, "
                          f"{num_embeddings}) (a row of the table), got {padding_idx!r}")

    def init(key: Key) -> tuple[Params, State]:
        weight = random.normal(key, (num_embeddings, embedding_dim), dtype=dtype)
        if padding_idx is not None:
            weight[padding_idx] = 0.0
        return {"weight": weight}, {}

    def apply(
        params: Params, state: State, x: Tensor, *, key: Key | None = None, train: bool = False
    ) -> tuple[Tensor, State]:
        return F.embedding(x, params["weight"], padding_idx), state

    return Model(init, apply, "embedding", {"num_embeddings": num_embeddings,
                                            "embedding_dim": embedding_dim})


__all__ = ["dropout", "embedding"]
