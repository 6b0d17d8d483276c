"""MAML and its family as pure functions over params: MAML, first-order MAML, Meta-SGD, ANIL.

One inner loop serves all four (Finn et al. 2017; Li et al. 2017; Raghu et al. 2020)::

    fast = params
    repeat steps:  fast = fast - lr * grad(loss(apply(fast, support_x), support_y))
    task loss = loss(apply(fast, query_x), query_y)

* MAML differentiates the task loss through the inner updates (second order).
* First-order MAML treats the inner gradients as constants: the same update with the
  second-order term (the Hessian-vector products) dropped.
* Meta-SGD learns one inner learning rate per parameter entry (``"inner_lr.<name>"`` in the
  meta-params), meta-trained with the weights.
* ANIL adapts only the parameters under a prefix (the ``"head"``) in the inner loop.

The inner gradient is ``torch.func.grad`` inside transforms (so an outer ``torch.func.grad``
gives the meta-gradient and ``vmap`` maps it over tasks) and plain autograd with
``create_graph`` outside them (the loop strategy): same numbers, less overhead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import ConfigError
from ..params import Params
from .learner import (
    LR_PREFIX,
    ApplyFn,
    MetaLearner,
    Objective,
    Task,
    grad_of,
    model_params,
    objective,
    task_grad_of,
)


@dataclass(frozen=True)
class InnerLoop:
    """Inner-loop settings.

    Attributes:
        steps: SGD steps on the support set (>= 0).
        lr: the inner learning rate (Meta-SGD: the initial value of the learned rates).
        first_order: drop the second-order term (inner gradients become constants).
        adapt_prefix: adapt only params whose name starts with ``adapt_prefix + "."``
            (ANIL: ``"head"``); ``None`` adapts all.
    """

    steps: int = 1
    lr: float = 0.4
    first_order: bool = False
    adapt_prefix: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or self.steps < 0:
            raise ConfigError(f"InnerLoop.steps must be an int >= 0, got {self.steps!r}")

    def adapts(self, name: str) -> bool:
        return self.adapt_prefix is None or name.startswith(self.adapt_prefix + ".")


def adapt(
    apply: ApplyFn,
    params: Params,
    x: Tensor,
    y: Tensor,
    *,
    loss: Callable[[Tensor, Tensor], Tensor],
    inner: InnerLoop,
    lrs: Params | None = None,
) -> Params:
    """Params after ``inner.steps`` SGD steps on ``loss(apply(params, x), y)``.

    Arguments:
        apply: ``f(params, x) -> prediction``.
        params: the starting point (the meta-parameters of the model).
        x, y: the support set.
        loss: ``loss(prediction, y) -> scalar``.
        inner: steps, learning rate, first order, which params adapt.
        lrs: per-parameter learning-rate tensors (Meta-SGD), used instead of ``inner.lr``.
    Returns:
        A new dict with every name of ``params``; non-adapted entries are the same tensors.
    """
    fast = {n: p for n, p in params.items() if inner.adapts(n)}
    if not fast:
        raise ConfigError(f"adapt: no parameter name starts with {inner.adapt_prefix!r}.")
    frozen = {n: p for n, p in params.items() if n not in fast}

    def support_loss(f: Params) -> Tensor:
        return loss(apply({**frozen, **f}, x), y)

    for _ in range(inner.steps):
        grads = grad_of(support_loss, fast, create_graph=not inner.first_order)
        fast = {
            n: p - (lrs[n] if lrs is not None else inner.lr) * grads[n] for n, p in fast.items()
        }
    return {n: fast.get(n, p) for n, p in params.items()}


def task_loss(
    apply: ApplyFn,
    meta_params: Params,
    task: Task,
    *,
    objective: Objective,
    inner: InnerLoop,
) -> tuple[Tensor, Tensor]:
    """``(query loss, query metric)`` of one task after adapting on its support set.

    ``meta_params`` may hold Meta-SGD rates under ``"inner_lr.<name>"``; they are then used
    as the per-parameter inner learning rates. Differentiate this (``torch.func.grad`` with
    ``has_aux``) for the meta-gradient.
    """
    params = model_params(meta_params)
    lrs = {n[len(LR_PREFIX):]: p for n, p in meta_params.items() if n.startswith(LR_PREFIX)}
    fast = adapt(apply, params, task.support_x, task.support_y, loss=objective.loss,
                 inner=inner, lrs=lrs or None)
    pred = apply(fast, task.query_x)
    return objective.loss(pred, task.query_y), objective.metric(pred, task.query_y)


def maml(
    apply: ApplyFn,
    *,
    kind: str = "classification",
    inner_steps: int = 1,
    inner_lr: float = 0.4,
    eval_steps: int | None = None,
    first_order: bool = False,
    learn_lr: bool = False,
    adapt_prefix: str | None = None,
    name: str | None = None,
) -> MetaLearner:
    """MAML (second order by default) as a :class:`MetaLearner`.

    Arguments:
        apply: ``f(params, x) -> prediction`` (``funcgraph.bind(model, state)``).
        kind: ``"classification"`` (cross-entropy, accuracy) or ``"regression"`` (MSE).
        inner_steps, inner_lr: the inner loop used for meta-training.
        eval_steps: inner steps at evaluation (default: ``inner_steps``).
        first_order: first-order MAML.
        learn_lr: Meta-SGD (per-parameter learned inner rates, initialised to ``inner_lr``).
        adapt_prefix: adapt only params under this prefix (ANIL: ``"head"``).
    """
    obj = objective(kind)
    train_inner = InnerLoop(inner_steps, inner_lr, first_order, adapt_prefix)
    # Evaluation never differentiates through the adaptation: first order is exact there.
    eval_inner = InnerLoop(inner_steps if eval_steps is None else eval_steps, inner_lr, True,
                           adapt_prefix)

    def init(params: Params) -> Params:
        if not learn_lr:
            return dict(params)
        rates = {LR_PREFIX + n: torch.full_like(p, inner_lr)
                 for n, p in params.items() if train_inner.adapts(n)}
        return {**params, **rates}

    def loss_fn(meta_params: Params, task: Task) -> tuple[Tensor, Tensor]:
        return task_loss(apply, meta_params, task, objective=obj, inner=train_inner)

    task_grad = task_grad_of(loss_fn)

    def task_eval(meta_params: Params, task: Task) -> tuple[Tensor, Tensor]:
        loss, metric = task_loss(apply, meta_params, task, objective=obj, inner=eval_inner)
        return loss.detach(), metric

    default = "metasgd" if learn_lr else "anil" if adapt_prefix else (
        "fomaml" if first_order else "maml")
    hparams = {"inner_steps": inner_steps, "inner_lr": inner_lr,
               "eval_steps": eval_inner.steps, "first_order": first_order,
               "learn_lr": learn_lr, "adapt_prefix": adapt_prefix, "kind": kind}
    return MetaLearner(name or default, init, task_grad, task_eval, obj, hparams)


def fomaml(apply: ApplyFn, **kw: object) -> MetaLearner:
    """First-order MAML: :func:`maml` with ``first_order=True``."""
    return maml(apply, first_order=True, **kw)  # type: ignore[arg-type]


def metasgd(apply: ApplyFn, **kw: object) -> MetaLearner:
    """Meta-SGD: :func:`maml` with learned per-parameter inner learning rates."""
    return maml(apply, learn_lr=True, **kw)  # type: ignore[arg-type]


def anil(apply: ApplyFn, *, head: str = "head", **kw: object) -> MetaLearner:
    """ANIL: :func:`maml` adapting only the params under ``head`` in the inner loop."""
    return maml(apply, adapt_prefix=head, **kw)  # type: ignore[arg-type]


__all__ = ["InnerLoop", "adapt", "anil", "fomaml", "maml", "metasgd", "task_loss"]
