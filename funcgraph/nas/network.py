"""The discrete network a genotype describes: what ``funcgraph train --genotype`` trains.

Each cell keeps only the genotype's ops (two per node, affine batch norm), the stack has the
same layout as the search network (reductions at 1/3 and 2/3 of depth), and an optional
drop-path (scheduled drop of whole op outputs per example, as DARTS' evaluation uses) draws
its masks from the key. The genotype names its ops; ``primitives``, the search space (op names
and ``(name, factory)`` pairs), maps the names to ops, by default every known op.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from .. import random
from ..errors import ConfigError, KeyMissingError
from ..model import Model
from ..nn import Children, composite
from .cell import layout, preprocess, stacked_network
from .genotype import Edge, Genotype
from .ops import Primitive, make_op


def drop_path(x: Tensor, drop_prob: float, key: Tensor) -> Tensor:
    """Zero whole examples of ``x (B, ...)`` with probability ``drop_prob``, scaling the rest."""
    keep = 1.0 - drop_prob
    mask = random.bernoulli(key, keep, (x.shape[0],) + (1,) * (x.dim() - 1))
    return torch.where(mask, x / keep, torch.zeros_like(x))


def discrete_cell(
    edges: tuple[Edge, ...],
    concat: tuple[int, ...],
    c_prev_prev: int,
    c_prev: int,
    c: int,
    *,
    reduction: bool,
    reduction_prev: bool,
    drop_prob: float = 0.0,
    primitives: Sequence[Primitive] | None = None,
) -> Model:
    """One genotype cell, its ops from the space ``primitives`` (default every known op).
    Input ``(s0, s1, None)``; output ``(B, len(concat) * c, H', W')``."""
    children: dict[str, Model] = {
        "preprocess0": preprocess(c_prev_prev, c, halve=reduction_prev, affine=True),
        "preprocess1": preprocess(c_prev, c, halve=False, affine=True),
    }
    for e, (op, j) in enumerate(edges):
        stride = 2 if reduction and j < 2 else 1
        children[f"ops.{e}"] = make_op(op, c, stride, affine=True, primitives=primitives)

    def forward(run: Children, inputs: tuple[Tensor, Tensor, None]) -> Tensor:
        s0, s1, _ = inputs
        states = [run("preprocess0", s0), run("preprocess1", s1)]
        dropping = run.train and drop_prob > 0.0
        if dropping and run.own_key is None:
            raise KeyMissingError(
                "discrete_cell: drop_path in training needs a key; pass "
                "key=funcgraph.random.key(seed) to apply, or drop_path_prob=0"
            )
        for node in range(len(edges) // 2):
            total = None
            for e in (2 * node, 2 * node + 1):
                op, j = edges[e]
                h = run(f"ops.{e}", states[j])
                if dropping and not (op == "skip_connect" and h.shape == states[j].shape):
                    assert run.own_key is not None
                    h = drop_path(h, drop_prob, random.fold_in(run.own_key, e))
                total = h if total is None else total + h
            assert total is not None
            states.append(total)
        return torch.cat([states[n] for n in concat], dim=1)

    return composite("cell", children, forward, reduction=reduction,
                     out_channels=len(concat) * c)


def network_from_genotype(
    genotype_or_path: Genotype | str | Path,
    *,
    C: int,
    layers: int,
    num_classes: int,
    in_channels: int = 1,
    stem_multiplier: int = 3,
    drop_path_prob: float = 0.0,
    primitives: Sequence[Primitive] | None = None,
) -> Model:
    """The discrete DARTS network: ``x (B, in_channels, H, W) -> logits (B, num_classes)``.

    Arguments:
        genotype_or_path: a :class:`Genotype` or the path of a genotype JSON file.
        C: initial cell width (doubled at each of the two reductions).
        layers: number of cells.
        num_classes: classifier outputs.
        in_channels: input image channels (1 for glyphs).
        stem_multiplier: stem width is ``stem_multiplier * C``.
        drop_path_prob: per-example probability of dropping an op output in training (needs
            a key); identity ops are never dropped.
        primitives: the search space the genotype's op names refer to (op names and
            ``(name, factory)`` pairs); default: every built-in and registered op.

    Example::

        model = network_from_genotype("run/genotype.json", C=16, layers=8, num_classes=10)
        params, state = model.init(funcgraph.random.key(0))
    """
    if isinstance(genotype_or_path, Genotype):
        genotype = Genotype.from_dict(genotype_or_path.to_dict(), where="network_from_genotype",
                                      primitives=primitives)
    else:
        genotype = Genotype.load(genotype_or_path, primitives=primitives)
    if not 0.0 <= drop_path_prob < 1.0:
        raise ConfigError(f"network_from_genotype: drop_path_prob must be in [0, 1), "
                          f"got {drop_path_prob}")
    if len(genotype.normal_concat) != len(genotype.reduce_concat):
        raise ConfigError("network_from_genotype: normal_concat and reduce_concat must have the "
                          "same length (the stack's channel bookkeeping assumes it)")
    stem, specs = layout(C, layers, stem_multiplier=stem_multiplier,
                         multiplier=len(genotype.normal_concat))
    cells = [
        discrete_cell(
            genotype.reduce if s.reduction else genotype.normal,
            genotype.reduce_concat if s.reduction else genotype.normal_concat,
            s.c_prev_prev, s.c_prev, s.c, reduction=s.reduction,
            reduction_prev=s.reduction_prev, drop_prob=drop_path_prob, primitives=primitives,
        )
        for s in specs
    ]
    return stacked_network(
        "darts_network", cells, specs, stem_channels=stem, in_channels=in_channels,
        num_classes=num_classes, cell_arg=lambda run, reduction: None,
        genotype=genotype.to_dict(), C=C, layers=layers,
    )


__all__ = ["discrete_cell", "drop_path", "network_from_genotype"]
