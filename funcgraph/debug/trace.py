"""Per-op traces and the finite check, through torch's dispatch and function modes.

``trace(fn)(*args)`` runs ``fn`` once and returns a :class:`Trace`: the output and one
:class:`OpRecord` per op that ran (op name, input/output shapes, dtype, device, elapsed time).
``finite_check()`` (a context manager) and ``check_finite(fn)`` stop at the first op whose
output holds a NaN or an Inf and raise :class:`NonFiniteError` naming the op and the user's
source line that called it.

Two levels, because torch offers two interception points:

* ``level="dispatch"`` (default; :class:`torch.utils._python_dispatch.TorchDispatchMode`) sees
  ATen ops (``aten.mm``, ``aten.convolution``) after autograd and ``torch.func`` transforms:
  under ``vmap`` shapes are the physical batched shapes, under ``grad`` the backward ops are
  recorded too, and ``torch.cond`` is followed into the branch that ran.
* ``level="function"`` (:class:`torch.overrides.TorchFunctionMode`) sees the calls as written
  (``linear``, ``conv2d``, ``__add__``): under ``vmap`` shapes are per-example, backward ops are
  not seen, and ``torch.cond`` cannot run under it (torch refuses); use the dispatch level there.

The finite check always runs at the dispatch level, so it works under ``vmap`` and ``grad`` and
catches NaNs born in the backward pass.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..errors import ConfigError, FuncgraphError

Level = Literal["dispatch", "function"]

_TORCH_DIR = os.path.dirname(torch.__file__)
_DEBUG_DIR = os.path.dirname(__file__)
_SKIP_FUNCTIONS = {"__get__", "__set__", "dim", "size", "numel", "_set_grad_enabled"}


class NonFiniteError(FuncgraphError, FloatingPointError):
    """An op produced a NaN or Inf; ``.record`` is its :class:`OpRecord`."""

    def __init__(self, message: str, record: OpRecord) -> None:
        super().__init__(message)
        self.record = record


@dataclass(frozen=True)
class OpRecord:
    """One executed op.

    Attributes:
        index: position in execution order.
        op: op name (``aten.mm`` at the dispatch level, ``linear`` at the function level).
        in_shapes / out_shapes: shapes of the tensor inputs / outputs, in argument order.
        dtype / device: of the first tensor output (``None`` when the op returns no tensor).
        elapsed_s: wall time of the op (CUDA is synchronised when timing CUDA outputs).
        location: ``file:line in function`` of the innermost user frame ("" unless asked for).
    """

    index: int
    op: str
    in_shapes: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    dtype: torch.dtype | None
    device: torch.device | None
    elapsed_s: float
    location: str = ""

    def __str__(self) -> str:
        ins = ", ".join(_fmt_shape(s) for s in self.in_shapes)
        outs = ", ".join(_fmt_shape(s) for s in self.out_shapes)
        dtype = str(self.dtype).removeprefix("torch.") if self.dtype is not None else "-"
        return f"{self.index:>4} {self.op:<28} ({ins}) -> ({outs}) {dtype} {self.device}"


def _fmt_shape(shape: Sequence[int]) -> str:
    return "[" + "x".join(str(d) for d in shape) + "]"


@dataclass
class Trace:
    """The result of :func:`trace`: ``output`` of the call and the ``ops`` that ran."""

    output: Any
    ops: list[OpRecord] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[OpRecord]:
        return iter(self.ops)

    def names(self) -> list[str]:
        """The op names in execution order."""
        return [r.op for r in self.ops]

    def table(self) -> str:
        """One line per op plus the total elapsed time."""
        total = sum(r.elapsed_s for r in self.ops)
        lines = [str(r) for r in self.ops]
        lines.append(f"{len(self.ops)} ops, {total * 1e3:.3f} ms")
        return "\n".join(lines)


def user_location(limit: int = 1) -> list[str]:
    """The innermost ``limit`` stack frames outside torch and ``funcgraph.debug``, innermost first.

    Each entry reads ``path:line in function: source``.
    """
    frames = [
        f for f in traceback.extract_stack()
        if not f.filename.startswith((_TORCH_DIR, _DEBUG_DIR)) and "contextlib" not in f.filename
    ]
    picked = frames[::-1][:limit]
    return [f"{f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()}" for f in picked]


def _tensors(tree: Any) -> list[Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, Tensor)]


def op_name(func: Any) -> str:
    """A readable name: ``aten.mm`` for ATen overloads, ``__name__`` for Python callables."""
    if isinstance(func, torch._ops.OpOverload):
        return str(func.overloadpacket)
    if isinstance(func, torch._ops.HigherOrderOperator):
        return func.name()
    return getattr(func, "__name__", repr(func))


def _record(
    index: int, name: str, args: Any, out: Any, elapsed: float, stack: bool
) -> OpRecord:
    outs = _tensors(out)
    first = outs[0] if outs else None
    where = user_location() if stack else []
    return OpRecord(
        index=index,
        op=name,
        in_shapes=tuple(tuple(t.shape) for t in _tensors(args)),
        out_shapes=tuple(tuple(t.shape) for t in outs),
        dtype=None if first is None else first.dtype,
        device=None if first is None else first.device,
        elapsed_s=elapsed,
        location=where[0] if where else "",
    )


def _timed(func: Callable[..., Any], args: Any, kwargs: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = func(*args, **kwargs)
    if any(t.is_cuda for t in _tensors(out)):
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


class OpMode(TorchDispatchMode):
    """Base dispatch mode: runs every op, follows ``torch.cond`` into the branch taken, and
    hands each op to :meth:`on_op`. Subclasses override ``on_op`` (and ``on_cond``)."""

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Eager torch.cond compiles its body with dynamo. Under a mode that dynamo does not
        # ignore, it skips that frame and marks torch's wrapper code as never-compile, which
        # breaks every later torch.cond and torch.export of a cond in the process.
        return True

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.higher_order.cond:
            pred, true_fn, false_fn, operands = args
            taken = bool(pred)
            self.on_cond(taken, pred)
            with self:
                return (true_fn if taken else false_fn)(*operands)
        out, elapsed = _timed(func, args, kwargs)
        self.on_op(func, args, kwargs, out, elapsed)
        return out

    def on_op(self, func: Any, args: Any, kwargs: Any, out: Any, elapsed: float) -> None:
        """Called after each op ran."""

    def on_cond(self, taken: bool, pred: Tensor) -> None:
        """Called when a ``torch.cond`` is about to run its ``taken`` branch."""


class _TraceDispatch(OpMode):
    def __init__(self, stack: bool) -> None:
        super().__init__()
        self.ops: list[OpRecord] = []
        self.stack = stack

    def on_op(self, func: Any, args: Any, kwargs: Any, out: Any, elapsed: float) -> None:
        self.ops.append(_record(len(self.ops), op_name(func), (args, kwargs), out, elapsed,
                                self.stack))

    def on_cond(self, taken: bool, pred: Tensor) -> None:
        self.ops.append(_record(len(self.ops), f"cond[{str(taken).lower()}]", (pred,), (), 0.0,
                                self.stack))


class _TraceFunction(TorchFunctionMode):
    def __init__(self, stack: bool) -> None:
        super().__init__()
        self.ops: list[OpRecord] = []
        self.stack = stack

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        out, elapsed = _timed(func, args, kwargs or {})
        name = op_name(func)
        if name not in _SKIP_FUNCTIONS and _tensors(out):
            self.ops.append(_record(len(self.ops), name, (args, kwargs), out, elapsed, self.stack))
        return out


def trace(
    fn: Callable[..., Any], *, level: Level = "dispatch", stack: bool = False
) -> Callable[..., Trace]:
    """Wrap ``fn`` so that calling it returns a :class:`Trace` of the ops it ran.

    Arguments:
        fn: any function of tensors.
        level: ``"dispatch"`` (ATen ops, physical shapes, backward ops) or ``"function"``
            (torch-level calls, per-example shapes under ``vmap``); see the module docstring.
        stack: also record each op's user source line (slower).

    Example::

        t = trace(model_fn)(params, x)
        print(t.table())
    """
    if level not in ("dispatch", "function"):
        raise ConfigError(f"trace: level must be 'dispatch' or 'function', got {level!r}")

    def run(*args: Any, **kwargs: Any) -> Trace:
        mode: _TraceDispatch | _TraceFunction = (
            _TraceDispatch(stack) if level == "dispatch" else _TraceFunction(stack)
        )
        with mode:
            out = fn(*args, **kwargs)
        return Trace(out, mode.ops)

    return run


def _nonfinite(tensors: list[Tensor]) -> bool:
    return any(
        (t.is_floating_point() or t.is_complex()) and t.numel() > 0
        and not bool(torch.isfinite(t).all())
        for t in tensors
    )


class _FiniteCheck(OpMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def on_op(self, func: Any, args: Any, kwargs: Any, out: Any, elapsed: float) -> None:
        self.count += 1
        if not _nonfinite(_tensors(out)):
            return
        record = _record(self.count - 1, op_name(func), (args, kwargs), out, elapsed, False)
        where = user_location(limit=3)
        inputs = "already non-finite" if _nonfinite(_tensors((args, kwargs))) else "finite"
        kind = "NaN" if any(bool(torch.isnan(t).any()) for t in _tensors(out)
                            if t.is_floating_point() or t.is_complex()) else "Inf"
        raise NonFiniteError(
            f"{record.op} (op #{record.index}) produced {kind} from {inputs} inputs "
            f"{[list(s) for s in record.in_shapes]} at {where[0] if where else '<unknown>'}"
            + "".join(f"\n  called from {w}" for w in where[1:]),
            dataclasses.replace(record, location=where[0] if where else ""),
        )


@contextmanager
def finite_check() -> Iterator[None]:
    """Raise :class:`NonFiniteError` at the first op (forward or backward) producing NaN/Inf.

    Example::

        with finite_check():
            loss = loss_fn(params, batch)     # NonFiniteError: aten.log ... at train.py:12
    """
    with _FiniteCheck():
        yield


def check_finite(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run under :func:`finite_check`: same result, or :class:`NonFiniteError`."""

    def run(*args: Any, **kwargs: Any) -> Any:
        with finite_check():
            return fn(*args, **kwargs)

    return run


__all__ = [
    "Level",
    "NonFiniteError",
    "OpMode",
    "OpRecord",
    "Trace",
    "check_finite",
    "finite_check",
    "op_name",
    "trace",
    "user_location",
]
