"""The mixed op: a softmax-weighted sum of every candidate op on one edge of a cell.

``mixed_op(C, stride)`` is a Model whose input is the pair ``(x, weights)``: ``x (B, C, H, W)``
and ``weights (num_ops,)``, already normalised (the cell takes the softmax of the architecture
logits once per cell). The output is ``sum_k weights[k] * op_k(x)``: with one weight at 1 the
mixed op *is* that op, which is what lets the search relax a discrete choice.

With ``partial_channels=k`` (PC-DARTS, Xu et al., 2020) only the first ``C/k`` channels go
through the candidate ops; the rest bypass them (max-pooled at stride 2) and a channel shuffle
mixes the two parts, so the search holds about ``1/k`` of the activations.

The candidates are a search space (``primitives``: op names and ``(name, factory)`` pairs,
see :mod:`funcgraph.nas.ops`); the default is DARTS' eight ops.

The input may carry a third entry, ``(x, weights, aux)``: DARTS-' auxiliary skip (Chu et
al., ICLR 2021), ``aux * x`` added to the output, ``aux`` a scalar (float or 0-dim tensor).
It needs stride 1, where ``x`` and the output have one shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_sizes
from ..errors import ConfigError, ShapeError
from ..model import Model
from ..nn import Children, batch_norm, composite, serial
from .ops import PRIMITIVES, Primitive, make_op, primitive_names

POOLS = ("max_pool_3x3", "avg_pool_3x3")


def search_op(
    name: str, c: int, stride: int, *, primitives: Sequence[Primitive] | None = None
) -> Model:
    """Candidate ``name`` (of ``primitives``, default every known op) as the search builds it:
    the built-in ops with non-affine batch norm, and the built-in pools followed by a
    non-affine batch norm too (DARTS does this so every op's output has a comparable scale
    under the shared softmax). A user op is its factory's Model, as in the final network."""
    op = make_op(name, c, stride, affine=False, primitives=primitives)
    # user ops may not take a built-in name, so these names are the built-in pools
    return serial(op, batch_norm(c, affine=False), name=name) if name in POOLS else op


def weighted_sum(outputs: Sequence[Tensor], weights: Tensor) -> Tensor:
    """``sum_k weights[k] * outputs[k]``; ``weights (K,)`` with ``K == len(outputs)``."""
    if weights.shape != (len(outputs),):
        raise ShapeError(
            f"weighted_sum: expected weights of shape ({len(outputs)},), got {tuple(weights.shape)}"
        )
    stacked = torch.stack(list(outputs))  # (K, B, C, H, W)
    return torch.tensordot(weights, stacked, dims=1)


def channel_shuffle(x: Tensor, groups: int) -> Tensor:
    """Interleave ``groups`` channel groups: ``(B, g*n, H, W) -> (B, n*g, H, W)`` transposed."""
    b, c, h, w = x.shape
    return x.reshape(b, groups, c // groups, h, w).transpose(1, 2).reshape(b, c, h, w)


def mixed_op(
    c: int,
    stride: int,
    *,
    primitives: Sequence[Primitive] = PRIMITIVES,
    partial_channels: int = 1,
) -> Model:
    """The DARTS mixed op on ``c`` channels; input ``(x, weights)`` or, at stride 1,
    ``(x, weights, aux)`` with the auxiliary skip; see the module docstring.

    Arguments:
        c: channels of ``x``.
        stride: 1 (shape kept) or 2 (H and W halved).
        primitives: the search space, in the order of ``weights``: op names (built-in or
            registered) and ``(name, factory)`` pairs, ``factory(C, stride) -> Model``.
        partial_channels: ``k`` of PC-DARTS (1 = plain DARTS); ``c`` must be divisible by it.
    """
    check_sizes("mixed_op", c=c, partial_channels=partial_channels)
    k = partial_channels
    if c % k:
        raise ConfigError(f"mixed_op: partial_channels must divide c, got partial_channels={k}, "
                          f"c={c}")
    width = c // k
    names = primitive_names(primitives, where="mixed_op")
    children = {f"ops.{i}": search_op(name, width, stride, primitives=primitives)
                for i, name in enumerate(names)}

    def forward(run: Children, inputs: tuple[Tensor, ...]) -> Tensor:
        x, weights, *aux = inputs
        if x.dim() != 4 or x.shape[1] != c:
            raise ShapeError(f"mixed_op: expected x of shape (B, {c}, H, W), got {tuple(x.shape)}")
        if aux and stride != 1:
            raise ConfigError("mixed_op: the auxiliary skip (a third input) needs stride 1, "
                              f"got stride {stride}")
        active = x[:, :width]
        out = weighted_sum([run(name, active) for name in children], weights)
        if k > 1:
            bypass = x[:, width:]
            if stride == 2:
                bypass = F.max_pool2d(bypass, 2, 2)
            out = channel_shuffle(torch.cat([out, bypass], dim=1), k)
        return out + aux[0] * x if aux else out

    return composite("mixed_op", children, forward, stride=stride, partial_channels=k,
                     primitives=list(names))


__all__ = ["channel_shuffle", "mixed_op", "search_op", "weighted_sum"]
