"""DARTS cells and the network that stacks them.

A cell is a small DAG: two input nodes (the outputs of the two previous cells, preprocessed to
``C`` channels), ``steps`` intermediate nodes, each the sum of one op per earlier node, and the
concatenation of the last ``multiplier`` of them as output (``multiplier * C`` channels;
DARTS' cells have 4 of each, :data:`STEPS` and :data:`MULTIPLIER`). A reduction
cell strides the edges leaving the two input nodes, halving H and W; the network puts
reduction cells at 1/3 and 2/3 of its depth and doubles ``C`` there.

The search network's architecture logits are ordinary params, ``arch.normal`` and
``arch.reduce`` (each ``(num_edges, num_ops)``), so
``funcgraph.params.partition(params, is_arch)`` splits weights from architecture. With
``edge_normalization`` (PC-DARTS) there are edge logits too, ``arch.normal_edges`` and
``arch.reduce_edges`` (each ``(num_edges,)``), architecture by the same prefix.

``primitives`` is the search space: op names and ``(name, factory)`` pairs (see
:mod:`funcgraph.nas.ops`), one architecture column each, DARTS' eight ops by default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .. import random
from ..checks import check_int, check_sizes
from ..errors import ConfigError, ShapeError
from ..model import Model
from ..nn import Children, batch_norm, composite, conv2d, linear, serial
from ..params import Params, State
from ..random import Key
from .mixed import mixed_op
from .ops import PRIMITIVES, Primitive, factorized_reduce, primitive_names, relu_conv_bn

ARCH_PREFIX = "arch"
STEPS = 4
MULTIPLIER = 4
KINDS = ("normal", "reduce")
AUX_SKIP = "aux_skip"
"""The params entry of DARTS-' auxiliary skip coefficient (a 0-dim tensor) in a supernet built
with ``aux_skip``. ``init`` does not make it and it has no architecture prefix: the search
step adds it from the step index, outside every group an optimiser sees; absent, it is 0."""


def is_arch(name: str) -> bool:
    """Whether a param name is an architecture weight (``arch.normal``, ``arch.reduce``, and
    with edge normalisation ``arch.normal_edges``, ``arch.reduce_edges``)."""
    return name.startswith(ARCH_PREFIX + ".")


def num_edges(steps: int = STEPS) -> int:
    """Edges of a cell: intermediate node ``i`` has ``2 + i`` predecessors (14 for 4 steps)."""
    return sum(2 + i for i in range(steps))


def edge_inputs(steps: int = STEPS) -> list[tuple[int, int]]:
    """``(node, predecessor)`` of every edge in weight-row order; nodes 0, 1 are the inputs."""
    return [(2 + i, j) for i in range(steps) for j in range(2 + i)]


def output_nodes(steps: int = STEPS, multiplier: int | None = None, *,
                 where: str = "output_nodes") -> tuple[int, ...]:
    """The nodes a cell concatenates as its output: the last ``multiplier`` of its ``steps``
    intermediate nodes (all of them when ``multiplier`` is None), as DARTS' cells do; nodes
    0, 1 are the inputs, so ``(2, 3, 4, 5)`` for 4 steps. A multiplier above ``steps`` would
    concatenate an input, which no genotype can express: a ConfigError."""
    check_int(where, "steps", steps)
    multiplier = steps if multiplier is None else check_int(where, "multiplier", multiplier)
    if multiplier > steps:
        raise ConfigError(f"{where}: multiplier ({multiplier}) must be at most steps ({steps}): "
                          "a cell concatenates its last `multiplier` intermediate nodes")
    return tuple(range(2 + steps - multiplier, 2 + steps))


def edge_softmax(logits: Tensor) -> Tensor:
    """PC-DARTS' edge weights from edge logits ``(num_edges,)``: the softmax over each node's
    incoming edges (rows in :func:`edge_inputs` order: 2 for the first node, 3, 4, ...)."""
    steps = 0
    while logits.dim() == 1 and num_edges(steps) < logits.shape[0]:
        steps += 1
    if logits.dim() != 1 or steps == 0 or num_edges(steps) != logits.shape[0]:
        raise ShapeError(f"edge_softmax: expected the edge logits of a cell, (2 + 3 + ... "
                         f"edges,), got {tuple(logits.shape)}")
    return torch.cat([torch.softmax(logits[num_edges(i):num_edges(i + 1)], dim=-1)
                      for i in range(steps)])


class CellArch(NamedTuple):
    """What a search cell gets beside ``(s0, s1)`` when a remedy is on (otherwise the op
    weights alone): ``ops (num_edges, num_ops)`` the softmax over each edge's ops, ``edges
    (num_edges,)`` PC-DARTS' edge weights or None, ``aux_skip`` DARTS-' coefficient (a
    scalar) or None."""

    ops: Tensor
    edges: Tensor | None = None
    aux_skip: Tensor | None = None


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
    multiplier: int | None = None,
    primitives: Sequence[Primitive] = PRIMITIVES,
    partial_channels: int = 1,
) -> Model:
    """A search cell: one mixed op per edge over the space ``primitives``. Input
    ``(s0, s1, weights (num_edges, len(primitives)))``, output ``(B, multiplier * c, H', W')``
    with ``H' = H/2`` for a reduction cell: the last ``multiplier`` of its ``steps`` nodes
    (None: all of them; :func:`output_nodes`).

    With a :class:`CellArch` in place of ``weights``, its ``edges`` scale each edge's output
    (PC-DARTS' edge normalisation: a node is ``sum_j edges[j] * mixed_j(x_j)``) and its
    ``aux_skip`` goes to every stride-1 mixed op (DARTS-' auxiliary skip, inside the edge's
    output, so the edge weight scales it too); a reduction cell's edges from its inputs
    (stride 2) get no auxiliary skip."""
    names = primitive_names(primitives, where="search_cell")
    concat = output_nodes(steps, multiplier, where="search_cell")
    edges = edge_inputs(steps)
    strides = [2 if reduction and j < 2 else 1 for _, j in edges]
    children: dict[str, Model] = {
        "preprocess0": preprocess(c_prev_prev, c, halve=reduction_prev, affine=False),
        "preprocess1": preprocess(c_prev, c, halve=False, affine=False),
    }
    for e, stride in enumerate(strides):
        children[f"ops.{e}"] = mixed_op(c, stride, primitives=primitives,
                                        partial_channels=partial_channels)

    def edge(run: Children, e: int, x: Tensor, arch: CellArch) -> Tensor:
        aux = arch.aux_skip
        out = run(f"ops.{e}", (x, arch.ops[e]) if aux is None or strides[e] != 1
                  else (x, arch.ops[e], aux))
        return out if arch.edges is None else arch.edges[e] * out

    def forward(run: Children, inputs: tuple[Tensor, Tensor, Tensor | CellArch]) -> Tensor:
        s0, s1, weights = inputs
        arch = CellArch(weights) if isinstance(weights, Tensor) else weights
        states = [run("preprocess0", s0), run("preprocess1", s1)]
        for node in range(2, 2 + steps):
            states.append(sum(
                (edge(run, e, states[j], arch) for e, (n, j) in enumerate(edges) if n == node),
                start=torch.zeros((), dtype=s1.dtype, device=s1.device),
            ))
        return torch.cat([states[n] for n in concat], dim=1)

    return composite("search_cell", children, forward, reduction=reduction,
                     out_channels=len(concat) * c, primitives=list(names))


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
    multiplier: int | None = None,
    stem_multiplier: int = 3,
    primitives: Sequence[Primitive] = PRIMITIVES,
    partial_channels: int = 1,
    arch_init_scale: float = 1e-3,
    edge_normalization: bool = False,
    aux_skip: bool = False,
) -> Model:
    """The DARTS supernet: ``x (B, in_channels, H, W) -> logits (B, num_classes)``.

    ``layers`` cells of ``steps`` intermediate nodes, the last ``multiplier`` of which (None:
    all of them) make a cell's output (:func:`output_nodes`), on a stem ``stem_multiplier * c``
    wide; DARTS' are 4 nodes, all 4 concatenated, and a stem of ``3 * c``.

    Params hold the weights and the architecture logits ``arch.normal`` / ``arch.reduce``
    ``(num_edges, len(primitives))``, initialised ``arch_init_scale * N(0, 1)`` as in DARTS;
    each cell uses the row-wise softmax of its kind's logits. Every batch norm is non-affine
    except the stem's (user ops are as their factories build them). H and W must be divisible
    by 4 (two reductions). ``primitives`` is the search space (op names and ``(name, factory)``
    pairs); ``meta["primitives"]`` holds its names, which genotypes refer to.

    ``edge_normalization`` (PC-DARTS, Xu et al., ICLR 2020) adds the edge logits
    ``arch.normal_edges`` / ``arch.reduce_edges`` ``(num_edges,)``, initialised like alpha
    (``arch_init_scale * N(0, 1)``, as the PC-DARTS code does; alpha's values are those of
    the plain supernet), and scales each edge by :func:`edge_softmax` of its kind's edge
    logits. ``aux_skip`` (DARTS-, Chu et al., ICLR 2021) adds ``params[AUX_SKIP] * x`` to
    every stride-1 edge (see :data:`AUX_SKIP`; absent, the supernet is the plain one).
    """
    names = primitive_names(primitives, where="search_network")
    multiplier = len(output_nodes(steps, multiplier, where="search_network"))
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
        params = {
            f"{ARCH_PREFIX}.normal": arch_init_scale * random.normal(kn, shape),
            f"{ARCH_PREFIX}.reduce": arch_init_scale * random.normal(kr, shape),
        }
        if edge_normalization:  # keys of their own: alpha stays as without them
            for i, kind in enumerate(KINDS, start=2):
                params[f"{ARCH_PREFIX}.{kind}_edges"] = arch_init_scale * random.normal(
                    random.fold_in(key, i), shape[:1])
        return params, {}

    def cell_weights(run: Children, reduction: bool) -> Tensor | CellArch:
        kind = "reduce" if reduction else "normal"
        weights = torch.softmax(run.params[f"{ARCH_PREFIX}.{kind}"], dim=-1)
        if not (edge_normalization or aux_skip):
            return weights
        edges = (edge_softmax(run.params[f"{ARCH_PREFIX}.{kind}_edges"])
                 if edge_normalization else None)
        return CellArch(weights, edges, run.params.get(AUX_SKIP) if aux_skip else None)

    return stacked_network(
        "darts_search", cells, specs, stem_channels=stem, in_channels=in_channels,
        num_classes=num_classes, cell_arg=cell_weights, own_init=arch_init,
        primitives=list(names), steps=steps, multiplier=multiplier, layers=layers, C=c,
        stem_multiplier=stem_multiplier, partial_channels=partial_channels,
        edge_normalization=edge_normalization, aux_skip=aux_skip,
    )


def arch_weights(params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``{"normal": softmax(alpha_normal), "reduce": softmax(alpha_reduce)}`` from params,
    what derivation ranks. With edge logits (``edge_normalization``) each row is scaled by its
    edge's weight, ``softmax(alpha)[op] * edge_softmax(edges)[edge]``, as PC-DARTS derives."""
    weights = {}
    for kind in KINDS:
        w = torch.softmax(params[f"{ARCH_PREFIX}.{kind}"].detach(), dim=-1)
        edges = params.get(f"{ARCH_PREFIX}.{kind}_edges")
        weights[kind] = w if edges is None else w * edge_softmax(edges.detach())[:, None]
    return weights


__all__ = [
    "ARCH_PREFIX",
    "AUX_SKIP",
    "CellArch",
    "CellSpec",
    "arch_weights",
    "edge_inputs",
    "edge_softmax",
    "is_arch",
    "layout",
    "num_edges",
    "output_nodes",
    "preprocess",
    "search_cell",
    "search_network",
    "stacked_network",
]
