"""What every meta-learning algorithm shares: the task record, losses, and the learner record.

A meta-learner is a few pure functions over a flat dict of *meta-parameters* (the model's
params, plus learned inner learning rates for Meta-SGD under ``"inner_lr.<name>"``):

* ``task_grad(meta_params, task) -> (grads, loss, metric)``: the meta-gradient contribution of
  one task (MAML: the gradient of the query loss after adaptation; Reptile: the
  pseudo-gradient ``params - adapted``).
* ``task_eval(meta_params, task) -> (loss, metric)``: adapt on the support set with the
  evaluation settings and score the query set.

Both take one task; :mod:`funcgraph.meta.strategy` runs them over a batch of tasks with
``vmap`` or a loop, and the average over tasks is the meta-gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..control import in_transform
from ..errors import ConfigError
from ..params import Params

ApplyFn = Callable[[Params, Tensor], Tensor]
"""A plain ``f(params, x) -> y``; use ``funcgraph.bind(model, state)`` for a Model."""

LR_PREFIX = "inner_lr."
"""Meta-SGD's learned per-parameter inner learning rates live under this prefix."""


class Task(NamedTuple):
    """One task, or a batch of tasks with a leading ``T`` dim (a pytree, so ``vmap`` maps it).

    Classification: ``support_x (N*K, C, H, W)``, ``support_y (N*K,)`` int64 labels in
    ``[0, N)``, ``query_x (N*Q, C, H, W)``, ``query_y (N*Q,)``. Regression: ``(K, D)`` inputs
    and ``(K, 1)`` targets.
    """

    support_x: Tensor
    support_y: Tensor
    query_x: Tensor
    query_y: Tensor

    @classmethod
    def of(cls, batch: Any) -> Task:
        """A :class:`Task` from any object with the four attributes (the data samplers' batch)."""
        return cls(batch.support_x, batch.support_y, batch.query_x, batch.query_y)

    def to(self, device: torch.device | str | None = None,
           dtype: torch.dtype | None = None) -> Task:
        """Move to ``device``; cast floating tensors (inputs, regression targets) to ``dtype``."""
        def move(t: Tensor) -> Tensor:
            return t.to(device=device, dtype=dtype if t.is_floating_point() else None)

        return Task(*(move(t) for t in self))

    def pick(self, i: int | slice) -> Task:
        """Task ``i`` (or a slice of tasks) of a batch."""
        return Task(*(t[i] for t in self))

    @property
    def num_tasks(self) -> int:
        return int(self.support_x.shape[0])


class Objective(NamedTuple):
    """A training loss and the metric reported beside it (``metric_name`` names it)."""

    loss: Callable[[Tensor, Tensor], Tensor]
    metric: Callable[[Tensor, Tensor], Tensor]
    metric_name: str
    higher_is_better: bool


def accuracy(logits: Tensor, labels: Tensor) -> Tensor:
    """Fraction of rows whose arg-max is the label (a float tensor, no gradient)."""
    return (logits.argmax(dim=-1) == labels).to(logits.dtype).mean().detach()


def _mse_metric(pred: Tensor, target: Tensor) -> Tensor:
    return F.mse_loss(pred, target).detach()


OBJECTIVES: dict[str, Objective] = {
    "classification": Objective(F.cross_entropy, accuracy, "acc", True),
    "regression": Objective(F.mse_loss, _mse_metric, "mse", False),
}


def objective(kind: str) -> Objective:
    """The :class:`Objective` for ``"classification"`` (cross-entropy, accuracy) or
    ``"regression"`` (MSE, MSE)."""
    if kind not in OBJECTIVES:
        raise ConfigError(f"objective: kind must be one of {sorted(OBJECTIVES)}, got {kind!r}")
    return OBJECTIVES[kind]


TaskGradFn = Callable[[Params, Task], tuple[Params, Tensor, Tensor]]
"""``(meta_params, task) -> (grads, loss, metric)``."""

TaskEvalFn = Callable[[Params, Task], tuple[Tensor, Tensor]]
"""``(meta_params, task) -> (loss, metric)``."""


@dataclass(frozen=True)
class MetaLearner:
    """A meta-learning algorithm as pure functions; see the module docstring.

    Attributes:
        name: ``"maml"``, ``"fomaml"``, ``"metasgd"``, ``"anil"``, ``"reptile"``, ``"protonet"``.
        init: model params -> meta-params (adds learned learning rates for Meta-SGD).
        task_grad: one task's meta-gradient, loss and metric.
        task_eval: one task's query loss and metric after adaptation with the eval settings.
        objective: the loss/metric pair.
        hparams: the settings, for configs and logs.
    """

    name: str
    init: Callable[[Params], Params]
    task_grad: TaskGradFn
    task_eval: TaskEvalFn
    objective: Objective
    hparams: dict[str, Any] = field(default_factory=dict)


def grad_of(
    fn: Callable[[Params], Tensor], params: Params, *, create_graph: bool = False
) -> Params:
    """``d fn / d params``, by ``torch.func.grad`` inside a transform, else plain autograd.

    Both give the same numbers; outside transforms (the loop strategy) plain
    ``torch.autograd.grad`` avoids the per-op cost of functorch's wrappers, which made a looped
    MAML step about 1.4x slower than the clone-and-adapt baseline. ``create_graph`` keeps the
    result differentiable (second order); inside a transform that is automatic and
    ``create_graph=False`` detaches the result instead.
    """
    if in_transform():
        grads = torch.func.grad(fn)(params)
        return grads if create_graph else {n: g.detach() for n, g in grads.items()}
    leaves = {n: p if p.requires_grad else p.detach().requires_grad_() for n, p in params.items()}
    with torch.enable_grad():
        out = fn(leaves)
        grads = torch.autograd.grad(out, list(leaves.values()), create_graph=create_graph,
                                    allow_unused=True)
    return {n: torch.zeros_like(p) if g is None else g
            for (n, p), g in zip(leaves.items(), grads, strict=True)}


def task_grad_of(fn: Callable[[Params, Task], tuple[Tensor, Tensor]]) -> TaskGradFn:
    """A :data:`TaskGradFn` from a differentiable ``fn(meta_params, task) -> (loss, metric)``."""

    def task_grad(meta_params: Params, task: Task) -> tuple[Params, Tensor, Tensor]:
        out: dict[str, Tensor] = {}

        def loss_only(p: Params) -> Tensor:
            loss, metric = fn(p, task)
            out["loss"], out["metric"] = loss.detach(), metric.detach()
            return loss

        if in_transform():
            grads, (loss, metric) = torch.func.grad_and_value(fn, has_aux=True)(meta_params, task)
            return grads, loss.detach(), metric
        grads = grad_of(loss_only, {n: p.detach() for n, p in meta_params.items()})
        return grads, out["loss"], out["metric"]

    return task_grad


def model_params(meta_params: Params) -> Params:
    """The model's own params in ``meta_params`` (drops Meta-SGD's learned learning rates)."""
    return {n: p for n, p in meta_params.items() if not n.startswith(LR_PREFIX)}


__all__ = [
    "LR_PREFIX",
    "OBJECTIVES",
    "ApplyFn",
    "MetaLearner",
    "Objective",
    "Task",
    "TaskEvalFn",
    "TaskGradFn",
    "accuracy",
    "grad_of",
    "model_params",
    "objective",
    "task_grad_of",
]
