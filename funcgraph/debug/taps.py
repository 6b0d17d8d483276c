"""Taps: look at values inside a pure function without changing what it computes.

``tap(x, fn)`` calls ``fn`` with the value of ``x`` and returns ``x`` unchanged;
``grad_tap(x, fn)`` returns ``x`` unchanged and calls ``fn`` with the gradient that flows back
into ``x`` during the backward pass. Both work in plain eager code, under ``torch.func.grad``
and under ``torch.func.vmap`` (and their compositions): ``fn`` always receives a plain,
detached tensor. Under ``vmap`` the value seen by ``fn`` is the whole batch, with the vmapped
dimension(s) moved to the front (outermost ``vmap`` first), so a per-example value of shape
``(3,)`` under ``vmap`` over 5 examples arrives as ``(5, 3)``.

Taps are Python side effects: under ``torch.export``/``torch.compile`` they are not traced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..errors import ArgumentTypeError

_functorch = torch._C._functorch

TapFn = Callable[[Tensor], Any]


def plain(t: Tensor) -> Tensor:
    """The value of ``t`` with every ``torch.func`` wrapper removed, detached.

    Batched (vmap) levels are unwrapped with their batch dimension moved to the front, gradient
    tracking levels (grad/vjp/jvp) are unwrapped to their primal value.
    """
    while _functorch.is_functorch_wrapped_tensor(t):
        if _functorch.is_batchedtensor(t):
            bdim = _functorch.maybe_get_bdim(t)
            t = _functorch.get_unwrapped(t).movedim(bdim, 0)
        else:
            t = _functorch.get_unwrapped(t)
    return t.detach()


def tap(x: Tensor, fn: TapFn) -> Tensor:
    """Identity on ``x`` that calls ``fn(value)`` first; returns ``x`` itself.

    Example::

        seen = []
        h = tap(F.relu(x), seen.append)  # seen[0] is the activation, h is untouched
    """
    if not isinstance(x, Tensor):
        raise ArgumentTypeError(f"tap: x must be a Tensor, got {type(x).__name__}")
    fn(plain(x))
    return x


class _GradTap(torch.autograd.Function):
    """Identity whose backward reports the incoming gradient (functorch-compatible form)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, fn: TapFn) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.fn = inputs[1]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        ctx.fn(plain(grad))
        return grad, None


def grad_tap(x: Tensor, fn: TapFn) -> Tensor:
    """Identity on ``x`` whose backward pass calls ``fn(gradient w.r.t. x)``.

    Works with ``Tensor.backward``, ``torch.autograd.grad`` and ``torch.func.grad``/``vjp``,
    also under ``vmap``. When nothing differentiates through ``x``, ``fn`` is never called.

    Example::

        grads = []
        h = grad_tap(hidden, grads.append)
        torch.func.grad(loss)(params)   # grads[0] is dloss/dhidden
    """
    if not isinstance(x, Tensor):
        raise ArgumentTypeError(f"grad_tap: x must be a Tensor, got {type(x).__name__}")
    out: Tensor = _GradTap.apply(x, fn)
    return out


__all__ = ["TapFn", "grad_tap", "plain", "tap"]
