"""One step of meta-training, as one pure function: the step torch.func's MAML example shows.

:func:`meta_step` reads top to bottom as the algorithm does: take the learner of this
meta-step (MAML++ anneals its loss weights and derivative order by step), average the
meta-gradient over the batch of tasks (``vmap``, a loop or threads), optionally reduce it
across processes, and let the pure optimiser update the meta-parameters. Nothing is mutated;
the new params and optimiser state are returned with the step's metrics. The run layer
(:mod:`funcgraph.runs.meta_training.loop`) wraps it with task sampling, checkpoints, validation,
all-reduce and progress; a user's own loop calls it directly::

    for step in range(steps):
        tasks = sample(random.fold_in(key, step), 32)
        params, opt_state, metrics = meta_step(learner, optimizer, params, opt_state, tasks,
                                               step=step)
        check_diverged(metrics.loss, step=step + 1)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from ..checks import check_int, check_number
from ..errors import ConfigError
from ..params import Params
from ..precision import at_least_float32
from ..train import Optimizer
from .compiled import Backend, CompileFallback, note
from .learner import MetaLearner, Task, compiled_identity
from .strategy import mean_task_grads

Reduce = Callable[[Params, Tensor, Tensor], tuple[Params, Tensor, Tensor]]
"""``(grads, loss, metric) -> (grads, loss, metric)``: e.g. the mean over processes."""


@dataclass(frozen=True)
class StepMetrics:
    """The mean query loss and metric of a meta-step's tasks (scalar tensors, float32 or
    wider whatever precision the tasks computed in)."""

    loss: Tensor
    metric: Tensor


def meta_step(
    learner: MetaLearner,
    optimizer: Optimizer,
    params: Params,
    opt_state: Params,
    tasks: Task,
    *,
    step: int = 0,
    lr: float | None = None,
    strategy: str = "auto",
    chunk_size: int | None = None,
    reduce: Reduce | None = None,
    precision: str = "float32",
    compile: bool | Backend = False,
) -> tuple[Params, Params, StepMetrics]:
    """One meta-step: ``(new params, new optimiser state, metrics)``.

    Arguments:
        learner: the meta-learner (``maml(...)``, ``protonet(...)``, ...).
        optimizer: a pure optimiser (:func:`funcgraph.train.adam`, ``sgd``).
        params: the meta-parameters.
        opt_state: the optimiser's state (``optimizer.init(params)`` at the start).
        tasks: a batch of tasks (leading dim ``T``; keys, if any, one per task).
        step: the 0-based meta-step (a learner with a schedule depends on it).
        lr: the meta learning rate of this step, ``>= 0`` (a schedule may end at 0;
            ``None``: the optimiser's own).
        strategy: how tasks run, as :func:`~funcgraph.meta.strategy.mean_task_grads`.
        chunk_size: with ``"vmap"``, the tasks mapped at a time (``None``: the device's
            default; as :func:`~funcgraph.meta.strategy.mean_task_grads`).
        reduce: applied to the mean gradient, loss and metric before the update (the run
            layer's all-reduce over data-parallel processes).
        precision: ``"float32"`` or ``"bf16"`` (bfloat16 convolutions and matmuls in each
            task, float32 params, optimiser state, losses and update;
            :mod:`funcgraph.precision`).
        compile: compile the meta-gradient whole (:mod:`funcgraph.meta.compiled`; as
            :func:`~funcgraph.meta.strategy.mean_task_grads`). A learner with a schedule
            compiles each function its schedule gives more than one step (MAML++: its
            first-order warm-up, its annealed loss weights, which enter as tensors through
            :class:`~funcgraph.meta.learner.StepInputs`, and the steps after); a function
            that serves one step alone runs eagerly, and a schedule that builds a new one
            every step warns once (:class:`~funcgraph.meta.compiled.CompileFallback`).

    Raises:
        ConfigError: an argument of the wrong kind or out of range.
    """
    _check(learner, optimizer, step, lr, reduce)
    current = learner.at_step(step)
    moving = compile and _moving(learner, current, step)
    grads, loss, metric = mean_task_grads(current.task_grad, params, tasks, strategy=strategy,
                                          chunk_size=chunk_size, precision=precision,
                                          compile=False if moving else compile)
    if moving:
        note(False, moving)
    if reduce is not None:
        grads, loss, metric = reduce(grads, loss, metric)
    if lr is None:
        params, opt_state = optimizer.update(params, grads, opt_state)
    else:
        params, opt_state = optimizer.update(params, grads, opt_state, lr=lr)
    # A task computed in bfloat16 may return its loss or metric in bfloat16: reported in float32
    return params, opt_state, StepMetrics(at_least_float32(loss), at_least_float32(metric))


_WARNED: dict[int, Callable[[int], MetaLearner]] = {}
"""The schedules already said to be moving (by id; the schedule kept so its id stays its
own), so each says it once."""


def _moving(learner: MetaLearner, current: MetaLearner, step: int) -> str | None:
    """Why meta-step ``step`` of a learner with a schedule runs eagerly under ``compile``, or
    ``None``: a function that serves this step alone (the one before and the one after are
    others) would be compiled for one step. A schedule whose function changes at three steps
    in a row cannot hold still: that warns once (:class:`CompileFallback`)."""
    schedule = learner.schedule
    if schedule is None:
        return None
    mine = compiled_identity(current.task_grad)

    def at(s: int) -> object:
        return compiled_identity(learner.at_step(s).task_grad)

    if mine == at(step + 1) or (step > 0 and mine == at(step - 1)):
        return None
    reason = (f"the {learner.name} learner's schedule gives meta-step {step} a function of "
              "its own, so it runs eagerly")
    if step > 0 and (step == 1 or at(step - 1) != at(step - 2)) and id(schedule) not in _WARNED:
        if len(_WARNED) > 64:
            _WARNED.clear()
        _WARNED[id(schedule)] = schedule
        warnings.warn(f"the meta-step did not compile: the {learner.name} learner's schedule "
                      f"builds a new meta-gradient function every meta-step (at {step - 1}, "
                      f"{step} and {step + 1}), so nothing compiled could be reused; it runs "
                      "eagerly while the schedule moves. Give the values that change by step "
                      "as tensors (funcgraph.meta.learner.StepInputs) to compile it once",
                      CompileFallback, stacklevel=3)
        reason = f"{reason} (its schedule builds a new function every meta-step)"
    return reason


def _check(learner: object, optimizer: object, step: object, lr: object,
           reduce: object) -> None:
    """Refuse arguments of :func:`meta_step` of the wrong kind before anything runs."""
    if not isinstance(learner, MetaLearner):
        raise ConfigError(f"meta_step: learner must be a MetaLearner (maml(...), "
                          f"protonet(...), ...), got {type(learner).__name__}")
    if not isinstance(optimizer, Optimizer):
        raise ConfigError(f"meta_step: optimizer must be a funcgraph.train Optimizer (adam(lr), "
                          f"sgd(lr)), got {type(optimizer).__name__}")
    check_int("meta_step", "step", step, minimum=0)
    if lr is not None:
        check_number("meta_step", "lr", lr)
    if reduce is not None and not callable(reduce):
        raise ConfigError(f"meta_step: reduce must be None or a function (grads, loss, metric) "
                          f"-> (grads, loss, metric), got {reduce!r}")


__all__ = ["Reduce", "StepMetrics", "meta_step"]
