"""DARTS cells and the network that stacks them.

A cell is a small DAG: two input nodes (the outputs of the two previous cells, preprocessed to
``C`` channels), ``steps`` intermediate nodes, each the sum of one op per earlier node, and the
concatenation of the intermediate nodes as output (``multiplier * C`` channels). A reduction
cell strides the edges leaving the two input nodes, halving H and W; the network puts
reduction cells at 1/3 and 2/3 of its depth and doubles ``C`` there.

The search network's architecture logits are ordinary params, ``arch.normal`` and
``arch.reduce`` (each ``(num_edges, num_ops)``), so
``funcgraph.params.partition(params, is_arch)`` splits weights from architecture.

``primitives`` is the search space: op names and ``(name, factory)`` pairs (see
:mod:`funcgraph.nas.ops`), one architecture column each, DARTS' eight ops by default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .. import random
from ..checks import check_sizes
from ..model import Model
from ..nn import Children, batch_norm, composite, conv2d, linear, serial
from ..params import Params, State
from ..random import Key
from .mixed import mixed_op
from .ops import PRIMITIVES, Primitive, factorized_reduce, primitive_names, relu_conv_bn

ARCH_PREFIX = "arch"
STEPS = 4
MULTIPLIER = 4


def is_arch(name: str) -> bool:
    """Whether a param name is an architecture weight (``arch.normal``, ``arch.reduce``)."""
    return name.startswith(ARCH_PREFIX + ".")


def num_edges(steps: int = STEPS) -> int:
    """Edges of a cell: intermediate node ``i`` has ``2 + i`` predecessors (14 for 4 steps)."""
    return sum(2 + i for i in range(steps))


def edge_inputs(steps: int = STEPS) -> list[tuple[int, int]]:
    """``(node, predecessor)`` of every edge in weight-row order; nodes 0, 1 are the inputs."""
    return [(2 + i, j) for i in range(steps) for j in range(2 + i)]


def preprocess(c_in: int, c: int, *, halve: bool, affine: bool) -> Model:
    """Bring a cell input to ``c`` channels (and to this cell's resolution when ``halve``)."""
    if halve:
        return factorized_reduce(c_in, c, affine=affine)
    return relu_conv_bn(c_in, c, 1, 1, 0, affine=affine)


def search_cell(
    c_prev_prev: int,
    c_prev: int,
    c: int,
    *,
    reduction: bool,
    reduction_prev: bool,
    steps: int = STEPS,
    multiplier: int = MULTIPLIER,
    primitives: Sequence[Primitive] = PRIMITIVES,
    partial_channels: int = 1,
) -> Model:
    """A search cell: one mixed op per edge over the space ``primitives``. Input
    ``(s0, s1, weights (num_edges, len(primitives)))``, output ``(B, multiplier * c, H', W')``
    with ``H' = H/2`` for a reduction cell."""
    names = primitive_names(primitives, where="search_cell")
    edges = edge_inputs(steps)
    children: dict[str, Model] = {
        "preprocess0": preprocess(c_prev_prev, c, halve=reduction_prev, affine=False),
        "preprocess1": preprocess(c_prev, c, halve=False, affine=False),
    }
    for e, (_, j) in enumerate(edges):
        stride = 2 if reduction and j < 2 else 1
        children[f"ops.{e}"] = mixed_op(c, stride, primitives=primitives,
                                        partial_channels=partial_channels)

    def forward(run: Children, inputs: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        s0, s1, weights = inputs
        states = [run("preprocess0", s0), run("preprocess1", s1)]
        for node in range(2, 2 + steps):
            states.append(sum(
                (run(f"ops.{e}", (states[j], weights[e]))
                 for e, (n, j) in enumerate(edges) if n == node),
                start=torch.zeros((), dtype=s1.dtype, device=s1.device),
            ))
        return torch.cat(states[-multiplier:], dim=1)

    return composite("search_cell", children, forward, reduction=reduction,
                     out_channels=multiplier * c, primitives=list(names))


@dataclass(frozen=True)
class CellSpec:
    """Channels and kind of one cell in the stack."""

    c_prev_prev: int
    c_prev: int
    c: int
    reduction: bool
    reduction_prev: bool


def layout(
    c: int, layers: int, *, stem_multiplier: int = 3, multiplier: int = MULTIPLIER
) -> tuple[int, list[CellSpec]]:
    """Stem channels and the cells of a ``layers``-deep stack: reductions at ``layers // 3``
    and ``2 * layers // 3``, where the cell width doubles (DARTS' ``Network``)."""
    check_sizes("layout", c=c, layers=layers)
    stem = stem_multiplier * c
    c_pp, c_p, c_cur = stem, stem, c
    specs: list[CellSpec] = []
    reduction_prev = False
    for i in range(layers):
        reduction = i in (layers // 3, 2 * layers // 3)
        if reduction:
            c_cur *= 2
        specs.append(CellSpec(c_pp, c_p, c_cur, reduction, reduction_prev))
        reduction_prev = reduction
        c_pp, c_p = c_p, multiplier * c_cur
    return stem, specs


CellArg = Callable[[Children, bool], Any]
"""What a cell gets beside ``(s0, s1)``: ``cell_arg(run, reduction)``."""


def stacked_network(
    name: str,
    cells: list[Model],
    specs: list[CellSpec],
    *,
    stem_channels: int,
    in_channels: int,
    num_classes: int,
    cell_arg: CellArg,
    own_init: Callable[[Key], tuple[Params, State]] | None = None,
    **meta: Any,
) -> Model:
    """Stem (conv 3x3 + batch norm), the cells, global average pooling and a linear
    classifier: ``x (B, in_channels, H, W) -> logits (B, num_classes)``. Each cell gets
    ``(s0, s1, cell_arg(run, reduction))`` where ``s0, s1`` are the two previous outputs, and
    declares its output width in ``meta["out_channels"]``."""
    c_out = int(cells[-1].meta["out_channels"])
    children: dict[str, Model] = {
        "stem": serial(conv2d(in_channels, stem_channels, 3, padding=1, bias=False),
                       batch_norm(stem_channels)),
        **{f"cells.{i}": cell for i, cell in enumerate(cells)},
        "classifier": linear(c_out, num_classes),
    }

    def forward(run: Children, x: Tensor) -> Tensor:
        s0 = s1 = run("stem", x)
        for i, spec in enumerate(specs):
            s0, s1 = s1, run(f"cells.{i}", (s0, s1, cell_arg(run, spec.reduction)))
        return run("classifier", s1.mean(dim=(2, 3)))  # (B, C_out) after global pooling

    return composite(name, children, forward, own_init=own_init, **meta)


def search_network(
    c: int,
    layers: int,
    num_classes: int,
    *,
    in_channels: int = 1,
    steps: int = STEPS,
    multiplier: int = MULTIPLIER,
    stem_multiplier: int = 3,
    primitives: Sequence[Primitive] = PRIMITIVES,
    partial_channels: int = 1,
    arch_init_scale: float = 1e-3,
) -> Model:
    """The DARTS supernet: ``x (B, in_channels, H, W) -> logits (B, num_classes)``.

    Params hold the weights and the architecture logits ``arch.normal`` / ``arch.reduce``
    ``(num_edges, len(primitives))``, initialised ``arch_init_scale * N(0, 1)`` as in DARTS;
    each cell uses the row-wise softmax of its kind's logits. Every batch norm is non-affine
    except the stem's (user ops are as their factories build them). H and W must be divisible
    by 4 (two reductions). ``primitives`` is the search space (op names and ``(name, factory)``
    pairs); ``meta["primitives"]`` holds its names, which genotypes refer to.
    """
    names = primitive_names(primitives, where="search_network")
    stem, specs = layout(c, layers, stem_multiplier=stem_multiplier, multiplier=multiplier)
    cells = [
        search_cell(s.c_prev_prev, s.c_prev, s.c, reduction=s.reduction,
                    reduction_prev=s.reduction_prev, steps=steps, multiplier=multiplier,
                    primitives=primitives, partial_channels=partial_channels)
        for s in specs
    ]
    shape = (num_edges(steps), len(names))

    def arch_init(key: Key) -> tuple[Params, State]:
        kn, kr = random.split(key)
        return {
            f"{ARCH_PREFIX}.normal": arch_init_scale * random.normal(kn, shape),
            f"{ARCH_PREFIX}.reduce": arch_init_scale * random.normal(kr, shape),
        }, {}

    def cell_weights(run: Children, reduction: bool) -> Tensor:
        logits = run.params[f"{ARCH_PREFIX}.{'reduce' if reduction else 'normal'}"]
        return torch.softmax(logits, dim=-1)

    return stacked_network(
        "darts_search", cells, specs, stem_channels=stem, in_channels=in_channels,
        num_classes=num_classes, cell_arg=cell_weights, own_init=arch_init,
        primitives=list(names), steps=steps, layers=layers, C=c,
        partial_channels=partial_channels,
    )


def arch_weights(params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``{"normal": softmax(alpha_normal), "reduce": softmax(alpha_reduce)}`` from params."""
    return {kind: torch.softmax(params[f"{ARCH_PREFIX}.{kind}"].detach(), dim=-1)
            for kind in ("normal", "reduce")}


__all__ = [
    "ARCH_PREFIX",
    "CellSpec",
    "arch_weights",
    "edge_inputs",
    "is_arch",
    "layout",
    "num_edges",
    "preprocess",
    "search_cell",
    "search_network",
    "stacked_network",
]
