"""MAML++'s per-step batch-norm running statistics (BNRS), used at evaluation.

Training stays transductive (every forward normalises with its own batch's statistics, as
MAML is run). :func:`step_running_stats` accumulates one set of batch-norm running statistics
per inner step on the model's twin with running statistics (``conv4(...,
running_stats=True)``), with batch norm's own momentum update over training-split tasks
adapted as evaluation adapts; :func:`with_step_running_stats` gives the learner whose query
pass normalises with the row of the adapted params, so each query example is scored on its
own. The learner itself is :func:`funcgraph.meta.mamlpp.mamlpp`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

import torch
from torch import Tensor

from .. import random
from ..checks import check_int
from ..errors import ConfigError
from ..model import Model
from ..params import Params, State
from ..random import Key
from .adapted import AdaptThenScore, Predict
from .learner import (
    STEP_BN_PREFIX,
    STEP_LR_PREFIX,
    MetaLearner,
    Objective,
    Task,
    grad_of,
    model_params,
    query_key,
    support_keys,
)
from .mamlpp import _per_step, _sgd_step, _with_bn
from .settings import MamlppSettings


def _bn_row(step: int, steps: int) -> int:
    """The batch-norm weight row of the forward after ``step`` updates of a ``steps``-step
    inner loop: the support pass of step ``step``, or the query pass (``step == steps``), which
    uses the last step's row as in :func:`mamlpp_loss`."""
    return max(min(step, steps - 1), 0)


def _support_loss(forward: Callable[[Params, int, Key | None], Tensor], objective: Objective,
                  y: Tensor, f: Params, *, step: int, key: Key | None) -> Tensor:
    """The support loss of ``forward(f, step, key)`` (one inner step's objective)."""
    return objective.loss(forward(f, step, key), y)


def step_running_stats(
    stats_model: Model,
    meta_params: Params,
    tasks: Task,
    *,
    steps: int,
    inner_lr: float,
    objective: Objective,
) -> list[State]:
    """BNRS: batch norm's running statistics per inner step, accumulated over ``tasks``.

    ``stats_model`` is the meta-trained model's twin with running statistics (same params,
    state ``*.running_mean/running_var``; ``conv4(..., running_stats=True)``). Row ``k``
    (``k = 0 .. steps``) holds the statistics of forwards with the params after ``k`` inner
    updates: each task of the batch (drawn from the training split), one after another,
    adapts for ``steps`` first-order steps as evaluation does (learned rates, per-step
    batch-norm weights, batch statistics), and its support set forwarded in training mode with
    the params after ``k`` updates moves row ``k`` by batch norm's momentum update. Row
    ``steps`` (the params the query pass sees) is measured on the support set too: support and
    query examples come from the same classes, and the query set is what evaluation must not
    look at.
    """
    check_int("step_running_stats", "steps", steps, minimum=0)
    rows = [stats_model.init(random.key(0))[1] for _ in range(steps + 1)]
    if not rows[0]:
        raise ConfigError(f"step_running_stats: model {stats_model.name} keeps no running "
                          "statistics (build its twin with running_stats=True)")
    rates = _per_step(meta_params, STEP_LR_PREFIX)
    bn = _per_step(meta_params, STEP_BN_PREFIX)

    def accumulate(task: Task) -> None:
        """Move every row by the forwards of one task's adaptation."""

        def forward(f: Params, step: int, key: Key | None) -> Tensor:
            pred, rows[step] = stats_model.apply(_with_bn(f, bn, _bn_row(step, steps)),
                                                 rows[step], task.support_x, key=key,
                                                 train=True)
            return pred

        fast = model_params(meta_params)
        for step, step_key in enumerate(support_keys(task.key, steps + 1)):
            if step == steps:
                with torch.no_grad():
                    forward(fast, step, step_key)
                break
            loss = partial(_support_loss, forward, objective, task.support_y, step=step,
                           key=step_key)
            fast = _sgd_step(fast, grad_of(loss, fast), rates, inner_lr, step)

    for t in range(tasks.support_x.shape[0]):
        accumulate(tasks.pick(t))
    return rows


def with_step_running_stats(
    learner: MetaLearner, stats_model: Model, rows: Sequence[State]
) -> MetaLearner:
    """``learner`` (a MAML++ learner) whose evaluation scores every query example on its own:
    the query pass after the last inner step normalises with row ``steps`` of the per-step
    running statistics (:func:`step_running_stats`), in evaluation mode, instead of with the
    query batch's statistics.

    The support passes keep the support set's own statistics: the support set is given whole,
    and the inner rates were meta-learned with batch statistics. Adapting in evaluation mode
    instead (every pass on its step's row, the paper's literal reading) diverged on glyph
    tasks: a conv4 meta-trained with learned rates up to 1.1 reached query losses of 3.6e4 to
    5.3e5, because a fixed normalisation no longer cancels the scale of a weight update as
    batch statistics do.

    Raises:
        ConfigError: ``learner`` is not MAML++, or ``rows`` has not one row per evaluation
            step plus one.
    """
    settings = learner.settings
    if not isinstance(settings, MamlppSettings):
        raise ConfigError(f"with_step_running_stats: per-step running statistics belong to "
                          f"MAML++ (--algo mamlpp), not {learner.name}")
    steps, inner_lr = settings.eval_steps, settings.inner_lr
    if len(rows) != steps + 1:
        raise ConfigError(f"with_step_running_stats: {learner.name} evaluates with {steps} "
                          f"inner steps, so it needs {steps + 1} rows of statistics, got "
                          f"{len(rows)}")
    obj = learner.objective

    def forward(f: Params, step: int, key: Key | None, *, bn: Params, x: Tensor,
                train: bool) -> Tensor:
        pred, _ = stats_model.apply(_with_bn(f, bn, _bn_row(step, steps)), rows[step], x,
                                    key=key, train=train)
        return pred

    def eval_adapt(meta_params: Params, x: Tensor, y: Tensor, key: Key | None) -> Predict:
        fast = model_params(meta_params)
        rates = _per_step(meta_params, STEP_LR_PREFIX)
        bn = _per_step(meta_params, STEP_BN_PREFIX)
        support = partial(forward, bn=bn, x=x, train=True)
        for step, step_key in enumerate(support_keys(key, steps)):
            loss = partial(_support_loss, support, obj, y, step=step, key=step_key)
            fast = _sgd_step(fast, grad_of(loss, fast), rates, inner_lr, step)
        qkey = query_key(key)
        return lambda q: forward(fast, steps, qkey, bn=bn, x=q, train=False)

    return replace(learner, task_eval=AdaptThenScore(eval_adapt, obj))


__all__ = ["step_running_stats", "with_step_running_stats"]
