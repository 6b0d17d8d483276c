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
from typing import TYPE_CHECKING, Any

from torch import Tensor

from ..errors import DivergedError
from .divergence import check_diverged
from .run_dir import Run

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

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


def _is_due(done: int, every: int, total_steps: int) -> bool:
    """Whether something done every ``every`` steps (and at the end) is due after ``done``."""
    return done % every == 0 or done == total_steps


def _progress_bar(cfg: LoopConfig) -> Progress:
    """The rich progress bar: description, bar, steps, metrics, rate, elapsed time and eta
    (drawn only when ``cfg.show_progress``)."""
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
    return Progress(*columns, disable=not cfg.show_progress, transient=False)


class _Loop:
    """Where one :func:`run_loop` stands, and what it does after each step.

    Attributes:
        groups: the groups after ``done`` completed steps.
        done: the completed steps.
        saved: the step of the last ``last`` checkpoint (the start step before any).
        best_value: the best validation ``cfg.best_metric`` so far (``None`` before any).
    """

    def __init__(self, run: Run, groups: Groups, cfg: LoopConfig, start_step: int,
                 best_value: float | None) -> None:
        self.run, self.cfg, self.start_step = run, cfg, start_step
        self.groups = groups
        self.done = self.saved = start_step
        self.best_value = best_value

    def save(self, tag: str) -> None:
        """Write checkpoint ``tag`` of the groups, with the step and best value in its meta
        (when the loop writes)."""
        if self.cfg.write:
            self.run.save(tag, self.groups, {**self.cfg.meta, "step": self.done,
                                             "best_value": self.best_value})

    def check_loss(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log a ``diverged`` record and raise when step ``step``'s loss is not finite or
        exceeds the bound; its groups are not kept."""
        loss = metrics.get("loss")
        if loss is None:
            return
        try:
            check_diverged(loss, step=step + 1, bound=self.cfg.divergence_bound,
                           rates=self.cfg.rates)
        except DivergedError as e:
            if self.cfg.write:
                self.run.log({"kind": "diverged", "step": step + 1, "loss": float(loss)})
            raise _diverged(e, self.saved) from None

    def report(self, progress: Progress, bar: TaskID, metrics: Mapping[str, float],
               started: float) -> None:
        """Show the step's metrics and rate on the bar, and log them every ``log_every``
        steps (and at the end)."""
        cfg = self.cfg
        elapsed = time.perf_counter() - started
        rate = (self.done - self.start_step) * cfg.items_per_step / max(elapsed, 1e-9)
        shown = {k: float(v) for k, v in metrics.items()}
        progress.update(bar, completed=self.done, metrics=_fmt(shown),
                        rate=f"{rate:.1f} {cfg.item_name}/s", description=cfg.description)
        if cfg.write and _is_due(self.done, cfg.log_every, cfg.total_steps):
            self.run.log({"kind": "train", "step": self.done, **shown,
                          f"{cfg.item_name}_per_s": rate})

    def validate(self, validate: ValidateFn, console: Console,
                 after_validation: Callable[[int, Mapping[str, float]], object] | None) -> None:
        """Validate, log and print the figures, save ``best`` on a better (not NaN) value of
        ``best_metric``, then hand the figures to ``after_validation`` (when the loop
        writes)."""
        cfg = self.cfg
        figures = {k: float(v) for k, v in validate(self.done, self.groups).items()}
        if cfg.write:
            self.run.log({"kind": "validation", "step": self.done, **figures})
        console.print(f"{cfg.label}step {self.done}: {_fmt(figures)}", highlight=False,
                      markup=False)
        if cfg.best_metric is not None and cfg.best_metric in figures:
            value = figures[cfg.best_metric]
            better = self.best_value is None or (
                value > self.best_value if cfg.maximize else value < self.best_value
            )
            if better and not math.isnan(value):
                self.best_value = value
                self.save("best")
        if after_validation is not None and cfg.write:
            after_validation(self.done, figures)

    def interrupted(self, progress: Progress) -> None:
        """On Ctrl-C: save the completed steps not yet in ``last`` and say where they are."""
        if self.done > self.saved:  # a Ctrl-C before the first step leaves no checkpoint
            self.save("last")
        if self.cfg.show_progress:
            progress.console.print(
                f"interrupted: checkpoint of step {self.done} in {self.run.checkpoint_dir}; "
                "continue with --resume" if self.done else
                "interrupted before the first step: nothing saved",
                highlight=False, markup=False)


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
    loop = _Loop(run, groups, cfg, start_step, best_value)
    progress = _progress_bar(cfg)
    started = time.perf_counter()
    try:
        with progress:
            first = f"{cfg.description}: step {start_step + 1} ({cfg.first_step})" if (
                cfg.first_step) else cfg.description
            bar = progress.add_task(first, total=cfg.total_steps, completed=start_step,
                                    metrics="", rate="")
            for step in range(start_step, cfg.total_steps):
                new_groups, metrics = step_fn(step, loop.groups)
                loop.check_loss(step, metrics)
                loop.groups, loop.done = new_groups, step + 1
                if after_step is not None:
                    after_step(loop.done)
                loop.report(progress, bar, metrics, started)
                if validate is not None and cfg.validate_every and _is_due(
                        loop.done, cfg.validate_every, cfg.total_steps):
                    loop.validate(validate, progress.console, after_validation)
                if _is_due(loop.done, cfg.checkpoint_every, cfg.total_steps):
                    loop.save("last")
                    loop.saved = loop.done
    except KeyboardInterrupt:
        loop.interrupted(progress)
        raise
    return loop.groups


def _diverged(error: DivergedError, saved: int) -> DivergedError:
    """The error that stops a run whose step diverged (its params are not kept): ``error``'s
    line and which checkpoint is kept."""
    kept = f"the checkpoint of step {saved} is kept" if saved else "no checkpoint was saved"
    return DivergedError(f"{error}; {kept} (try smaller learning rates)")


__all__ = ["Groups", "LoopConfig", "StepFn", "ValidateFn", "run_loop"]
