"""Held-out evaluation of a meta-learner: mean over episodes with a 95% confidence interval.

The protocol of the few-shot literature: sample ``episodes`` tasks (600 by default) from the
held-out split, adapt on each support set, score each query set, and report the mean metric
+- ``1.96 * std / sqrt(n)`` (normal approximation; ``std`` is the sample standard deviation,
with ``n - 1``; the one formula is :func:`funcgraph.data.confidence_interval`).

A learner whose model takes keys (:attr:`~funcgraph.meta.learner.MetaLearner.uses_keys`) gets
one key per task, from the batch's key on a stream the samplers never draw from, so the tasks
drawn (and a key-free model's scores) are exactly those of an evaluation without keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .. import random
from ..checks import check_choice, check_int
from ..data.tasks import confidence_interval
from ..errors import ConfigError
from ..params import Params
from ..precision import at_least_float32, check_precision
from ..random import Key
from .learner import MetaLearner, Task
from .strategy import STRATEGIES, task_evals

TaskSampler = Callable[[Key, int], Task]
"""``sample(key, num_tasks) -> Task``: a deterministic batch of tasks from one split."""

_TASK_KEYS_TAG = 0x7461736B
"""``fold_in`` tag of the per-task model keys under a batch's key (ASCII ``"task"``): far from
the small tags and ``split`` counters that samplers use on that key."""


@dataclass(frozen=True)
class EvalResult:
    """Mean metric +- 95% CI over ``episodes`` tasks, and the mean query loss."""

    metric_name: str
    mean: float
    ci95: float
    loss: float
    episodes: int

    def __str__(self) -> str:
        scale, unit = (100.0, "%") if self.metric_name == "acc" else (1.0, "")
        return (f"{self.metric_name} {self.mean * scale:.2f}{unit} +- {self.ci95 * scale:.2f}"
                f"{unit} (95% CI, {self.episodes} tasks)")

    def as_record(self) -> dict[str, float | int | str]:
        return {self.metric_name: self.mean, f"{self.metric_name}_ci95": self.ci95,
                "loss": self.loss, "episodes": self.episodes}

    @classmethod
    def from_record(cls, metric_name: str, record: Mapping[str, Any]) -> EvalResult:
        """The result that :meth:`as_record` wrote into ``record`` (a run's test line)."""
        return cls(metric_name, float(record[metric_name]),
                   float(record[f"{metric_name}_ci95"]), float(record["loss"]),
                   int(record["episodes"]))


EVAL_BATCH = 50
"""Tasks :func:`evaluate` draws and scores at once by default."""


def evaluate(
    learner: MetaLearner,
    meta_params: Params,
    sample: TaskSampler,
    *,
    key: Key,
    episodes: int = 600,
    batch: int = EVAL_BATCH,
    strategy: str = "auto",
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    precision: str = "float32",
) -> EvalResult:
    """Evaluate ``learner`` at ``meta_params`` on ``episodes`` tasks from ``sample``.

    Tasks are drawn ``batch`` at a time with keys ``fold_in(key, i)``, so the result depends
    only on ``key`` (not on ``batch``'s effect on timing). When the learner's model takes keys,
    task ``t`` of batch ``i`` gets ``split(fold_in(fold_in(key, i), _TASK_KEYS_TAG), n)[t]``.
    ``dtype`` casts the inputs. ``strategy`` runs the tasks as
    :func:`~funcgraph.meta.strategy.task_evals` does (``"auto"``: the measured default for the
    device and task size, as ``funcgraph meta-train`` evaluates). ``precision="bf16"``
    computes each task's convolutions and matmuls in bfloat16 (:mod:`funcgraph.precision`).

    Raises:
        ConfigError: an argument of the wrong kind or out of range.
    """
    if not isinstance(learner, MetaLearner):
        raise ConfigError(f"evaluate: learner must be a MetaLearner, got "
                          f"{type(learner).__name__}")
    if not callable(sample):
        raise ConfigError(f"evaluate: sample must be a function (key, num_tasks) -> Task, got "
                          f"{sample!r}")
    check_int("evaluate", "episodes", episodes)
    check_int("evaluate", "batch", batch)
    random.check_key("evaluate", key, batch=False)
    check_choice("evaluate", "strategy", strategy, ("auto", *STRATEGIES))
    check_precision("evaluate", precision)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ConfigError(f"evaluate: dtype must be None or a floating torch dtype, got "
                          f"{dtype!r}")
    losses: list[Tensor] = []
    metrics: list[Tensor] = []
    done = 0
    for i in range(math.ceil(episodes / batch)):
        n = min(batch, episodes - done)
        batch_key = random.fold_in(key, i)
        tasks = sample(batch_key, n)
        if learner.uses_keys:
            tasks = tasks.with_keys(random.split(random.fold_in(batch_key, _TASK_KEYS_TAG), n))
        tasks = tasks.to(device, dtype)
        loss, metric = task_evals(learner.task_eval, meta_params, tasks, strategy=strategy,
                                  precision=precision)
        losses.append(at_least_float32(loss.detach().cpu()))
        metrics.append(at_least_float32(metric.detach().cpu()))
        done += n
    mean, ci = confidence_interval(torch.cat(metrics))
    return EvalResult(learner.objective.metric_name, mean, ci, torch.cat(losses).mean().item(),
                      episodes)


__all__ = ["EVAL_BATCH", "EvalResult", "TaskSampler", "confidence_interval", "evaluate"]
