"""A learner's evaluation of one task as two calls: adapt on a support set, then predict.

Every built-in learner's ``task_eval`` is an :class:`AdaptThenScore`: its ``adapt`` takes the
meta-parameters, the support set and the task's key and returns a :data:`Predict`, the adapted
model as a function of query inputs (MAML's adapted params, MAML++'s with its per-step rates
and batch-norm rows, ProtoNet's prototypes, ...); scoring a task is that function on the query
set and the objective on its output. So :func:`~funcgraph.meta.evaluate.evaluate` and a
prediction on a user's own images (``load_run(RUN).adapt(x, y).predict(q)``,
``funcgraph.runs.load``) run the same code, and give the same outputs bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from ..model import BoundApply
from ..params import Params
from ..random import Key
from .learner import Objective, Task, call, query_key

Predict = Callable[[Tensor], Tensor]
"""``predict(query_x) -> logits (classification) or values (regression)``: one task's adapted
model, forwarding with the task's query key."""

EvalAdaptFn = Callable[[Params, Tensor, Tensor, "Key | None"], Predict]
"""``adapt(meta_params, support_x, support_y, key) -> predict``: a learner's evaluation
adaptation of one task (``key``: the task's model key, or ``None``)."""


def predicting(apply: BoundApply, params: Params, key: Key | None) -> Predict:
    """``apply`` at ``params`` on query inputs, with the query key of a task keyed ``key``
    (:func:`~funcgraph.meta.learner.query_key`)."""
    qkey = query_key(key)
    return lambda x: call(apply, params, x, qkey)


@dataclass(frozen=True)
class AdaptThenScore:
    """A ``task_eval``: ``adapt`` on the support set, predict the query set, score it.

    Called as ``task_eval(meta_params, task)`` it returns ``(query loss, query metric)``, the
    loss without gradient history.

    Attributes:
        adapt: the learner's evaluation adaptation (:data:`EvalAdaptFn`).
        objective: the loss and metric that score the predictions.
    """

    adapt: EvalAdaptFn
    objective: Objective

    def __call__(self, meta_params: Params, task: Task) -> tuple[Tensor, Tensor]:
        pred = self.adapt(meta_params, task.support_x, task.support_y, task.key)(task.query_x)
        return (self.objective.loss(pred, task.query_y).detach(),
                self.objective.metric(pred, task.query_y))


__all__ = ["AdaptThenScore", "EvalAdaptFn", "Predict", "predicting"]
