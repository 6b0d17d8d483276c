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


def vmap_hint(error: BaseException) -> TransformError | None:
    """The error to raise instead of ``error`` when it is torch's refusal of a Python ``if``
    (``while``, ``bool()``) on a tensor under ``vmap``, or None for any other error.

    Torch's message says what failed but not what to write instead; the returned
    :class:`TransformError` leads with the line "a Python `if` on a tensor value cannot run
    under vmap; use funcgraph.cond(pred, true_fn, false_fn, *operands)" and keeps torch's
    message after a blank line. Funcgraph calls it where it runs user code under a transform
    (a composite's forward); raise the result ``from error``, so the traceback still shows the
    user's line.
    """
    message = str(error)
    if (isinstance(error, RuntimeError) and not isinstance(error, FuncgraphError)
            and message.startswith("vmap:") and "data-dependent control flow" in message):
        return TransformError(f"{_VMAP_IF}\n\n{message}")
    return None


def double_or_halve(x: Tensor) -> Tensor:
    """The seed example: ``x * 2`` if ``x.sum() > 0`` else ``x / 2``, exportable and vmappable."""
    return cond(x.sum() > 0, lambda v: v * 2, lambda v: v / 2, x)


__all__ = ["cond", "double_or_halve", "in_transform", "is_batched", "vmap_hint", "where"]
