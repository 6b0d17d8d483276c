"""Linear algebra on parameter dicts for implicit gradients: Hessian-vector products and
conjugate gradients.

Both treat a :data:`~funcgraph.params.Params` dict as one vector (the concatenation of its
tensors), so a system over a model's parameters is solved without flattening them, and
nothing is kept between products: each Hessian-vector product builds and frees one
double-backward graph, and conjugate gradients keep four vectors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..checks import check_int
from ..control import in_transform
from ..errors import ConfigError
from ..params import Params
from .learner import grad_of


def dot(a: Params, b: Params) -> Tensor:
    """The inner product of two param dicts with the same names."""
    return torch.stack([(a[n] * b[n]).sum() for n in a]).sum()


def hessian_vector(fn: Callable[[Params], Tensor], params: Params, vector: Params) -> Params:
    """``H v``: the Hessian of ``fn`` at ``params`` times ``vector``, as the gradient of
    ``grad fn(params) . vector`` (double backward; :func:`~.learner.grad_of`, so it works
    inside transforms too). The result is detached."""
    return grad_of(lambda q: dot(grad_of(fn, q, create_graph=True), vector), params)


@dataclass(frozen=True)
class CGResult:
    """A conjugate-gradient solve.

    Attributes:
        x: the approximate solution: the iterate of the smallest residual.
        residual: its ``||b - A x|| / ||b||`` as the CG recurrence tracks it (0 when ``b`` is 0);
            a 0-dim tensor (one per task under ``vmap``).
        iterations: CG steps taken, one product with ``A`` each (``max_steps`` inside
            transforms).
    """

    x: Params
    residual: Tensor
    iterations: int


def conjugate_gradient(
    matvec: Callable[[Params], Params],
    b: Params,
    *,
    max_steps: int,
    tol: float,
    x0: Params | None = None,
) -> CGResult:
    """Solve ``A x = b`` for a symmetric positive definite ``A`` given as ``matvec(v) = A v``,
    from ``x0`` (default ``0``; a given start costs one more product, for its residual).

    Stops once the relative residual ``||r|| / ||b||`` is at most ``tol`` (checked before
    each step, so an exact start takes none) or after ``max_steps`` steps, and returns the
    iterate of the smallest residual seen, the start included. For a symmetric positive
    definite ``A`` that is almost always the last; for the indefinite or badly conditioned
    systems of implicit MAML on a small ``lam`` (measured on a random conv4: every iterate's
    residual above ``||b||``), it keeps a diverging recurrence from returning a worse answer
    than the start. Inside
    ``torch.func`` transforms (``vmap`` over tasks) a data-dependent stop cannot be taken for
    the whole batch, so it runs exactly ``max_steps`` steps there; a step whose residual is
    already exactly zero then leaves ``x`` unchanged instead of dividing zero by zero.

    Raises:
        ConfigError: ``max_steps`` is not an int >= 1 or ``tol`` not a number >= 0.
    """
    check_int("conjugate_gradient", "max_steps", max_steps)
    if isinstance(tol, bool) or not isinstance(tol, int | float) or not tol >= 0:
        raise ConfigError(f"conjugate_gradient: tol must be a number >= 0 (a relative "
                          f"residual), got {tol!r}")
    stop_early = not in_transform()
    if x0 is None:
        x, r = {n: torch.zeros_like(t) for n, t in b.items()}, b
    else:
        ax0 = matvec(x0)
        x, r = x0, {n: b[n] - ax0[n] for n in b}
    p = r
    rs = dot(r, r)
    b_norm = dot(b, b).sqrt()
    best_x, best_rs = x, rs
    iterations = 0
    while iterations < max_steps and not (stop_early and bool(rs.sqrt() <= tol * b_norm)):
        ap = matvec(p)
        alpha = torch.where(rs > 0, rs / dot(p, ap), torch.zeros_like(rs))
        x = {n: x[n] + alpha * p[n] for n in x}
        r = {n: r[n] - alpha * ap[n] for n in r}
        rs_next = dot(r, r)
        beta = torch.where(rs > 0, rs_next / rs, torch.zeros_like(rs))
        p = {n: r[n] + beta * p[n] for n in r}
        rs = rs_next
        better = rs <= best_rs  # a tensor test, so it maps per task under vmap
        best_x = {n: torch.where(better, x[n], best_x[n]) for n in x}
        best_rs = torch.where(better, rs, best_rs)
        iterations += 1
    residual = torch.where(b_norm > 0, best_rs.sqrt() / b_norm, torch.zeros_like(best_rs))
    return CGResult(best_x, residual, iterations)


__all__ = ["CGResult", "conjugate_gradient", "dot", "hessian_vector"]
