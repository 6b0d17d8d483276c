"""Reptile (Nichol et al., 2018) as a :class:`~funcgraph.meta.learner.MetaLearner`.

For each task, run ``k`` steps of SGD from the meta-parameters ``theta`` to ``W_task``; the
meta-update is ``theta <- theta + eps * mean_tasks(W_task - theta)``. Here a task contributes
the pseudo-gradient ``theta - W_task``, so plain SGD with learning rate ``eps`` on the mean
pseudo-gradient *is* Reptile's update (Adam on it is the common variant). The inner loop
fits all of a task's examples (support and query); no second-order term is involved. With task
keys, inner step ``i`` uses the support key of step ``i`` and the query forward the query key
(the schedule is in :mod:`funcgraph.meta.learner`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..model import BoundApply
from ..params import Params
from .learner import MetaLearner, Task, call, check_apply, objective, query_key
from .maml import InnerLoop, adapt


def reptile(
    apply: BoundApply,
    *,
    kind: str = "classification",
    inner_steps: int = 5,
    inner_lr: float = 0.1,
    eval_steps: int | None = None,
) -> MetaLearner:
    """Reptile over ``apply(params, x)``; see the module docstring.

    Arguments:
        apply: ``f(params, x) -> prediction``; tasks with keys need it to take ``key=``.
        inner_steps, inner_lr: SGD steps and rate of the inner loop in training.
        eval_steps: inner steps at evaluation (adapting on the support set only).
    """
    apply, uses_keys = check_apply(apply, "reptile")
    obj = objective(kind)
    train_inner = InnerLoop(inner_steps, inner_lr, first_order=True)
    eval_inner = InnerLoop(inner_steps if eval_steps is None else eval_steps, inner_lr,
                           first_order=True)

    def task_grad(meta_params: Params, task: Task) -> tuple[Params, Tensor, Tensor]:
        x = torch.cat([task.support_x, task.query_x])
        y = torch.cat([task.support_y, task.query_y])
        fast = adapt(apply, meta_params, x, y, loss=obj.loss, inner=train_inner, key=task.key)
        pseudo = {n: (p - fast[n]).detach() for n, p in meta_params.items()}
        loss, metric = query_score(fast, task)
        return pseudo, loss, metric

    def task_eval(meta_params: Params, task: Task) -> tuple[Tensor, Tensor]:
        fast = adapt(apply, meta_params, task.support_x, task.support_y, loss=obj.loss,
                     inner=eval_inner, key=task.key)
        return query_score(fast, task)

    def query_score(fast: Params, task: Task) -> tuple[Tensor, Tensor]:
        """``(loss, metric)`` of the adapted params on the query set, no gradient kept."""
        pred = call(apply, fast, task.query_x, query_key(task.key))
        return obj.loss(pred, task.query_y).detach(), obj.metric(pred, task.query_y)

    hparams = {"inner_steps": inner_steps, "inner_lr": inner_lr,
               "eval_steps": eval_inner.steps, "kind": kind}
    return MetaLearner("reptile", dict, task_grad, task_eval, obj, hparams, uses_keys=uses_keys)


__all__ = ["reptile"]
