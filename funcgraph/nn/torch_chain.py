"""Reading an ``nn.Module``'s forward as a chain: one tensor through a list of ops in order.

:func:`read_chain` is what :func:`funcgraph.nn.from_module` rewrites from. The order of a
module's ops is not in its structure (a custom ``forward`` may call its children in any
order, or twice), so it is read from the forward itself with ``torch.fx.symbolic_trace``:
``nn.Sequential`` (nested too), a module whose children are Sequential blocks called in turn,
and a custom forward of calls such as ``F.relu(self.norm(self.conv(x)))`` all trace to the
same kind of graph. The graph is accepted only if it is a chain that the trace proves:

* one input, and every op takes the previous op's output as its only tensor (no branch, no
  skip connection, no parameter read outside a layer, no second input); its other arguments
  are constants or sizes of that tensor (``x.view(x.size(0), -1)``, ``x.shape[0]``);
* every layer (``call_module``) is one of torch's own modules of the exact types in
  :data:`LAYERS` or :data:`PURE_LEAVES` (a subclass may override ``forward``), and every
  function or method call is in :data:`FUNCTIONS` or :data:`METHODS` with constant arguments;
* the trace in training mode equals the trace in evaluation mode, so no branch on
  ``self.training`` was frozen into it (``F.dropout(x, p, self.training)`` is refused);
* nothing could change the forward behind the trace's back: no hooks (the module's, a
  submodule's or torch's global ones), no parametrizations, no lazy modules, no tensor
  shared under two names.

A forward that branches on a tensor does not trace (``torch.fx`` refuses it) and is refused
too. What the trace cannot see is Python state other than the mode that a forward branches on
(a flag changed after conversion, Python's ``random``): the chain is the forward as it was
when read. Anything refused comes back as a reason, and the module keeps the exact
``functional_call`` path.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx import Node, symbolic_trace
from torch.nn.modules import module as torch_module
from torch.nn.utils import parametrize

from .functional import max_pool

LAYERS: tuple[type[nn.Module], ...] = (
    nn.Conv1d, nn.Conv2d, nn.Linear, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
"""torch layers with params or state that a chain may hold (exact types)."""

PURE_LEAVES: tuple[type[nn.Module], ...] = (
    nn.Identity, nn.Flatten, nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU,
    nn.Tanh, nn.Sigmoid, nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.Dropout)
"""torch modules without params or state whose forward is a pure function of the input and
their settings (``nn.Dropout`` also of the mode, which the chain passes)."""

FUNCTIONS: dict[Callable[..., Any], str] = {
    F.relu: "relu", torch.relu: "relu", F.max_pool2d: "max_pool2d",
    torch.max_pool2d: "max_pool2d", F.avg_pool2d: "avg_pool2d",
    F.adaptive_avg_pool2d: "adaptive_avg_pool2d", torch.flatten: "flatten",
    torch.mean: "mean", F.gelu: "gelu", F.leaky_relu: "leaky_relu", F.elu: "elu",
    F.silu: "silu", torch.tanh: "tanh", torch.sigmoid: "sigmoid", F.dropout: "dropout",
}
"""Functions a chain may call on its tensor, by the name its description uses."""

METHODS = frozenset({"relu", "flatten", "mean", "tanh", "sigmoid", "view", "reshape"})
"""Tensor methods a chain may call (none in place)."""

POOL_ARGS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
"""``F.max_pool2d``'s arguments after the input, in order."""


@dataclass(frozen=True)
class Size:
    """An argument of an op that is a size of the op's input: ``x.size(dim)`` or
    ``x.shape[dim]``."""

    dim: int

    def __call__(self, x: Tensor) -> int:
        return x.size(self.dim)


@dataclass(frozen=True)
class Op:
    """One op of a chain: ``layer`` (a torch module, by its dotted name in the module) or a
    call of ``fn`` (a function, or a method name) as ``fn(x, *args, **kwargs)``."""

    label: str
    layer: nn.Module | None = None
    name: str = ""
    fn: Callable[..., Any] | str | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    reads_size: bool = False

    @property
    def role(self) -> str:
        """``"relu"`` or ``"max_pool2d"`` for the ops the ReLU/max-pool swap reads, else the
        label; a max-pool returning indices is not a max-pool here."""
        if isinstance(self.layer, nn.ReLU) or self.fn in ("relu", F.relu, torch.relu):
            return "relu"
        if isinstance(self.layer, nn.MaxPool2d) and not self.layer.return_indices:
            return "max_pool2d"
        if self.fn in (F.max_pool2d, torch.max_pool2d):
            indices = self.args[5] if len(self.args) > 5 else self.kwargs.get(
                "return_indices", False)
            return "max_pool2d" if indices is False else "max_pool2d with indices"
        return self.label

    def __call__(self, x: Any, train: bool) -> Any:
        """Run a parameter-free op exactly as the module's forward would (a max-pool as
        :func:`funcgraph.nn.max_pool`: the same values and gradients, faster under
        transforms)."""
        if isinstance(self.layer, nn.Dropout):
            return F.dropout(x, self.layer.p, train, self.layer.inplace)
        if isinstance(self.layer, nn.MaxPool2d) and self.role == "max_pool2d":
            pool = self.layer
            return max_pool(x, pool.kernel_size, pool.stride, pool.padding, pool.dilation,
                            pool.ceil_mode)
        if self.layer is not None:
            return self.layer.forward(x)
        args, kwargs = self.args, self.kwargs
        if self.reads_size:
            args, kwargs = _map((args, kwargs), lambda v: v(x) if isinstance(v, Size) else v)
        if self.role == "max_pool2d":
            settings = {**dict(zip(POOL_ARGS, args, strict=False)), **kwargs}
            settings.pop("return_indices", None)
            return max_pool(x, **settings)
        if isinstance(self.fn, str):
            return getattr(x, self.fn)(*args, **kwargs)
        assert self.fn is not None
        return self.fn(x, *args, **kwargs)


def _unchangeable(module: nn.Module) -> str | None:
    """Why the forward of ``module`` could differ from its trace, or ``None``."""
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    for name in hooks:
        if getattr(torch_module, f"_global{name}", None):
            return f"torch has global module hooks ({name[1:]})"
    for name, m in module.named_modules():
        if any(getattr(m, h, None) for h in hooks):
            return f"module {name or type(module).__name__!r} has hooks"
        if parametrize.is_parametrized(m):
            return f"module {name or type(module).__name__!r} is parametrized"
        if isinstance(m, nn.modules.lazy.LazyModuleMixin):
            return f"module {name or type(module).__name__!r} is lazy"
    for kind in ("parameters", "buffers"):
        named = getattr(module, f"named_{kind}")
        if len(list(named(remove_duplicate=False))) != len(list(named())):
            return f"a tensor is shared under two names ({kind})"
    return None


def _trace(module: nn.Module, train: bool) -> Any:
    """The fx graph module of ``module``'s forward in one mode; every submodule's mode is
    restored afterwards."""
    modes = [(m, m.training) for m in module.modules()]
    try:
        module.train(train)
        with warnings.catch_warnings():  # a probe: the forward's own warnings come when it runs
            warnings.simplefilter("ignore")
            return symbolic_trace(module)
    finally:
        for m, mode in modes:
            m.training = mode


def _map(value: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn`` applied to each leaf of nested tuples, lists and dicts (an op's arguments)."""
    if isinstance(value, tuple):
        return tuple(_map(v, fn) for v in value)
    if isinstance(value, list):
        return [_map(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return fn(value)


def _nodes(value: Any) -> list[Node]:
    found: list[Node] = []
    _map(value, lambda v: found.append(v) if isinstance(v, Node) else v)
    return found


def _size(node: Node, previous: Node, sizes: dict[Node, Size | None]) -> Size | None | str:
    """What ``node`` reads of the shape of ``previous`` (``None``: ``previous.shape``
    itself, indexed next), or ``""`` if it reads none."""
    args = node.args
    if node.op == "call_method" and node.target == "size" and len(args) == 2 and (
            args[0] is previous and isinstance(args[1], int) and not node.kwargs):
        return Size(args[1])
    if node.op == "call_function" and node.target is getattr and args == (previous, "shape"):
        return None
    if node.op == "call_function" and node.target is operator.getitem and len(args) == 2 and (
            isinstance(args[0], Node) and sizes.get(args[0], 0) is None
            and isinstance(args[1], int)):
        return Size(args[1])
    return ""


def _op(module: nn.Module, node: Node, sizes: dict[Node, Size | None]) -> Op | str:
    """The op of one traced node whose only tensor is the previous op's, or why not."""
    args, kwargs = tuple(node.args[1:]), dict(node.kwargs)
    reads_size = bool(_nodes((args, kwargs)))
    if reads_size:
        args, kwargs = _map((args, kwargs), lambda v: sizes[v] if isinstance(v, Node) else v)
    if node.op == "call_module":
        layer = module.get_submodule(str(node.target))
        kind = type(layer)
        if args or kwargs:
            return f"layer {node.target!r} is called with more than its input"
        if kind in LAYERS:
            return Op(f"{node.target} ({kind.__name__})", layer, str(node.target))
        if kind in PURE_LEAVES and not any(True for _ in layer.parameters()) and not any(
                True for _ in layer.buffers()):
            return Op(f"{node.target} ({kind.__name__})", layer, str(node.target))
        return f"layer {node.target!r} is a {kind.__module__}.{kind.__qualname__}"
    if node.op == "call_function" and node.target in FUNCTIONS:
        return Op(FUNCTIONS[node.target], fn=node.target, args=args, kwargs=kwargs,
                  reads_size=reads_size)
    if node.op == "call_method" and node.target in METHODS:
        if node.target == "view" and (any(isinstance(a, torch.dtype) for a in args)
                                      or "dtype" in kwargs):
            return "view as another dtype is not an op a chain holds"
        # A chain's activations may be laid out channels-last, where `view` can fail: `reshape`
        # is the same function of the values (a view when one exists, else a copy).
        method = "reshape" if node.target == "view" else str(node.target)
        return Op(str(node.target), fn=method, args=args, kwargs=kwargs, reads_size=reads_size)
    return f"{node.op} {getattr(node.target, '__name__', node.target)!r} is not an op a chain holds"


def read_chain(module: nn.Module) -> list[Op] | str:
    """The ops of ``module``'s forward in order, or the reason it is not a chain (see the
    module docstring)."""
    reason = _unchangeable(module)
    if reason is not None:
        return reason
    try:
        traced = _trace(module, True)
        if traced.code != _trace(module, False).code:
            return "its forward differs between training and evaluation mode"
    except Exception as e:  # noqa: BLE001 - any failure to trace keeps the exact path
        return f"its forward does not trace with torch.fx ({type(e).__name__}: {e})"
    nodes = list(traced.graph.nodes)
    if not nodes or nodes[0].op != "placeholder" or nodes[-1].op != "output":
        return "its forward is not a function of one input"
    ops: list[Op] = []
    previous = nodes[0]
    sizes: dict[Node, Size | None] = {}  # reads of the shape of `previous`
    for node in nodes[1:-1]:
        size = _size(node, previous, sizes)
        if size != "":
            sizes[node] = size if isinstance(size, Size) else None
            continue
        if not node.args or node.args[0] is not previous or any(
                sizes.get(n) is None for n in _nodes((node.args[1:], node.kwargs))):
            return f"{node.op} {node.name!r} does not take the previous op's output alone"
        if any(user is not node and user not in sizes for user in previous.users) or any(
                user is not node and user not in sizes for s in sizes for user in s.users):
            return f"the output of {previous.name!r} is used more than once"
        op = _op(module, node, sizes)
        if isinstance(op, str):
            return op
        ops.append(op)
        previous, sizes = node, {}
    if nodes[-1].args[0] is not previous or len(previous.users) != 1 or sizes:
        return "its forward does not return the last op's output"
    return ops


__all__ = ["FUNCTIONS", "LAYERS", "METHODS", "PURE_LEAVES", "Op", "Size", "read_chain"]
