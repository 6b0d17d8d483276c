"""The training loop every command shares: progress, metrics, checkpoints, Ctrl-C, resume.

The loop knows nothing about models. It owns a dict of tensor groups (``"params"``,
``"state"``, ``"opt"``...) and calls ``step_fn(step, groups) -> (groups, metrics)`` for each
step. The step function must derive its randomness from the step number
(``random.fold_in(root_key, step)``), never from a stateful generator: then the groups saved
at step ``s`` are all it takes to continue, and a resumed run ends bit-identical to an
uninterrupted one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from ..errors import DivergedError
from .divergence import check_diverged
from .run_dir import Run

Groups = dict[str, dict[str, Tensor]]
StepFn = Callable[[int, Groups], tuple[Groups, Mapping[str, float]]]
ValidateFn = Callable[[int, Groups], Mapping[str, float]]


@dataclass(frozen=True)
class LoopConfig:
    """How the loop reports and saves.

    Attributes:
        total_steps: the step budget; the loop runs steps ``start_step .. total_steps - 1``.
        checkpoint_every: write ``last`` every this many steps (and always at the end).
        validate_every: call ``validate`` every this many steps (0: never).
        log_every: append a metrics record every this many steps.
        best_metric: validation metric whose improvement writes the ``best`` checkpoint.
        maximize: whether larger ``best_metric`` is better.
        items_per_step: for the rate column (tasks or examples per step).
        item_name: unit of the rate column.
        show_progress: draw the rich progress bar (rank 0 only in distributed runs).
        write: write metrics and checkpoints (rank 0 only in distributed runs).
        label: put before each printed step line (``[trial 3] `` in a settings study, where
            several runs print to one terminal).
        divergence_bound: a loss above it stops the run as diverged
            (:func:`~funcgraph.train.divergence.check_diverged`; default: only NaN and
            infinite losses).
        rates: the learning rates by name, for the diverged message.
        first_step: what the run's first step does beside the step itself (sampling its
            data, warming up, compiling), shown on the bar until that step is done, so a
            first step of minutes says what it is doing.
    """

    total_steps: int
    checkpoint_every: int = 100
    validate_every: int = 0
    log_every: int = 10
    best_metric: str | None = None
    maximize: bool = True
    items_per_step: int = 1
    item_name: str = "items"
    show_progress: bool = True
    write: bool = True
    description: str = "training"
    meta: dict[str, Any] = field(default_factory=dict)
    divergence_bound: float = math.inf
    rates: dict[str, float] = field(default_factory=dict)
    first_step: str = ""
    label: str = ""


def _fmt(metrics: Mapping[str, float]) -> str:
    return "  ".join(f"{k} {v:.4g}" for k, v in metrics.items())


def run_loop(
    run: Run,
    groups: Groups,
    step_fn: StepFn,
    cfg: LoopConfig,
    *,
    start_step: int = 0,
    validate: ValidateFn | None = None,
    best_value: float | None = None,
    after_validation: Callable[[int, Mapping[str, float]], object] | None = None,
    after_step: Callable[[int], object] | None = None,
) -> Groups:
    """Run steps ``start_step .. cfg.total_steps - 1`` and return the final groups.

    Checkpoint ``last`` holds the groups after ``meta["step"]`` completed steps. On Ctrl-C the
    completed steps are saved before ``KeyboardInterrupt`` propagates. ``after_validation``
    is called with the step and the validation's figures once its record is in
    ``metrics.jsonl`` and a better value is saved as ``best`` (the run layer redraws its
    curves there; a settings search reports the figures to its pruner, which may stop the
    run by raising). ``after_step`` is called with the number of completed steps after each
    step (a settings search checks its CPU budget there). A loss that is not finite or exceeds
    ``cfg.divergence_bound`` logs a ``diverged`` record and raises
    :class:`~funcgraph.errors.DivergedError`.
    """
    done = saved = start_step

    def save(tag: str, extra: Mapping[str, Any] | None = None) -> None:
        if cfg.write:
            run.save(tag, groups, {**cfg.meta, "step": done, "best_value": best_value,
                                   **(extra or {})})

    from rich.progress import (  # the bar's machinery loads when a loop runs, not on import
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[metrics]}"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    ]
    progress = Progress(*columns, disable=not cfg.show_progress, transient=False)
    started = time.perf_counter()
    try:
        with progress:
            first = f"{cfg.description}: step {start_step + 1} ({cfg.first_step})" if (
                cfg.first_step) else cfg.description
            bar = progress.add_task(first, total=cfg.total_steps, completed=start_step,
                                    metrics="", rate="")
            for step in range(start_step, cfg.total_steps):
                new_groups, metrics = step_fn(step, groups)
                loss = metrics.get("loss")
                if loss is not None:
                    try:
                        check_diverged(loss, step=step + 1, bound=cfg.divergence_bound,
                                       rates=cfg.rates)
                    except DivergedError as e:
                        if cfg.write:
                            run.log({"kind": "diverged", "step": step + 1, "loss": float(loss)})
                        raise _diverged(e, saved) from None
                groups, done = new_groups, step + 1
                if after_step is not None:
                    after_step(done)
                elapsed = time.perf_counter() - started
                rate = (done - start_step) * cfg.items_per_step / max(elapsed, 1e-9)
                shown = {k: float(v) for k, v in metrics.items()}
                progress.update(bar, completed=done, metrics=_fmt(shown),
                                rate=f"{rate:.1f} {cfg.item_name}/s",
                                description=cfg.description)
                if cfg.write and (done % cfg.log_every == 0 or done == cfg.total_steps):
                    run.log({"kind": "train", "step": done, **shown,
                             f"{cfg.item_name}_per_s": rate})
                if validate is not None and cfg.validate_every and (
                    done % cfg.validate_every == 0 or done == cfg.total_steps
                ):
                    val = {k: float(v) for k, v in validate(done, groups).items()}
                    if cfg.write:
                        run.log({"kind": "validation", "step": done, **val})
                    progress.console.print(f"{cfg.label}step {done}: {_fmt(val)}", highlight=False,
                                           markup=False)
                    if cfg.best_metric is not None and cfg.best_metric in val:
                        value = val[cfg.best_metric]
                        better = best_value is None or (
                            value > best_value if cfg.maximize else value < best_value
                        )
                        if better and not math.isnan(value):
                            best_value = value
                            save("best")
                    if after_validation is not None and cfg.write:
                        after_validation(done, val)
                if done % cfg.checkpoint_every == 0 or done == cfg.total_steps:
                    save("last")
                    saved = done
    except KeyboardInterrupt:
        if done > saved:  # a Ctrl-C before the first step leaves no checkpoint to resume
            save("last")
        if cfg.show_progress:
            progress.console.print(
                f"interrupted: checkpoint of step {done} in {run.checkpoint_dir}; continue "
                "with --resume" if done else "interrupted before the first step: nothing saved",
                highlight=False, markup=False)
        raise
    return groups


def _diverged(error: DivergedError, saved: int) -> DivergedError:
    """The error that stops a run whose step diverged (its params are not kept): ``error``'s
    line and which checkpoint is kept."""
    kept = f"the checkpoint of step {saved} is kept" if saved else "no checkpoint was saved"
    return DivergedError(f"{error}; {kept} (try smaller learning rates)")


__all__ = ["Groups", "LoopConfig", "StepFn", "ValidateFn", "run_loop"]
