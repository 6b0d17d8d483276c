"""Genotypes: the discrete architecture read off the architecture weights, and its JSON form.

Derivation follows DARTS: for each intermediate node keep the two incoming edges (from distinct
predecessors) whose strongest non-``none`` op weighs most, and on each kept edge that op.
Ties go to the lower index (the earlier predecessor, the earlier primitive), so derivation is
deterministic. A node's two edges are listed lower input first (``edge_order="input"``) or,
as DARTS' own code lists them, stronger edge first (``"strength"``): the same cell either way.
``skip_cap`` bounds skip connections per cell the P-DARTS way: while the cell has too many,
the weakest chosen skip is struck off and the cell is derived again.

The JSON form mirrors DARTS' ``Genotype`` namedtuple::

    {"normal": [["sep_conv_3x3", 0], ["skip_connect", 1], ...],   # 2 per node, (op, input)
     "normal_concat": [2, 3, 4, 5], "reduce": [...], "reduce_concat": [2, 3, 4, 5]}

A genotype names its ops; the search space maps the names to ops. Every function here takes
the space as ``primitives`` (op names and ``(name, factory)`` pairs, DARTS' eight ops by
default); parsing without a space accepts every known op (built-in or registered).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from .. import random
from ..errors import ConfigError, ShapeError
from .cell import STEPS, num_edges, output_nodes
from .ops import PRIMITIVES, Primitive, known_ops, primitive_names

SKIP = "skip_connect"
NONE = "none"

Edge = tuple[str, int]
"""``(op name, input node)`` of one chosen edge; nodes 0 and 1 are the cell inputs."""
EdgeOrder = Literal["input", "strength"]
"""How a node's two edges are listed: lower input first, or stronger edge first (DARTS' code)."""
EDGE_ORDERS = ("input", "strength")


@dataclass(frozen=True)
class Genotype:
    """A discrete architecture: ``2 * steps`` edges per cell kind and the concatenated nodes."""

    normal: tuple[Edge, ...]
    normal_concat: tuple[int, ...]
    reduce: tuple[Edge, ...]
    reduce_concat: tuple[int, ...]

    def skips(self, kind: str = "normal") -> int:
        """Number of skip connections in the ``normal`` or ``reduce`` cell."""
        return sum(op == SKIP for op, _ in getattr(self, kind))

    def to_dict(self) -> dict[str, Any]:
        return {
            "normal": [list(e) for e in self.normal],
            "normal_concat": list(self.normal_concat),
            "reduce": [list(e) for e in self.reduce],
            "reduce_concat": list(self.reduce_concat),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "genotype",
                  primitives: Sequence[Primitive] | None = None) -> Genotype:
        """Parse and validate; a malformed genotype is a :class:`ConfigError` naming the field.
        Ops must be of the space ``primitives`` (default: any known op) and not ``none``."""
        space = known_ops() if primitives is None else primitive_names(primitives, where=where)
        allowed = [op for op in space if op != NONE]
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: expected a JSON object, got {type(data).__name__}")
        fields: dict[str, Any] = {}
        for kind in ("normal", "reduce"):
            edges = data.get(kind)
            if not isinstance(edges, list) or not edges or len(edges) % 2:
                raise ConfigError(
                    f"{where}.{kind}: expected a non-empty list of [op, input] pairs, two per "
                    f"node, got {edges!r}"
                )
            parsed: list[Edge] = []
            for i, edge in enumerate(edges):
                at = f"{where}.{kind}[{i}]"
                if not (isinstance(edge, list | tuple) and len(edge) == 2):
                    raise ConfigError(f"{at}: expected [op, input], got {edge!r}")
                op, j = edge
                if op not in allowed:
                    raise ConfigError(f"{at}: unknown op {op!r}; expected one of {allowed}")
                node = 2 + i // 2
                if not isinstance(j, int) or isinstance(j, bool) or not 0 <= j < node:
                    raise ConfigError(f"{at}: input of node {node} must be an int in "
                                      f"[0, {node}), got {j!r}")
                parsed.append((op, j))
            last_node = 1 + len(parsed) // 2
            concat = data.get(f"{kind}_concat", list(range(2, last_node + 1)))
            if not (isinstance(concat, list) and concat and all(
                isinstance(n, int) and 2 <= n <= last_node for n in concat
            )):
                raise ConfigError(f"{where}.{kind}_concat: expected a list of node indices in "
                                  f"[2, {last_node}], got {concat!r}")
            fields[kind] = tuple(parsed)
            fields[f"{kind}_concat"] = tuple(concat)
        return cls(**fields)

    @classmethod
    def load(cls, path: str | Path, *, primitives: Sequence[Primitive] | None = None
             ) -> Genotype:
        """Read a genotype JSON file of the space ``primitives`` (default: any known op); a
        missing or malformed file is a :class:`ConfigError`."""
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"genotype file {p} not found")
        try:
            data = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"genotype file {p} is not valid JSON: {e}") from None
        return cls.from_dict(data, where=str(p), primitives=primitives)


def derive_cell(
    weights: Tensor,
    *,
    primitives: Sequence[Primitive] = PRIMITIVES,
    steps: int = STEPS,
    skip_cap: int | None = None,
    edge_order: EdgeOrder = "input",
) -> list[Edge]:
    """The ``2 * steps`` edges of one cell from its weights ``(num_edges, num_ops)``.

    Weights may be logits or softmax values (only their order matters within a row; across
    rows DARTS compares softmax values, so pass those). ``skip_cap`` limits skip connections.
    Column ``k`` is op ``k`` of the space ``primitives``; the edges name those ops.
    ``edge_order`` lists each node's two edges lower input first (``"input"``) or stronger
    edge first (``"strength"``, the order of DARTS' ``genotype()``); the cell is the same,
    only the listing (and so the discrete network's param names) differs.
    """
    names = primitive_names(primitives, where="derive_cell")
    if edge_order not in EDGE_ORDERS:
        raise ConfigError(f"derive_cell: edge_order must be one of {list(EDGE_ORDERS)}, got "
                          f"{edge_order!r}")
    if weights.shape != (num_edges(steps), len(names)):
        raise ShapeError(f"derive_cell: expected weights ({num_edges(steps)}, {len(names)}),"
                         f" got {tuple(weights.shape)}")
    if NONE in names:
        none = names.index(NONE)
        weights = weights.clone()
        weights[:, none] = -torch.inf
    if skip_cap is None or SKIP not in names:
        return _top2(weights, names, steps, edge_order)
    skip = names.index(SKIP)
    weights = weights.clone()
    while True:
        cell = _top2(weights, names, steps, edge_order)
        chosen = [e for e, (op, _) in zip(_chosen_rows(cell, steps), cell, strict=True)
                  if op == SKIP]
        if len(chosen) <= skip_cap:
            return cell
        weakest = min(chosen, key=lambda e: (float(weights[e, skip]), e))
        weights[weakest, skip] = -torch.inf


def _top2(weights: Tensor, primitives: Sequence[str], steps: int,
          edge_order: EdgeOrder) -> list[Edge]:
    cell: list[Edge] = []
    start = 0
    w = weights.tolist()
    for i in range(steps):
        rows = range(start, start + 2 + i)
        strength = {e: max(w[e]) for e in rows}
        # stable sort on -strength: ties keep the lower predecessor
        best = sorted(rows, key=lambda e: -strength[e])[:2]
        for e in sorted(best) if edge_order == "input" else best:
            row = w[e]
            k = max(range(len(primitives)), key=lambda k: (row[k], -k))
            if w[e][k] == -float("inf"):
                raise ConfigError(
                    f"derive_cell: edge {e} has no admissible op: every weight is -inf once "
                    f"'none' and any skips over skip_cap are struck off; primitives "
                    f"{list(primitives)}"
                )
            cell.append((primitives[k], e - start))
        start += 2 + i
    return cell


def _chosen_rows(cell: list[Edge], steps: int) -> list[int]:
    """Weight-row index of every chosen edge (node offset plus input)."""
    offsets = [sum(2 + k for k in range(i)) for i in range(steps)]
    return [offsets[n // 2] + j for n, (_, j) in enumerate(cell)]


def derive_genotype(
    weights: Mapping[str, Tensor],
    *,
    primitives: Sequence[Primitive] = PRIMITIVES,
    steps: int = STEPS,
    multiplier: int | None = None,
    skip_cap: int | None = None,
    edge_order: EdgeOrder = "input",
) -> Genotype:
    """A genotype from ``{"normal": (E, K), "reduce": (E, K)}`` softmax weights
    (:func:`funcgraph.nas.arch_weights` gives them from params). ``skip_cap`` applies to both
    cells. ``steps`` and ``multiplier`` are the supernet's: its cells concatenate their last
    ``multiplier`` nodes (:func:`~funcgraph.nas.cell.output_nodes`; None: all ``steps``), and
    so do the genotype's. ``edge_order`` (:func:`derive_cell`): ``"input"`` lists each node's
    edges lower input first, ``"strength"`` stronger edge first, as DARTS' code does."""
    concat = output_nodes(steps, multiplier, where="derive_genotype")
    cells = {kind: tuple(derive_cell(weights[kind], primitives=primitives, steps=steps,
                                     skip_cap=skip_cap, edge_order=edge_order))
             for kind in ("normal", "reduce")}
    return Genotype(cells["normal"], concat, cells["reduce"], concat)


def random_genotype(
    key: Tensor, *, primitives: Sequence[Primitive] = PRIMITIVES, steps: int = STEPS
) -> Genotype:
    """A uniformly random architecture of the space ``primitives``: for every node two
    distinct predecessors and, on each, a non-``none`` op (the baseline DARTS is compared
    against)."""
    ops = [p for p in primitive_names(primitives, where="random_genotype") if p != NONE]
    cells: dict[str, tuple[Edge, ...]] = {}
    for c, kind in enumerate(("normal", "reduce")):
        edges: list[Edge] = []
        for i in range(steps):
            k_in, k_op = random.split(random.fold_in(key, 2 * i + c * 2 * steps))
            inputs = sorted(random.choice(k_in, 2 + i, 2).tolist())
            picks = random.randint(k_op, (2,), 0, len(ops)).tolist()
            edges += [(ops[p], j) for p, j in zip(picks, inputs, strict=True)]
        cells[kind] = tuple(edges)
    concat = output_nodes(steps, where="random_genotype")
    return Genotype(cells["normal"], concat, cells["reduce"], concat)


__all__ = ["EDGE_ORDERS", "Edge", "EdgeOrder", "Genotype", "derive_cell", "derive_genotype",
           "random_genotype"]
