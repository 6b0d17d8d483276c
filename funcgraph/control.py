"""Data-dependent branching that survives ``grad``, ``vmap`` and ``torch.export``.

:func:`cond` has the signature and meaning of ``torch.cond`` and picks, per call, the
evaluation that is exact and works in the current context:

=========================================  ===================================================
context                                    what runs
=========================================  ===================================================
``torch.export`` / ``torch.compile``       ``torch.cond``: both branches become subgraphs and
                                           the exported program keeps the branch
eager, ``grad``, unbatched ``vmap``        the predicate is read and only the chosen branch
                                           runs (a plain Python ``if``)
``vmap`` with a predicate that differs     **both branches run** on the whole batch and each
per member                                 member's result is selected with ``torch.where``
=========================================  ===================================================

Why not always ``torch.cond``: in torch 2.13 eager ``torch.cond`` is compiled by dynamo on
first use (about 1.5 s per call site) and fails under ``torch.func.grad`` ("Expected
FakeTensor"); the Python branch is the same function, costs nothing and composes with every
``torch.func`` transform, including second order. Under ``vmap`` a batched predicate cannot
pick one branch for all members, so both are computed: the cost is the sum of the branches,
and a branch must be valid (no error, no NaN that a gradient would see) on every member.
"""

from __future__ import annotations

import linecache
import os
import re
import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from .errors import FuncgraphError, ShapeError, TransformError

_functorch = torch._C._functorch


def in_transform() -> bool:
    """True inside a ``torch.func`` transform (``vmap``, ``grad``, ``jvp``...), and while
    ``torch.compile`` traces.

    Outside them, tensors are plain and autograd is torch's own: code may then take a faster
    path that is exact only there (batch norm's native kernel, a plain ``autograd.grad``).
    Dynamo cannot read functorch's level inside a transform it traces (``torch.compile`` of
    ``torch.func.grad(f)`` would break the graph there), so under compilation this answers
    True: the transform-safe path is exact in every context, and the compiler makes its own
    kernels anyway.
    """
    return torch.compiler.is_compiling() or _functorch.maybe_current_level() is not None


def is_batched(t: Tensor) -> bool:
    """Whether ``t`` varies across the members of an enclosing ``vmap`` (at any level).

    Use it to choose between a Python branch on a value (unbatched) and a select (batched).
    """
    while _functorch.is_functorch_wrapped_tensor(t):
        if _functorch.is_batchedtensor(t):
            return True
        t = _functorch.get_unwrapped(t)
    return False


def _check_pred(pred: Any) -> None:
    if isinstance(pred, bool):
        return
    if not isinstance(pred, Tensor):
        raise ShapeError(f"cond: pred must be a bool or a one-element tensor, got {type(pred)}")
    if pred.numel() != 1:
        raise ShapeError(
            f"cond: pred must be a bool or a one-element tensor, got shape {tuple(pred.shape)}"
        )


def where(pred: Tensor, on_true: Any, on_false: Any) -> Any:
    """``torch.where(pred, a, b)`` leaf by leaf over two outputs of the same structure."""
    flat_true, spec = pytree.tree_flatten(on_true)
    flat_false, spec_false = pytree.tree_flatten(on_false)
    if spec != spec_false:
        raise ShapeError(
            f"cond: both branches must return the same structure, got {spec} and {spec_false}"
        )
    pred = pred.reshape(())
    picked = [torch.where(pred, a, b) for a, b in zip(flat_true, flat_false, strict=True)]
    return pytree.tree_unflatten(picked, spec)


def cond(
    pred: bool | Tensor,
    true_fn: Callable[..., Any],
    false_fn: Callable[..., Any],
    *operands: Any,
) -> Any:
    """``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``, transform-safe.

    Arguments:
        pred: a Python bool or a one-element bool tensor (``x.sum() > 0``).
        true_fn: a function of the operands returning tensors (or tuples/dicts of tensors)
            of the same structure, shapes and dtypes as ``false_fn``'s.
        false_fn: the other branch, of the same form.
        operands: the tensors both branches take.
    Returns:
        The chosen branch's output. See the module docstring for how each context evaluates
        it; under ``vmap`` with a batched ``pred`` both branches run.

    Example::

        y = funcgraph.cond(x.sum() > 0, lambda x: x * 2, lambda x: x / 2, x)
    """
    _check_pred(pred)
    if isinstance(pred, bool):
        return (true_fn if pred else false_fn)(*operands)
    if torch.compiler.is_compiling():
        return torch.cond(pred, true_fn, false_fn, operands)
    if is_batched(pred):
        return where(pred, true_fn(*operands), false_fn(*operands))
    return (true_fn if bool(pred) else false_fn)(*operands)


_VMAP_IF = ("a Python `if` on a tensor value cannot run under vmap; use "
            "funcgraph.cond(pred, true_fn, false_fn, *operands)")

_LOOP = 'or run the tasks in a loop (strategy="loop"; meta-train --strategy loop)'

_VALUE_READERS: tuple[tuple[str, str, str], ...] = (
    (r"\bone_hot\s*\(", "F.one_hot cannot run under vmap: it reads the labels' values (their "
     "range; their maximum without a class count)",
     "build the one-hot by comparison, `(y[..., None] == torch.arange(ways)).float()`, "),
    (r"\.(item|tolist)\s*\(", ".item() cannot run under vmap: it reads a tensor's value into "
     "Python", "keep the value a tensor (masks, torch.where, funcgraph.cond), "),
    (r"\b(nonzero|argwhere|unique|unique_consecutive|masked_select|bincount)\b",
     "{name} cannot run under vmap: the size of its output depends on the values",
     "use a mask of fixed shape (torch.where), "),
    (r"(?<![.\w])(int|float|bool)\s*\(", "{name}() of a tensor cannot run under vmap: it reads "
     "the tensor's value into Python", "keep the value a tensor (torch.where, funcgraph.cond), "),
)
"""Ops that read tensor values, by a pattern of the failing expression: what to say and the
fix (each also offers the loop). Torch refuses ``F.one_hot`` with the message of a Python
``if``; the user's line tells them apart."""

_READS_VALUES = ("data-dependent control flow", "calling .item()", "dynamic shape")
"""Torch's refusals under vmap of what reads tensor values (the same for a Python ``if`` and
``F.one_hot``; ``.item()`` and ``nonzero`` have their own)."""

_BRANCH = re.compile(r"^\s*(if|elif|while|assert)\b|\b(if|and|or|not)\b")
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FUNCGRAPH_DIR = os.path.dirname(__file__) + os.sep


def _failing_line(error: BaseException) -> tuple[str, str, str] | None:
    """``("FILE:LINE", source line, failing expression)`` of the frame that ``error`` names:
    the innermost one under the vmapped function that is neither torch's nor funcgraph's
    (else the innermost that is not torch's); None when the traceback has no such frame."""
    frames = traceback.extract_tb(error.__traceback__)
    entries = [i for i, f in enumerate(frames) if f.filename.endswith(
        os.path.join("_functorch", "vmap.py"))]
    inside = frames[entries[-1] + 1:] if entries else frames
    outside_torch = [f for f in inside if not f.filename.startswith(_TORCH_DIR)]
    own = [f for f in outside_torch if not f.filename.startswith(_FUNCGRAPH_DIR)]
    if not (own or outside_torch):
        return None
    frame = (own or outside_torch)[-1]
    line = linecache.getline(frame.filename, frame.lineno or 0).rstrip("\n")
    segment = line.strip()
    if (frame.colno is not None and frame.end_colno is not None
            and frame.end_lineno == frame.lineno):
        segment = line.encode()[frame.colno:frame.end_colno].decode(errors="replace") or segment
    return f"{frame.filename}:{frame.lineno}", line, segment


def _vmap_message(error: BaseException) -> str:
    """The first line of :func:`vmap_hint`'s error: what failed, where, and the fix."""
    found = _failing_line(error)
    if found is None:
        return (f"a Python `if` on a tensor value, or an op that reads tensor values (such as "
                f".item(), F.one_hot, nonzero), cannot run under vmap; use funcgraph.cond(pred, "
                f"true_fn, false_fn, *operands) for an `if`, {_LOOP}")
    where, line, segment = found
    at = f"(at {where}, `{segment}`)"
    for pattern, what, fix in _VALUE_READERS:
        if match := re.search(pattern, segment):
            name = match.group(1) if match.groups() else match.group(0)
            return f"{what.format(name=name)} {at}; {fix}{_LOOP}"
    if _BRANCH.search(line):
        problem, _, fix = _VMAP_IF.partition("; ")
        return f"{problem} {at}; {fix}"
    return (f"`{segment}` reads tensor values (as .item(), F.one_hot, nonzero or a Python `if` "
            f"do), which cannot run under vmap {at}; compute it with tensor ops of fixed shape "
            f"(masks, torch.where, funcgraph.cond), {_LOOP}")


def vmap_hint(error: BaseException) -> TransformError | None:
    """The error to raise instead of ``error`` when it is torch's refusal, under ``vmap``, of
    something that reads a tensor's value, or None for any other error.

    Torch refuses a Python ``if`` (``while``, ``bool()``) on a tensor and an op that reads
    values (``F.one_hot`` checks its labels' range) with the same message, and ``.item()`` or
    ``nonzero`` (its output sized by the values) with their own; none names the line or the
    fix. The returned
    :class:`TransformError` leads with one line that names the failing op, the user's file,
    line and expression (the innermost frame under the vmapped function that is neither
    torch's nor funcgraph's) and what to write instead: ``funcgraph.cond`` for an ``if``,
    the comparison for ``F.one_hot``, or the loop strategy; torch's message follows after a
    blank line. Funcgraph calls it where it runs user code under a transform (a composite's
    forward, the vmap strategy); raise the result ``from error``, so the traceback still shows
    the user's line.
    """
    message = str(error)
    if (isinstance(error, RuntimeError) and not isinstance(error, FuncgraphError)
            and message.startswith("vmap:") and any(text in message for text in _READS_VALUES)):
        return TransformError(f"{_vmap_message(error)}\n\n{message}")
    return None


def double_or_halve(x: Tensor) -> Tensor:
    """The seed example: ``x * 2`` if ``x.sum() > 0`` else ``x / 2``, exportable and vmappable."""
    return cond(x.sum() > 0, lambda v: v * 2, lambda v: v / 2, x)


__all__ = ["cond", "double_or_halve", "in_transform", "is_batched", "vmap_hint", "where"]
