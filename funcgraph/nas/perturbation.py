"""DARTS-PT: the architecture chosen by perturbation instead of by the size of alpha (Wang,
Cheng, Chen, Tang and Hsieh, "Rethinking Architecture Selection in Differentiable NAS", ICLR
2021).

DARTS keeps on each edge the op of the largest ``softmax(alpha)``. Wang et al. show that
alpha's magnitude is a poor guide to what an op contributes to the supernet (skip connections
gain alpha while the supernet hardly depends on them: the collapse the skip cap guards
against) and measure the contribution instead: remove the op and see how much the supernet's
validation accuracy drops. :func:`perturbation_genotype` does that on a search supernet;
:func:`select_by_perturbation` is the same procedure over any ``score(arch) -> (accuracy,
loss)``, so it can be driven (and tested) without a network.

Removing op ``k`` of an edge sets its logit to :data:`REMOVED`: its softmax weight is then
exactly 0 (``exp`` underflows in float32 and float64) and the edge's other ops share the
weight as the softmax renormalises them; unlike ``-inf`` it can never make a row of nothing
but ``-inf``, whose softmax is NaN. (The authors' code multiplies the softmax weights by a
mask instead, which leaves the edge's total weight below 1; renormalising keeps the edge's
output at the scale the supernet was trained with.) A decided edge is one-hot: its op's logit
0, every other :data:`REMOVED`; a removed edge is one-hot on ``none``, whose output is zero.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_int
from ..errors import ArgumentTypeError, ConfigError, ShapeError
from ..model import Model
from ..params import Params, State
from .cell import ARCH_PREFIX, STEPS, edge_inputs, num_edges, output_nodes
from .genotype import NONE, SKIP, Edge, Genotype
from .ops import PRIMITIVES, Primitive, primitive_names

KINDS = ("normal", "reduce")
REMOVED = -1e9
"""The logit of a removed op: far below any trained logit, so its softmax weight is exactly 0."""

Score = tuple[float, float]
"""``(accuracy, mean loss)`` of the supernet under one architecture."""
ScoreFn = Callable[[Mapping[str, Tensor]], Score]
"""``score({"normal": logits (E, K), "reduce": logits (E, K)}) -> (accuracy, loss)``."""


def _harm(score: Score) -> tuple[float, float]:
    """Sort key of a removal by its score, the most harmful removal first: the lowest accuracy
    left, then the highest loss. One state's removals share a baseline, so the lowest accuracy
    is the largest drop and the highest loss the largest increase."""
    accuracy, loss = score
    return accuracy, -loss


class _Selection:
    """One selection in progress: the logits as decided so far, each edge's ops in order of
    preference (the first is its op) and each node's kept input rows."""

    def __init__(self, arch: Mapping[str, Tensor], score: ScoreFn, names: tuple[str, ...],
                 steps: int) -> None:
        self.score, self.names, self.steps = score, names, steps
        self.logits = {kind: arch[kind].detach().clone() for kind in KINDS}
        self.alpha = {kind: torch.softmax(self.logits[kind], -1) for kind in KINDS}
        self.edges = edge_inputs(steps)
        self.none = names.index(NONE) if NONE in names else None
        self.ranking: dict[str, dict[int, list[int]]] = {kind: {} for kind in KINDS}
        self.kept: dict[str, dict[int, list[int]]] = {kind: {} for kind in KINDS}

    def op(self, kind: str, row: int) -> int:
        return self.ranking[kind][row][0]

    def one_hot(self, kind: str, row: int, op: int) -> Tensor:
        values = torch.full_like(self.logits[kind][row], REMOVED)
        values[op] = 0.0
        return values

    def trial(self, kind: str, row: int, values: Tensor) -> Score:
        """The score of the current logits with row ``row`` of ``kind`` set to ``values``."""
        logits = self.logits[kind].clone()
        logits[row] = values
        return self.score({**self.logits, kind: logits})

    def choose_op(self, kind: str, row: int) -> None:
        """Rank the edge's non-``none`` ops by the harm of removing each (ties: the earlier
        primitive) and discretise the edge on the first; a single candidate is not scored."""
        ops = [k for k, name in enumerate(self.names) if name != NONE]
        if len(ops) > 1:
            harm: dict[int, tuple[float, float]] = {}
            for k in ops:
                values = self.logits[kind][row].clone()
                values[k] = REMOVED
                harm[k] = _harm(self.trial(kind, row, values))
            ops.sort(key=lambda k: (harm[k], k))
        self.ranking[kind][row] = ops
        self.logits[kind][row] = self.one_hot(kind, row, ops[0])

    def removal_keys(self, kind: str, rows: list[int]) -> dict[int, tuple[float, ...]]:
        """Sort keys of removing each edge of ``rows`` from the current cell, the most harmful
        first: by score with the edge one-hot on ``none``, or, in a space without ``none``, by
        the softmax weight of the edge's op (DARTS' rule). A single row is not scored."""
        if self.none is None:
            return {e: (-float(self.alpha[kind][e, self.op(kind, e)]),) for e in rows}
        if len(rows) == 1:
            return {rows[0]: ()}
        none = self.none
        return {e: _harm(self.trial(kind, e, self.one_hot(kind, e, none))) for e in rows}

    def choose_inputs(self, kind: str, node: int) -> None:
        """Keep the node's two inputs whose removal hurts most (ties: the earlier predecessor)
        and prune the others to ``none``. The node's edges are first restored to their ops, so
        this also re-chooses a node after the skip cap changed one of its ops."""
        rows = [e for e, (n, _) in enumerate(self.edges) if n == node]
        for e in rows:
            self.logits[kind][e] = self.one_hot(kind, e, self.op(kind, e))
        keep = rows
        if len(rows) > 2:
            keys = self.removal_keys(kind, rows)
            keep = sorted(sorted(rows, key=lambda e: (keys[e], e))[:2])
        if self.none is not None:
            for e in rows:
                if e not in keep:
                    self.logits[kind][e] = self.one_hot(kind, e, self.none)
        self.kept[kind][node] = keep

    def cap_skips(self, kind: str, cap: int, where: str) -> None:
        """While the cell keeps more than ``cap`` skips, strike off the weakest (its removal
        hurts least; ties: the earlier edge): its edge takes its next op, its node its inputs
        again."""
        if SKIP not in self.names:
            return
        skip = self.names.index(SKIP)
        while True:
            skips = [e for rows in self.kept[kind].values() for e in rows
                     if self.op(kind, e) == skip]
            if len(skips) <= cap:
                return
            keys = self.removal_keys(kind, skips)
            weakest = max(skips, key=lambda e: (keys[e], -e))
            ranking = self.ranking[kind][weakest]
            ranking.remove(skip)
            if not ranking:
                raise ConfigError(
                    f"{where}: edge {weakest} of the {kind} cell has no op left once "
                    f"'{SKIP}' is struck off for skip_cap={cap}; primitives {list(self.names)}")
            self.choose_inputs(kind, self.edges[weakest][0])

    def cell(self, kind: str) -> tuple[Edge, ...]:
        return tuple((self.names[self.op(kind, e)], self.edges[e][1])
                     for node in sorted(self.kept[kind]) for e in self.kept[kind][node])


def _select(arch: Mapping[str, Tensor], score: ScoreFn, names: tuple[str, ...], steps: int,
            multiplier: int | None, skip_cap: int | None, where: str) -> Genotype:
    """:func:`select_by_perturbation` over the op names of a checked space."""
    concat = output_nodes(steps, multiplier, where=where)
    if skip_cap is not None:
        check_int(where, "skip_cap", skip_cap, minimum=0)
    if not isinstance(arch, Mapping) or any(kind not in arch for kind in KINDS):
        got = sorted(arch) if isinstance(arch, Mapping) else type(arch).__name__
        raise ConfigError(f"{where}: arch must hold the logits 'normal' and 'reduce', got {got}")
    want = (num_edges(steps), len(names))
    for kind in KINDS:
        if not isinstance(arch[kind], Tensor):
            raise ArgumentTypeError(f"{where}: arch[{kind!r}] must be a Tensor, got "
                                    f"{type(arch[kind]).__name__}")
        if tuple(arch[kind].shape) != want or not arch[kind].is_floating_point():
            raise ShapeError(f"{where}: arch[{kind!r}] must be float logits {want} (edges x "
                             f"ops of {list(names)}), got {arch[kind].dtype} "
                             f"{tuple(arch[kind].shape)}")
    selection = _Selection(arch, score, names, steps)
    for row in range(num_edges(steps)):
        for kind in KINDS:
            selection.choose_op(kind, row)
    for node in range(2, 2 + steps):
        for kind in KINDS:
            selection.choose_inputs(kind, node)
    if skip_cap is not None:
        for kind in KINDS:
            selection.cap_skips(kind, skip_cap, where)
    return Genotype(selection.cell("normal"), concat, selection.cell("reduce"), concat)


def select_by_perturbation(
    arch: Mapping[str, Tensor],
    score: ScoreFn,
    *,
    primitives: Sequence[Primitive] = PRIMITIVES,
    steps: int = STEPS,
    multiplier: int | None = None,
    skip_cap: int | None = None,
) -> Genotype:
    """The genotype DARTS-PT selects from the logits ``arch`` (``{"normal": (E, K), "reduce":
    (E, K)}``, column ``k`` op ``k`` of ``primitives``), where ``score(arch) -> (accuracy,
    loss)`` evaluates the supernet under those logits. ``arch`` is not modified. ``steps``
    and ``multiplier`` are the supernet's cells', as in :func:`~funcgraph.nas.derive_genotype`.

    1. Operations, progressively: edge by edge in row order (on each row the normal cell, then
       the reduction cell), score the supernet with each non-``none`` op of the edge removed;
       the edge takes the op whose removal lowers accuracy most (ties: the one whose removal
       raises the loss most, then the earlier primitive) and is discretised (one-hot on it)
       before later edges are scored, so later choices see the earlier ones.
    2. Topology, progressively: node by node, score the supernet with each incoming edge
       removed (one-hot on ``none``) and keep the two whose removal lowers accuracy most (ties:
       loss, then the earlier predecessor); the node's other edges are pruned to ``none``
       before later nodes are scored. A node of two inputs keeps both.
    3. ``skip_cap`` (P-DARTS, as in :func:`~funcgraph.nas.derive_genotype`), per cell: while
       the cell keeps more skip connections than the cap, the weakest kept skip, the one whose
       removal from the cell as it now stands lowers accuracy least (ties: the smaller loss
       increase, then the earlier edge), is struck off: its edge takes its next op in step 1's
       ranking and its node chooses its inputs again as in step 2 (other nodes are not
       revisited). A space without ``skip_connect`` has nothing to cap.

    In a space without ``none`` an edge cannot be removed (every op outputs something), so
    steps 2 and 3 fall back to DARTS' rule: edges rank by the ``softmax(arch)`` weight of
    their chosen op (ties: the earlier predecessor), the weakest skip is the one of the
    smallest weight (ties: the earlier edge), and only step 1 scores.

    Departures from the paper: edges and nodes are decided in row order, not in a random
    one (deterministic); and the paper fine-tunes the supernet for a few epochs after every
    decision, which this does not (there is no budget for it on a CPU): every score is of
    the supernet's weights as the search left them.

    Cost, in calls to ``score``: one per non-``none`` op of each edge of both cells (none when
    an edge has a single candidate), plus one per input of each node of more than two inputs
    (none without ``none`` in the space): ``2 * (14 * 7 + 3 + 4 + 5) = 220`` in DARTS' space;
    the skip cap adds, per struck skip, one per kept skip of its cell (when more than one)
    and one per input of its node (when more than two).
    """
    names = primitive_names(primitives, where="select_by_perturbation")
    return _select(arch, score, names, steps, multiplier, skip_cap, "select_by_perturbation")


def _accuracy_and_loss(model: Model, params: Params, state: State, x: Tensor, y: Tensor,
                       batch_size: int) -> Score:
    """Accuracy and mean cross-entropy of ``model`` on ``(x, y)`` in one pass: chunks of
    ``batch_size`` with batch-norm statistics of each chunk, as
    ``supernet_accuracy(..., batch_stats=True)`` measures it (state left unchanged)."""
    correct, loss = 0, 0.0
    with torch.no_grad():
        for s in range(0, x.shape[0], batch_size):
            logits, _ = model.apply(params, state, x[s:s + batch_size], train=True)
            labels = y[s:s + batch_size]
            correct += int((logits.argmax(-1) == labels).sum())
            loss += float(F.cross_entropy(logits, labels, reduction="sum"))
    return correct / x.shape[0], loss / x.shape[0]


def perturbation_genotype(
    model: Model,
    params: Params,
    state: State,
    x: Tensor,
    y: Tensor,
    *,
    primitives: Sequence[Primitive] | None = None,
    skip_cap: int | None = None,
    batch_size: int = 256,
) -> Genotype:
    """The genotype DARTS-PT selects on the search supernet ``model``
    (:func:`~funcgraph.nas.search_network`) with ``params`` (weights and architecture
    merged) and batch-norm ``state``, scored on the validation half ``(x, y)``:
    :func:`select_by_perturbation` (its docstring has the procedure, the fallback for a space
    without ``none`` and the cost) with ``score`` the supernet's accuracy and mean
    cross-entropy on ``(x, y)``, in chunks of ``batch_size`` with batch statistics, as
    :func:`~funcgraph.nas.supernet_accuracy` with ``batch_stats=True`` measures it.

    Only ``arch.normal`` and ``arch.reduce`` are perturbed; every other entry of ``params``
    (weights, and architecture entries such as PC-DARTS' edge logits) goes to the supernet
    as it is. ``params`` and ``state`` are not modified. ``primitives`` defaults to the
    supernet's space (``model.meta["primitives"]``); given, it must name the same ops. The
    cells' nodes and output nodes are the supernet's (``meta["steps"]``, ``meta["multiplier"]``).
    Cost: 220 passes over ``(x, y)`` in DARTS' space, plus the skip cap's.
    """
    where = "perturbation_genotype"
    if not isinstance(model, Model):
        raise ArgumentTypeError(f"{where}: model must be the search supernet (a Model from "
                                f"search_network), got {type(model).__name__}")
    space, steps = model.meta.get("primitives"), model.meta.get("steps")
    if space is None or steps is None:
        raise ConfigError(f"{where}: model {model.name!r} is not a search supernet (no "
                          "meta['primitives'] and meta['steps']); build it with search_network")
    names = tuple(space)
    given = names if primitives is None else primitive_names(primitives, where=where)
    if given != names:
        raise ConfigError(f"{where}: primitives {list(given)} are not the supernet's ops "
                          f"{list(names)}")
    missing = [f"{ARCH_PREFIX}.{kind}" for kind in KINDS if f"{ARCH_PREFIX}.{kind}" not in params]
    if missing:
        raise ConfigError(f"{where}: params lack {missing}; pass the full params, weights and "
                          "architecture merged ({**weights, **arch})")
    if x.dim() != 4 or y.shape != (x.shape[0],) or x.shape[0] == 0:
        raise ShapeError(f"{where}: expected x (N, C, H, W) with labels y (N,), N >= 1, got "
                         f"{tuple(x.shape)} and {tuple(y.shape)}")
    check_int(where, "batch_size", batch_size)

    def score(arch: Mapping[str, Tensor]) -> Score:
        trial = {**params, **{f"{ARCH_PREFIX}.{kind}": arch[kind] for kind in KINDS}}
        return _accuracy_and_loss(model, trial, state, x, y, batch_size)

    arch = {kind: params[f"{ARCH_PREFIX}.{kind}"] for kind in KINDS}
    return _select(arch, score, names, steps, model.meta.get("multiplier"), skip_cap, where)


__all__ = ["REMOVED", "Score", "ScoreFn", "perturbation_genotype", "select_by_perturbation"]
