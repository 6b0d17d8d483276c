"""Reading an ``nn.Module``'s forward as a chain: one tensor through a list of ops in order.

:func:`read_chain` is what :func:`funcgraph.nn.from_module` rewrites from. The order of a
module's ops is not in its structure (a custom ``forward`` may call its children in any
order, or twice), so it is read from the forward itself with ``torch.fx.symbolic_trace``:
``nn.Sequential`` (nested too), a module whose children are Sequential blocks called in turn,
and a custom forward of calls such as ``F.relu(self.norm(self.conv(x)))`` all trace to the
same kind of graph. The graph is accepted only if it is a chain that the trace proves:

* one input, and every op takes the previous op's output as its only tensor (no branch, no
  skip connection, no parameter read outside a layer, no second input);
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

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import Node, symbolic_trace
from torch.fx.node import map_aggregate
from torch.nn.modules import module as torch_module
from torch.nn.utils import parametrize

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
        """Run a parameter-free op exactly as the module's forward would."""
        if isinstance(self.layer, nn.Dropout):
            return F.dropout(x, self.layer.p, train, self.layer.inplace)
        if self.layer is not None:
            return self.layer.forward(x)
        if isinstance(self.fn, str):
            return getattr(x, self.fn)(*self.args, **self.kwargs)
        assert self.fn is not None
        return self.fn(x, *self.args, **self.kwargs)


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


def _has_node(value: Any) -> bool:
    found: list[Node] = []
    map_aggregate(value, lambda v: found.append(v) if isinstance(v, Node) else v)
    return bool(found)


def _op(module: nn.Module, node: Node) -> Op | str:
    """The op of one traced node whose only tensor is the previous op's, or why not."""
    args, kwargs = tuple(node.args[1:]), dict(node.kwargs)
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
        return Op(FUNCTIONS[node.target], fn=node.target, args=args, kwargs=kwargs)
    if node.op == "call_method" and node.target in METHODS:
        return Op(str(node.target), fn=str(node.target), args=args, kwargs=kwargs)
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
    for node in nodes[1:-1]:
        if not node.args or node.args[0] is not previous or _has_node(node.args[1:]) or (
                _has_node(node.kwargs)):
            return f"{node.op} {node.name!r} does not take the previous op's output alone"
        if len(previous.users) != 1:
            return f"the output of {previous.name!r} is used more than once"
        op = _op(module, node)
        if isinstance(op, str):
            return op
        ops.append(op)
        previous = node
    if nodes[-1].args[0] is not previous or len(previous.users) != 1:
        return "its forward does not return the last op's output"
    return ops


__all__ = ["FUNCTIONS", "LAYERS", "METHODS", "PURE_LEAVES", "Op", "read_chain"]
