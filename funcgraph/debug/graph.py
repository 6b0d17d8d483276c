"""Executed-graph capture: the ops one call actually ran, grouped by parameter prefix.

``capture(fn, *args)`` runs ``fn`` once under a dispatch mode and returns a :class:`Graph`: one
:class:`Node` per ATen op that consumed an activation, with the shapes, the parameters that fed
it, the nodes it read from and its *block*, a dotted prefix such as ``"layer1.0.conv1"``.
Because only what ran is recorded, a Python ``if``, a ``torch.cond``, a dropped stochastic-depth
block or an early exit shows up as exactly the path taken; :func:`diff` compares two captures.

How blocks are assigned:

* Flat ``dict[str, Tensor]`` arguments (params, state) name their tensors. Tensors computed
  only from named tensors, constants or integer inputs (random keys) are *auxiliary*: they are
  not nodes, but remember which names they came from (``weight.t()`` still names ``fc.weight``).
* An op that reads an activation becomes a node. Inside a model built with
  :func:`funcgraph.nn.composite` (every funcgraph combinator and reference model), its block
  is the path of children being run when it executed, read from the call stack
  (``layer1`` -> ``0`` -> ``body`` -> ``bn1``), so parameter-free ops (batch-norm statistics, a
  ``relu``, a shortcut) land exactly in their child; parameters a composite owns itself
  (``own_init``) refine that path to their module path.
* Elsewhere (a plain function, ``from_module``) the block comes from parameter names: the
  common module path of the parameters feeding the op (``layer1.0.conv1.weight`` ->
  ``layer1.0.conv1``); an op without parameters joins the scope of its most recently produced
  activation input: the parent of that producer's block when the producer used parameters
  (the relu after ``layer1.0.bn1`` lands in ``layer1.0``), else the producer's block.

Every algorithm here is a loop (no recursion), so graphs of thousands of blocks are fine.
Capture is meant for eager calls; under ``vmap``/``grad`` use :func:`funcgraph.debug.trace`.
"""

from __future__ import annotations

import difflib
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from ..checks import check_int
from ..nn.compose import Children, composite
from .trace import OpMode, op_name

_CHILD_CALL = Children.__call__.__code__
_COMPOSITE_APPLY = next(
    (c for c in composite.__code__.co_consts
     if isinstance(c, types.CodeType) and c.co_name == "apply"),
    None,
)


def composite_scope() -> str | None:
    """The dotted path of :func:`~funcgraph.nn.composite` children running now, from the call
    stack (``"layer1.0.body.bn1"``); ``""`` at a composite's top level; ``None`` outside any
    composite model."""
    names: list[str] = []
    inside = False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _CHILD_CALL:
            names.append(str(frame.f_locals["name"]))
        elif frame.f_code is _COMPOSITE_APPLY:
            inside = True
        frame = frame.f_back  # type: ignore[assignment]
    return ".".join(reversed(names)) if inside or names else None


@dataclass(frozen=True)
class Node:
    """One executed op (or, after :meth:`Graph.collapse`, a run of ops of one block).

    Attributes:
        id: position in execution order (inputs first).
        op: op name without the ``aten.`` prefix; ``"input"`` for graph inputs,
            ``"cond[true]"``/``"cond[false]"`` for the branch a ``torch.cond`` took.
        block: dotted block prefix, ``""`` for the top level.
        params: names of the parameters/state that fed the op.
        in_shapes / out_shapes: shapes of the tensor inputs / outputs.
        inputs: ids of the nodes whose outputs it read.
        count: how many ops a collapsed node stands for (1 otherwise).
    """

    id: int
    op: str
    block: str
    params: tuple[str, ...] = ()
    in_shapes: tuple[tuple[int, ...], ...] = ()
    out_shapes: tuple[tuple[int, ...], ...] = ()
    inputs: tuple[int, ...] = ()
    count: int = 1

    def signature(self) -> tuple[str, str, tuple[tuple[int, ...], ...]]:
        """What :func:`diff` compares: op, block and output shapes."""
        return (self.op, self.block, self.out_shapes)


def block_path(block: str) -> list[str]:
    """The enclosing blocks of ``block``, outermost first: ``"a.b"`` -> ``["a", "a.b"]``."""
    parts = block.split(".") if block else []
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


def _within(block: str, scope: str) -> bool:
    return not scope or block == scope or block.startswith(scope + ".")


def _common_prefix(names: list[str]) -> str:
    paths = [n.split(".") for n in names]
    common: list[str] = []
    for parts in zip(*paths, strict=False):
        if any(p != parts[0] for p in parts):
            break
        common.append(parts[0])
    return ".".join(common)


@dataclass(frozen=True)
class Graph:
    """A captured graph: ``nodes`` in execution order and the ids producing the ``outputs``."""

    nodes: tuple[Node, ...]
    outputs: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.nodes)

    def ops(self) -> list[str]:
        """Op names in execution order (inputs excluded)."""
        return [n.op for n in self.nodes if n.op != "input"]

    def blocks(self) -> list[str]:
        """Every block prefix that ran, with its enclosing blocks, in first-execution order."""
        seen: dict[str, None] = {}
        for node in self.nodes:
            for b in block_path(node.block):
                seen.setdefault(b, None)
        return list(seen)

    def collapse(self, depth: int) -> Graph:
        """Merge each consecutive run of ops inside one block of ``depth`` levels into one node.

        ``depth=1`` shows ``layer1``, ``layer2``...; ``depth=2`` shows ``layer1.0``... Ops
        above that depth stay as they are. A block executed several times (a loop, a shared
        cell) gives one node per run, so the result stays acyclic.
        """
        check_int("Graph.collapse", "depth", depth, minimum=0)
        new_id: dict[int, int] = {}
        groups: list[list[Node]] = []
        keys: list[str | None] = []
        for node in self.nodes:
            parts = node.block.split(".") if node.block else []
            key = ".".join(parts[:depth]) if depth and len(parts) >= depth else None
            if key is not None and keys and keys[-1] == key:
                groups[-1].append(node)
            else:
                groups.append([node])
                keys.append(key)
        nodes: list[Node] = []
        for gid, (group, key) in enumerate(zip(groups, keys, strict=True)):
            members = {n.id for n in group}
            for n in group:
                new_id[n.id] = gid
            if key is None:
                n = group[0]
                ins = tuple(dict.fromkeys(new_id[i] for i in n.inputs))
                nodes.append(Node(gid, n.op, n.block, n.params, n.in_shapes, n.out_shapes, ins))
                continue
            external = [i for n in group for i in n.inputs if i not in members]
            params = tuple(dict.fromkeys(p for n in group for p in n.params))
            nodes.append(Node(
                gid, "block", key, params, group[0].in_shapes, group[-1].out_shapes,
                tuple(dict.fromkeys(new_id[i] for i in external)), sum(n.count for n in group),
            ))
        return Graph(tuple(nodes), tuple(dict.fromkeys(new_id[i] for i in self.outputs)))


@dataclass
class _Aux:
    """A tensor computed without activations: the names of the params it derives from."""

    names: tuple[str, ...]


@dataclass
class _Act:
    """An activation: the node that produced it and the scope its consumers inherit."""

    node: int
    scope: str


class _Capture(OpMode):
    def __init__(self, named: Mapping[int, str], hide_views: bool) -> None:
        super().__init__()
        self.named = named
        self.hide_views = hide_views
        self.nodes: list[Node] = []
        self.info: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.keep: list[Tensor] = []  # graph inputs stay alive so their ids stay theirs

    def add_input(self, t: Tensor) -> None:
        if t.is_floating_point() or t.is_complex():
            node = Node(len(self.nodes), "input", "", (), (), (tuple(t.shape),))
            self.nodes.append(node)
            self.info[t] = _Act(node.id, "")
        else:
            self.info[t] = _Aux(())
        self.keep.append(t)

    def _classify(self, t: Tensor) -> _Aux | _Act:
        found = self.info.get(t)
        if found is not None:
            return found
        name = self.named.get(id(t))
        return _Aux((name,) if name is not None else ())

    def _emit(self, op: str, ins: list[Tensor], outs: list[Tensor]) -> int | None:
        kinds = [self._classify(t) for t in ins]
        acts = [k for k in kinds if isinstance(k, _Act)]
        names = tuple(dict.fromkeys(n for k in kinds if isinstance(k, _Aux) for n in k.names))
        if not acts:
            for t in outs:
                self.info[t] = _Aux(names)
            return None
        latest = max(acts, key=lambda a: a.node)
        block = _common_prefix([_parent(n) for n in names]) if names else latest.scope
        scope = composite_scope()
        if scope is not None and not (names and _within(block, scope)):
            block = scope
        node = Node(
            id=len(self.nodes),
            op=op.removeprefix("aten."),
            block=block,
            params=names,
            in_shapes=tuple(tuple(t.shape) for t in ins),
            out_shapes=tuple(tuple(t.shape) for t in outs),
            inputs=tuple(dict.fromkeys(a.node for a in acts)),
        )
        self.nodes.append(node)
        scope = _parent(block) if names else block
        for t in outs:
            self.info[t] = _Act(node.id, scope)
        return node.id

    def on_op(self, func: Any, args: Any, kwargs: Any, out: Any, elapsed: float) -> None:
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, Tensor)]
        is_view = isinstance(func, torch._ops.OpOverload) and (
            func.is_view or func is torch.ops.aten._unsafe_view.default
        )
        if self.hide_views and is_view and len(ins) == 1 and len(outs) == 1:
            self.info[outs[0]] = self._classify(ins[0])
            return
        self._emit(op_name(func), ins, outs)

    def on_cond(self, taken: bool, pred: Tensor) -> None:
        self._emit(f"cond[{str(taken).lower()}]", [pred], [])


def _named_tensors(args: Any, names: Mapping[str, Tensor] | None) -> dict[int, str]:
    dicts: list[Mapping[str, Tensor]] = [names] if names is not None else [
        a for a in args
        if isinstance(a, Mapping) and a and all(isinstance(v, Tensor) for v in a.values())
    ]
    return {id(t): n for d in dicts for n, t in d.items()}


def capture(
    fn: Callable[..., Any],
    *args: Any,
    names: Mapping[str, Tensor] | None = None,
    hide_views: bool = True,
    **kwargs: Any,
) -> Graph:
    """Run ``fn(*args, **kwargs)`` once and return the graph of what executed.

    Arguments:
        fn: any function of tensors, e.g. ``model.apply`` or ``bind(model, state)``.
        *args: its positional arguments. Flat ``dict[str, Tensor]`` arguments (params,
            state) name their tensors; other floating tensors become ``input`` nodes.
        **kwargs: its keyword arguments, treated alike.
        names: name the tensors from this dict instead of from the arguments.
        hide_views: fold view ops (``view``, ``t``, ``expand``...) into their input.

    Example::

        g = capture(model.apply, params, state, x)
        print(render.text(g.collapse(2)))
    """
    mode = _Capture(_named_tensors(args, names), hide_views)
    named_ids = set(mode.named)
    for t in tree_leaves((args, kwargs)):
        if isinstance(t, Tensor) and id(t) not in named_ids:
            mode.add_input(t)
    with mode:
        out = fn(*args, **kwargs)
    outputs = []
    for t in tree_leaves(out):
        info = mode.info.get(t) if isinstance(t, Tensor) else None
        if isinstance(info, _Act):
            outputs.append(info.node)
    return Graph(tuple(mode.nodes), tuple(dict.fromkeys(outputs)))


@dataclass(frozen=True)
class GraphDiff:
    """Ops and blocks present in one graph and not the other (aligned in execution order)."""

    only_a: tuple[Node, ...] = field(default=())
    only_b: tuple[Node, ...] = field(default=())
    blocks_only_a: tuple[str, ...] = ()
    blocks_only_b: tuple[str, ...] = ()

    @property
    def same(self) -> bool:
        """True when both graphs ran the same ops in the same blocks with the same shapes."""
        return not (self.only_a or self.only_b)

    def text(self) -> str:
        """``- op`` lines for ops only in a, ``+ op`` for ops only in b, blocks first."""
        if self.same:
            return "graphs are identical"
        lines = [f"- block {b}" for b in self.blocks_only_a]
        lines += [f"+ block {b}" for b in self.blocks_only_b]
        for sign, nodes in (("-", self.only_a), ("+", self.only_b)):
            for n in nodes:
                shape = ", ".join("x".join(map(str, s)) for s in n.out_shapes)
                lines.append(f"{sign} #{n.id} {n.block or '<top>'}: {n.op} [{shape}]")
        return "\n".join(lines)


def _top_blocks(blocks: set[str]) -> tuple[str, ...]:
    return tuple(sorted(b for b in blocks if not any(p in blocks for p in block_path(b)[:-1])))


def diff(a: Graph, b: Graph) -> GraphDiff:
    """Compare two captures: which ops and which blocks ran in only one of them.

    Ops are aligned by (op, block, output shapes) in execution order, so a branch taken in one
    run and not the other, or a dropped block, shows as exactly those ops. ``blocks_only_*``
    list the outermost blocks that ran in only one graph.
    """
    sa = [n.signature() for n in a.nodes]
    sb = [n.signature() for n in b.nodes]
    matcher = difflib.SequenceMatcher(None, sa, sb, autojunk=False)
    only_a: list[Node] = []
    only_b: list[Node] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            only_a.extend(a.nodes[i1:i2])
            only_b.extend(b.nodes[j1:j2])
    blocks_a, blocks_b = set(a.blocks()), set(b.blocks())
    return GraphDiff(
        tuple(only_a), tuple(only_b),
        _top_blocks(blocks_a - blocks_b), _top_blocks(blocks_b - blocks_a),
    )


__all__ = ["Graph", "GraphDiff", "Node", "block_path", "capture", "diff"]
