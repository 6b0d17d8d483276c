"""Reptile (Nichol et al., 2018) as a :class:`~funcgraph.meta.learner.MetaLearner`.

For each task, run ``k`` steps of SGD from the meta-parameters ``theta`` to ``W_task``; the
meta-update is ``theta <- theta + eps * mean_tasks(W_task - theta)``. Here a task contributes
the pseudo-gradient ``theta - W_task``, so plain SGD with learning rate ``eps`` on the mean
pseudo-gradient *is* Reptile's update (Adam on it is the common variant). The inner loop
fits all of a task's examples (support and query); no second-order term is involved. With task
keys, inner step ``i`` uses the support key of step ``i`` and the query forward the query key
(the schedule is in :mod:`funcgraph.meta.learner`).

The inner optimiser is SGD or, as in the paper's experiments, Adam with ``beta1 = 0``
(``inner_optimizer="adam"``). The paper's code keeps Adam's second-moment estimate across
tasks (its optimiser slots are not among the variables Reptile resets); here every task starts
from a fresh Adam state, so a task's adaptation depends on that task alone and tasks stay
independent under ``vmap``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import check_int
from ..errors import ConfigError
from ..model import BoundApply
from ..params import Params
from ..random import Key
from ..train import adam
from .adapted import AdaptThenScore, Predict, predicting
from .binding import ModelLike
from .learner import (
    MetaLearner,
    Task,
    call,
    check_apply,
    objective,
    query_key,
)
from .maml_family import InnerLoop, adapt
from .registry import TaskInfo
from .settings import INNER_OPTIMIZERS, ReptileSettings

ADAM_BETAS = (0.0, 0.999)
"""The paper's inner Adam: no first-moment averaging (``beta1 = 0``)."""


def reptile(
    apply: ModelLike,
    *,
    kind: str = "classification",
    inner_steps: int = ReptileSettings.inner_steps,
    inner_lr: float = ReptileSettings.inner_lr,
    eval_steps: int | None = ReptileSettings.eval_steps,
    inner_optimizer: str = ReptileSettings.inner_optimizer,
    ways: int | None = None,
) -> MetaLearner:
    """Reptile over ``apply(params, x)``; see the module docstring.

    Arguments:
        apply: ``f(params, x) -> prediction``, or a Model or ``nn.Module`` bound for
            training by the learner (:mod:`funcgraph.meta.binding`); tasks with keys need it
            to take ``key=``.
        inner_steps: steps of the inner loop in training.
        inner_lr: the learning rate of the inner loop.
        eval_steps: inner steps at evaluation (adapting on the support set only; ``None``:
            ``inner_steps``).
        inner_optimizer: ``"sgd"`` or ``"adam"`` (``betas = (0, 0.999)``, fresh per task).
        ways: classes per task, for an inner loop over class-balanced minibatches: step ``i``
            fits the ``i``-th example of every class (cycling), as many examples as a 1-shot
            support set, instead of all of the task's examples at once; ``None``: all at once
            (the registry's builder passes the tasks' ways when
            :attr:`~funcgraph.meta.settings.ReptileSettings.inner_minibatches` is on).

    Raises:
        ConfigError: an argument out of range or of the wrong type (naming it and the value).
    """
    settings = ReptileSettings(inner_steps, inner_lr,
                               inner_steps if eval_steps is None else eval_steps,
                               inner_optimizer, ways is not None)
    if ways is not None:
        check_int("reptile", "ways", ways)
    apply, uses_keys, model = check_apply(apply, "reptile")
    obj = objective(kind)
    train_inner = InnerLoop(inner_steps, inner_lr, first_order=True)
    eval_inner = InnerLoop(settings.eval_steps, inner_lr, first_order=True)

    def fit(params: Params, x: Tensor, y: Tensor, inner: InnerLoop, key: Tensor | None,
            minibatches: bool = False) -> Params:
        rule = None if inner_optimizer == "sgd" else adam(inner.lr, betas=ADAM_BETAS)
        return adapt(apply, params, x, y, loss=obj.loss, inner=inner, key=key, optimizer=rule,
                     minibatches=minibatches)

    def task_grad(meta_params: Params, task: Task) -> tuple[Params, Tensor, Tensor]:
        x = torch.cat([task.support_x, task.query_x])
        y = torch.cat([task.support_y, task.query_y])
        if ways is not None:
            order = torch.argsort(y, stable=True)  # grouped by class, (ways * per_class,)
            x = x[order].unflatten(0, (ways, -1)).transpose(0, 1)
            y = y[order].unflatten(0, (ways, -1)).transpose(0, 1)
        fast = fit(meta_params, x, y, train_inner, task.key, minibatches=ways is not None)
        pseudo = {n: (p - fast[n]).detach() for n, p in meta_params.items()}
        loss, metric = query_score(fast, task)
        return pseudo, loss, metric

    def eval_adapt(meta_params: Params, x: Tensor, y: Tensor, key: Key | None) -> Predict:
        return predicting(apply, fit(meta_params, x, y, eval_inner, key), key)

    def query_score(fast: Params, task: Task) -> tuple[Tensor, Tensor]:
        """``(loss, metric)`` of the adapted params on the query set, no gradient kept."""
        pred = call(apply, fast, task.query_x, query_key(task.key))
        return obj.loss(pred, task.query_y).detach(), obj.metric(pred, task.query_y)

    return MetaLearner("reptile", dict, task_grad, AdaptThenScore(eval_adapt, obj), obj, settings,
                       uses_keys=uses_keys, model=model)


def build_reptile(apply: BoundApply, settings: ReptileSettings, info: TaskInfo
                  ) -> MetaLearner:
    """The registry's builder: :func:`reptile` with ``settings`` for ``info``'s tasks."""
    if settings.inner_minibatches and info.ways is None:
        raise ConfigError("reptile: inner_minibatches takes one example of every class per "
                          "step; regression tasks have no classes (set it to False)")
    return reptile(apply, kind=info.kind, inner_steps=settings.inner_steps,
                   inner_lr=settings.inner_lr, eval_steps=settings.eval_steps,
                   inner_optimizer=settings.inner_optimizer,
                   ways=info.ways if settings.inner_minibatches else None)


__all__ = ["INNER_OPTIMIZERS", "build_reptile", "reptile"]
