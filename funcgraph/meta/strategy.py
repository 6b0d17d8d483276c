"""Running a per-task function over a batch of tasks: ``vmap`` or a Python loop.

Both give the same meta-gradient (the mean over tasks of each task's gradient, equal to
rounding); which is faster depends on the device and the task shape:

* ``"loop"`` runs one task at a time. Peak memory is one task's graph: the memory-saving
  choice for second order, and the faster one on CPU when tasks are large (15 queries per
  class); see ``benchmarks/meta_step.py`` and ``docs/meta-learning.md``.
* ``"vmap"`` runs all tasks as one batched computation (``torch.func.vmap``): few large
  kernels, which is what accelerators want; ``chunk_size`` bounds its memory (it maps that
  many tasks at a time), down to one task per chunk.

``"auto"`` takes the measured default for the device (:data:`DEFAULT_STRATEGY`); ``"measure"``
times both on the real batch and keeps the faster (:func:`measure_strategies`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError
from ..params import Params
from .learner import Task, TaskEvalFn, TaskGradFn

STRATEGIES = ("loop", "vmap")
CHOICES = ("auto", "measure", *STRATEGIES)

DEFAULT_STRATEGY: dict[str, str] = {
    # Measured on CPU (docs/meta-learning.md): at the meta-train default shape (5-way 1-shot,
    # 1 query per class, 32 tasks, strided conv4) vmap takes 0.84 s of CPU per meta-step
    # against 1.2 s for the loop. At 15 queries per class vmap's large temporaries make the
    # loop the better choice there (--strategy loop). Accelerators want few large kernels.
    "cpu": "vmap",
    "cuda": "vmap",
    "mps": "vmap",
}


def _check(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")


def mean_task_grads(
    task_grad: TaskGradFn,
    meta_params: Params,
    tasks: Task,
    *,
    strategy: str = "loop",
    chunk_size: int | None = None,
) -> tuple[Params, Tensor, Tensor]:
    """The mean over the tasks of ``task_grad``: ``(grads, loss, metric)``.

    Arguments:
        task_grad: ``(meta_params, one task) -> (grads, loss, metric)``.
        meta_params: shared by every task.
        tasks: a batch of ``T`` tasks (leading dim ``T`` on every tensor).
        strategy: ``"loop"`` or ``"vmap"``.
        chunk_size: with ``"vmap"``, map at most this many tasks at a time (memory bound).
    """
    _check(strategy)
    num = tasks.num_tasks
    if strategy == "vmap":
        grads, loss, metric = torch.func.vmap(
            task_grad, in_dims=(None, 0), chunk_size=chunk_size
        )(meta_params, tasks)
        return {n: g.mean(0) for n, g in grads.items()}, loss.mean(), metric.mean()
    total: Params = {}
    losses: list[Tensor] = []
    metrics: list[Tensor] = []
    for t in range(num):
        grads, loss, metric = task_grad(meta_params, tasks.pick(t))
        total = grads if t == 0 else {n: total[n] + g for n, g in grads.items()}
        losses.append(loss)
        metrics.append(metric)
    mean_grads = {n: g / num for n, g in total.items()}
    return mean_grads, torch.stack(losses).mean(), torch.stack(metrics).mean()


def task_evals(
    task_eval: TaskEvalFn,
    meta_params: Params,
    tasks: Task,
    *,
    strategy: str = "loop",
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-task ``(losses (T,), metrics (T,))`` of ``task_eval`` over a batch of tasks."""
    _check(strategy)
    if strategy == "vmap":
        loss, metric = torch.func.vmap(task_eval, in_dims=(None, 0), chunk_size=chunk_size)(
            meta_params, tasks
        )
        return loss, metric
    pairs = [task_eval(meta_params, tasks.pick(t)) for t in range(tasks.num_tasks)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def measure_strategies(run: Callable[[str], Any], *, repeats: int = 2) -> dict[str, float]:
    """Median seconds of ``run(strategy)`` for each strategy (after one warm-up call each)."""
    times: dict[str, list[float]] = {s: [] for s in STRATEGIES}
    for s in STRATEGIES:
        run(s)
    for _ in range(repeats):
        for s in STRATEGIES:  # interleaved, so load changes hit both alike
            start = time.perf_counter()
            run(s)
            times[s].append(time.perf_counter() - start)
    return {s: sorted(v)[len(v) // 2] for s, v in times.items()}


def resolve_strategy(
    strategy: str, device: torch.device | str, *, probe: Callable[[str], Any] | None = None
) -> str:
    """``"loop"`` or ``"vmap"`` for ``strategy`` in :data:`CHOICES` on ``device``.

    ``"auto"`` looks up :data:`DEFAULT_STRATEGY`; ``"measure"`` times ``probe(strategy)``
    (a meta-step on a real batch) with :func:`measure_strategies` and keeps the faster.
    """
    if strategy not in CHOICES:
        raise ConfigError(f"strategy must be one of {CHOICES}, got {strategy!r}")
    if strategy == "auto":
        return DEFAULT_STRATEGY.get(torch.device(device).type, "loop")
    if strategy == "measure":
        if probe is None:
            raise ConfigError("resolve_strategy: 'measure' needs a probe function")
        times = measure_strategies(probe)
        return min(times, key=lambda s: times[s])
    return strategy


__all__ = [
    "CHOICES",
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "mean_task_grads",
    "measure_strategies",
    "resolve_strategy",
    "task_evals",
]
