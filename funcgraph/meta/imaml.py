"""Implicit MAML (Rajeswaran et al., "Meta-Learning with Implicit Gradients", NeurIPS 2019) as
a :class:`MetaLearner`.

The inner problem is proximal: from ``phi = theta``, ``inner_steps`` plain gradient steps on
``support_loss(phi) + lam/2 * ||phi - theta||^2`` (:func:`proximal_adapt`), with no graph
kept. At its minimiser ``phi*`` the Jacobian ``d phi* / d theta`` is ``(I + H / lam)^-1``
(``H`` the support loss's Hessian at ``phi*``), whatever path led there, so the
meta-gradient is the solution ``v`` of ``(I + H / lam) v = g``, with ``g`` the query loss's
gradient at ``phi``; conjugate gradients solve it with Hessian-vector products
(:func:`~funcgraph.meta.cg.conjugate_gradient`), starting from ``v = g`` (the solution as
``lam`` grows, first-order MAML's gradient) and keeping the iterate of the smallest
residual. On a conv4 at initialisation with ``lam`` 1 or 2 the system is far from positive
definite (every CG iterate from ``v = 0`` had a residual above ``||g||`` on 8 glyph tasks),
so a failed solve returns a first-order gradient rather than noise or nothing. Memory is one
support pass's double-backward graph and a few param-sized vectors, whatever the number of
inner steps, where MAML's graph grows with every step. The meta-gradient is exact to the
extent the inner loop converged and CG reached its tolerance: :func:`imaml_solve` reports
the adapted params, CG's relative residual and its iterations; the learner's ``task_grad``
returns its meta-gradient, loss and metric.

CG needs one fixed linear operator, so every Hessian-vector product of a task forwards the
support set with one key: the support key of step ``inner_steps``, the step after the last
(inner step ``i`` takes support key ``i``, the query pass the query key; see
:mod:`funcgraph.meta.learner`). ``I + H / lam`` is positive definite when ``lam`` exceeds
minus the Hessian's smallest eigenvalue; for a non-convex support loss, choose ``lam`` large
enough.

Strategies: the loop (and threads) stops CG on its tolerance. Under ``vmap`` a
data-dependent stop cannot be batched, so CG runs exactly ``cg_steps`` there (a converged
task's further steps change nothing), and the result equals the loop's with ``cg_tol=0``.
Evaluation adapts with the same proximal objective for ``eval_steps`` steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from torch import Tensor

from ..errors import ConfigError
from ..model import BoundApply
from ..params import Params
from ..random import Key
from .adapted import AdaptThenScore, Predict, predicting
from .binding import ModelLike
from .cg import conjugate_gradient, hessian_vector
from .learner import (
    MetaLearner,
    Objective,
    Task,
    call,
    check_apply,
    grad_of,
    objective,
    support_keys,
    task_grad_of,
)
from .maml_family import _query_score
from .registry import TaskInfo
from .settings import ImamlSettings


def proximal_adapt(
    apply: BoundApply,
    theta: Params,
    x: Tensor,
    y: Tensor,
    *,
    loss: Callable[[Tensor, Tensor], Tensor],
    steps: int,
    lr: float,
    lam: float,
    key: Key | None = None,
) -> Params:
    """``phi`` after ``steps`` gradient steps on ``loss(apply(phi, x), y) + lam/2 *
    ||phi - theta||^2`` from ``phi = theta``; step ``i`` forwards with support key ``i``.

    Everything is detached: each step's gradient graph is freed before the next step, so
    memory does not grow with ``steps``.
    """
    anchor = {n: p.detach() for n, p in theta.items()}

    def support_loss(phi: Params, step_key: Key | None) -> Tensor:
        return loss(call(apply, phi, x, step_key), y)

    phi = anchor
    for step_key in support_keys(key, steps):
        grads = grad_of(partial(support_loss, step_key=step_key), phi)
        phi = {n: p - lr * (grads[n] + lam * (p - anchor[n])) for n, p in phi.items()}
    return phi


@dataclass(frozen=True)
class ImplicitGrad:
    """One task's implicit meta-gradient and how it was found.

    Attributes:
        grads: the meta-gradient ``(I + H / lam)^-1 g``, by meta-parameter name.
        loss, metric: the query loss and metric at the adapted params.
        adapted: the adapted params ``phi``.
        residual: CG's relative residual ``||g - A v|| / ||g||``.
        iterations: CG's Hessian-vector products.
    """

    grads: Params
    loss: Tensor
    metric: Tensor
    adapted: Params
    residual: Tensor
    iterations: int


def imaml_solve(
    apply: BoundApply,
    theta: Params,
    task: Task,
    *,
    objective: Objective,
    inner_steps: int,
    inner_lr: float,
    lam: float,
    cg_steps: int,
    cg_tol: float,
) -> ImplicitGrad:
    """Adapt on the task's support set (:func:`proximal_adapt`), take the query gradient
    there and solve for the implicit meta-gradient by conjugate gradients (module docs)."""
    phi = proximal_adapt(apply, theta, task.support_x, task.support_y, loss=objective.loss,
                         steps=inner_steps, lr=inner_lr, lam=lam, key=task.key)
    query_grad = task_grad_of(lambda p, t: _query_score(apply, p, t, objective))
    g, loss, metric = query_grad(phi, task)
    hessian_key = support_keys(task.key, inner_steps + 1)[-1]

    def support_loss(p: Params) -> Tensor:
        return objective.loss(call(apply, p, task.support_x, hessian_key), task.support_y)

    def matvec(v: Params) -> Params:
        hv = hessian_vector(support_loss, phi, v)
        return {n: v[n] + hv[n] / lam for n in v}

    solved = conjugate_gradient(matvec, g, max_steps=cg_steps, tol=cg_tol, x0=g)
    return ImplicitGrad(solved.x, loss, metric, phi, solved.residual, solved.iterations)


def imaml(
    apply: ModelLike,
    *,
    kind: str = "classification",
    inner_steps: int = ImamlSettings.inner_steps,
    inner_lr: float = ImamlSettings.inner_lr,
    lam: float = ImamlSettings.lam,
    cg_steps: int = ImamlSettings.cg_steps,
    cg_tol: float = ImamlSettings.cg_tol,
    eval_steps: int | None = ImamlSettings.eval_steps,
    name: str = "imaml",
) -> MetaLearner:
    """Implicit MAML as a :class:`MetaLearner`; see the module docstring.

    Arguments:
        apply: ``f(params, x) -> prediction`` (``funcgraph.bind(model, state, train=True)``),
            or a Model or ``nn.Module`` bound for training by the learner
            (:mod:`funcgraph.meta.binding`); tasks with keys need it to take ``key=``.
        kind: ``"classification"`` (cross-entropy, accuracy) or ``"regression"`` (MSE).
        inner_steps: gradient steps on the proximal inner objective.
        inner_lr: their rate; it should stay below ``2 / (L + lam)`` for a support loss of
            curvature ``L``.
        lam: the proximal regularisation strength (``> 0``); larger keeps ``phi`` closer to
            ``theta`` and conditions the CG system better.
        cg_steps: at most this many CG steps (Hessian-vector products) per task.
        cg_tol: CG stops once its relative residual is at most this (``0``: always
            ``cg_steps``).
        eval_steps: proximal steps at evaluation (``None``: ``inner_steps``).
        name: the learner's name, for logs.

    Raises:
        ConfigError: an argument out of range (naming it and the value).
    """
    settings = ImamlSettings(inner_steps, inner_lr,
                             inner_steps if eval_steps is None else eval_steps, lam, cg_steps,
                             cg_tol)
    if not (isinstance(name, str) and name):
        raise ConfigError(f"imaml: name must be a non-empty string, got {name!r}")
    apply, uses_keys, model = check_apply(apply, name)
    obj = objective(kind)
    eval_count, lr, lam_, tol = (settings.eval_steps, float(inner_lr), float(lam),
                                 float(cg_tol))
    solve = partial(imaml_solve, apply, objective=obj, inner_steps=inner_steps, inner_lr=lr,
                    lam=lam_, cg_steps=cg_steps, cg_tol=tol)

    def task_grad(meta_params: Params, task: Task) -> tuple[Params, Tensor, Tensor]:
        out = solve(meta_params, task)
        return {n: out.grads[n] for n in meta_params}, out.loss, out.metric

    def eval_adapt(meta_params: Params, x: Tensor, y: Tensor, key: Key | None) -> Predict:
        phi = proximal_adapt(apply, meta_params, x, y, loss=obj.loss, steps=eval_count, lr=lr,
                             lam=lam_, key=key)
        return predicting(apply, phi, key)

    return MetaLearner(name, dict, task_grad, AdaptThenScore(eval_adapt, obj), obj, settings,
                       uses_keys=uses_keys, model=model)


def build_imaml(apply: BoundApply, settings: ImamlSettings, info: TaskInfo) -> MetaLearner:
    """The registry's builder: :func:`imaml` with ``settings`` for ``info``'s tasks."""
    return imaml(apply, kind=info.kind, inner_steps=settings.inner_steps,
                 inner_lr=settings.inner_lr, lam=settings.lam, cg_steps=settings.cg_steps,
                 cg_tol=settings.cg_tol, eval_steps=settings.eval_steps,
                 name=type(settings).OWNER)


__all__ = ["ImplicitGrad", "build_imaml", "imaml", "imaml_solve", "proximal_adapt"]
