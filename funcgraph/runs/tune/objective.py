"""One trial of ``funcgraph tune``: draw the knobs, meta-train the trial's run directory,
report each validation to the pruner, return the best validation figure; and a trial's line.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ...errors import ConfigError
from ...plugins import import_recorded
from ...train import Run
from ..meta_training.loop import meta_train
from ..meta_training.plan import model_config
from ..task_sources import TaskSources, sources_for
from .study import (
    CAP_CHECK_STEPS,
    TRIALS_DIR,
    Echo,
    TuneOptions,
    attempt_cpu_s,
    higher_is_better,
    metric_of,
    origin,
    shown_setting,
    shown_value,
)


def trial_dir(study_dir: Path, number: int) -> Path:
    return study_dir / TRIALS_DIR / f"trial-{number:04d}"


def import_study_plugins(study_dir: Path) -> None:
    """Import the ``--import`` modules the study's trials were run with (recorded in each
    trial's ``config.json``), so reading the study later needs no ``--import``."""
    for config in sorted((study_dir / TRIALS_DIR).glob("trial-*/config.json"))[:1]:
        import_recorded(Run.open(config.parent).config, config.parent)


def validations(run_dir: Path, metric: str) -> dict[int, float]:
    """Each validation ``metric`` in a run's ``metrics.jsonl``, by step (empty where no run
    or no validation is recorded)."""
    if not (run_dir / "config.json").is_file():
        return {}
    return {int(r["step"]): float(r[metric]) for r in Run.open(run_dir).metrics()
            if r.get("kind") == "validation" and metric in r}


def best_validation(run_dir: Path, metric: str) -> float | None:
    """The best validation ``metric`` in a run's ``metrics.jsonl`` (the ``best``
    checkpoint's: the highest accuracy, the lowest error), or ``None`` before its first
    validation."""
    values = list(validations(run_dir, metric).values())
    if not values:
        return None
    return max(values) if higher_is_better(metric) else min(values)


class Objective:
    """One trial: draw the knobs, meta-train the trial's run directory, report each
    validation, return the best validation accuracy."""

    def __init__(self, opts: TuneOptions, echo: Echo, worker: int = 0) -> None:
        self.opts, self.echo, self.worker = opts, echo, worker
        self._sources: dict[tuple[Any, ...], TaskSources] = {}

    def sources(self, cfg: Any) -> TaskSources:
        key = (cfg.dataset, cfg.tasks, cfg.train_queries, cfg.data_root, cfg.rotate,
               cfg.image_size)
        if key not in self._sources:
            self._sources[key] = sources_for(cfg)
        return self._sources[key]

    def __call__(self, trial: Any) -> float:
        """Run one attempt of ``trial`` (a retry resumes its first attempt's run directory)
        and return the run's best validation figure; what the attempt ended with (pruned,
        failed, interrupted, its CPU seconds) stays in the trial's attributes."""
        drawn, first = self._begin(trial)
        out = trial_dir(self.opts.study_dir, first)
        started = time.process_time()
        with _outcome_recorded(trial, out, self.opts.space, started):
            self._meta_train(trial, drawn, first, out, started)
        value = best_validation(out, metric_of(self.opts.space))
        if value is None:
            raise ConfigError(f"trial {trial.number}: no validation ran (set validate_every)")
        return value

    def _begin(self, trial: Any) -> tuple[dict[str, Any], int]:
        """``(the knobs drawn, the trial whose run this attempt continues)``: the trial
        itself, or the one a retry retries. Sets the trial's attributes anew (Optuna's retry
        copies the failed attempt's): its run directory, worker and process, and what the
        result depends on beside the config, for the command that reproduces it (the
        threads again at the first step: a retry resumes with its run's count)."""
        drawn = {k.name: draw(trial, k) for k in self.opts.space.knobs}
        first = origin(trial.study.get_trials(deepcopy=False)[trial.number])
        out = trial_dir(self.opts.study_dir, first)
        trial.set_user_attr("run_dir", str(out.relative_to(self.opts.study_dir)))
        trial.set_user_attr("worker", self.worker)
        trial.set_user_attr("process", f"{socket.gethostname()} pid {os.getpid()}")
        trial.set_user_attr("interrupted", False)
        trial.set_user_attr("cpu_s", 0.0)
        trial.set_user_attr("cpu_of", trial.number)  # cpu_s is this attempt's from here on
        trial.set_user_attr("threads", torch.get_num_threads())
        trial.set_user_attr("device", self.opts.device)
        return drawn, first

    def _meta_train(self, trial: Any, drawn: dict[str, Any], first: int, out: Path,
                    started: float) -> None:
        """Meta-train ``out`` with the ``drawn`` settings (resuming it on a retry), without
        the test: each validation and step go to the pruner and the CPU cap through an
        :class:`_Attempt`. A trial's first attempt refuses a directory that already holds a
        run (one this study does not know), leaving it as it is."""
        space = self.opts.space
        if first == trial.number and (out / "config.json").is_file():
            raise ConfigError(f"{out.relative_to(self.opts.study_dir)} holds a run this "
                              "study does not know (another study's, or a lost store's); "
                              "it is left as it is: move it away or use a new study "
                              "directory")
        cfg = space.config(drawn)
        sources = self.sources(cfg)
        cfg = replace(cfg, model=model_config(cfg.algo, sources,
                                              overrides=space.model_overrides(drawn)))
        attempt = _Attempt(trial, out, metric_of(space), cfg.steps, self.opts.trial_cpu_s,
                           started)
        tag = f"trial {trial.number}" + (
            f" (retry of trial {first})" if first != trial.number else "")
        # A worker's echo says which worker; the loop's own step lines need both.
        label = (f"worker {self.worker}, " if self.opts.workers > 1 else "") + tag
        meta_train(cfg, out, resume=(out / "config.json").is_file(), device=self.opts.device,
                   sources=sources, show_progress=False,
                   echo=lambda line: self.echo(f"[{tag}] {line}"), label=f"[{label}] ",
                   on_validation=attempt.report, on_step=attempt.at_step, score_test=False)
        attempt.catch_up()  # a retry of an attempt that had run every step


class _Attempt:
    """What one attempt of a trial tells Optuna while its run trains: each validation
    reported to the pruner (a retry's earlier attempt's too), and a stop where the attempt's
    CPU seconds, projected to the last step, pass the cap.

    Arguments:
        out: the trial's run directory.
        metric: the validation figure the study is scored by.
        steps: the run's step budget.
        cap: ``--trial-cpu-s`` (``None``: no cap).
        started: ``time.process_time()`` when the attempt began.
    """

    def __init__(self, trial: Any, out: Path, metric: str, steps: int, cap: float | None,
                 started: float) -> None:
        self.trial, self.out, self.metric, self.steps, self.cap = trial, out, metric, steps, cap
        self.started = started
        self.begun: int | None = None  # the step this attempt started from (a retry resumes)
        self.reported: set[int] = set()

    def catch_up(self) -> None:
        """Report the run's validations this attempt has not (a retry's earlier attempt ran
        them), so the pruner and the table see the whole curve."""
        earlier = {s: v for s, v in validations(self.out, self.metric).items()
                   if s not in self.reported}
        for done, value in sorted(earlier.items()):
            self.trial.report(value, done)
        if earlier:
            self.reported.update(earlier)
            self.trial.set_user_attr("validated", max(self.reported))

    def over_cap(self, step: int) -> None:
        """Prune the trial where this attempt's CPU seconds so far, projected from the steps
        it has run to the run's last step, pass the cap."""
        import optuna

        used, base = time.process_time() - self.started, self.begun or 0
        projected = used * (self.steps - base) / max(1, step - base)
        if self.cap is not None and projected > self.cap:
            raise optuna.TrialPruned(
                f"over the CPU cap: {used:.0f} CPU s by step {step} projects "
                f"{projected:.0f} CPU s to step {self.steps}, over --trial-cpu-s "
                f"{self.cap:g}")

    def report(self, step: int, figures: Any) -> None:
        """After a validation: record the step and the CPU seconds so far, report the
        figure to the pruner, and stop the trial where the cap or the pruner says so."""
        import optuna

        self.trial.set_user_attr("validated", step)  # also where no value is reported
        self.trial.set_user_attr("cpu_s", round(time.process_time() - self.started, 2))
        if self.metric in figures:
            self.trial.report(float(figures[self.metric]), step)
            self.reported.add(step)
        self.over_cap(step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step}")

    def at_step(self, step: int) -> None:
        """After each meta-step: at the attempt's first, note where it began (a retry
        resumed after ``step - 1``), the thread count it runs with, and catch up with the
        earlier attempt's validations; :data:`CAP_CHECK_STEPS` steps in, check the cap."""
        if self.begun is None:
            self.begun = step - 1
            self.trial.set_user_attr("threads", torch.get_num_threads())
            self.catch_up()
        if step - self.begun == CAP_CHECK_STEPS:
            self.over_cap(step)


@contextmanager
def _outcome_recorded(trial: Any, out: Path, space: Any, started: float) -> Iterator[None]:
    """Record in the trial's attributes how the attempt inside the block ended, letting the
    exception on: ``interrupted`` (with the step of a validation a Ctrl-C landed after,
    before it was reported), ``pruned`` and why, or the ``failure`` in one line; and the
    attempt's CPU seconds in every case."""
    import optuna

    try:
        yield
    except KeyboardInterrupt:
        trial.set_user_attr("interrupted", True)
        # A Ctrl-C may land after a validation's record, before it was reported.
        done = max(validations(out, metric_of(space)), default=0)
        if done > int(trial.user_attrs.get("validated", 0)):
            trial.set_user_attr("validated", done)
        raise
    except optuna.TrialPruned as e:
        trial.set_user_attr("pruned", str(e))
        raise
    except Exception as e:
        trial.set_user_attr("failure", f"{type(e).__name__}: {e}".splitlines()[0][:300])
        raise
    finally:
        trial.set_user_attr("cpu_s", round(time.process_time() - started, 2))


def draw(trial: Any, knob: Any) -> Any:
    """The trial's value of ``knob`` from Optuna's ``suggest_*``."""
    if knob.kind == "choice":
        return trial.suggest_categorical(knob.name, list(knob.choices))
    if knob.kind == "int":
        return trial.suggest_int(knob.name, int(knob.low), int(knob.high), log=knob.log)
    return trial.suggest_float(knob.name, float(knob.low), float(knob.high), log=knob.log)


def describe(trial: Any, metric: str = "acc") -> str:
    """One line for a finished trial."""
    state = trial.state.name.lower()
    cpu = f"{attempt_cpu_s(trial):.0f} CPU s"
    params = " ".join(f"{k}={shown_setting(v)}" for k, v in trial.params.items())
    name = f"trial {trial.number}" + (
        f" (retry of trial {origin(trial)}, in {trial.user_attrs.get('run_dir')})"
        if origin(trial) != trial.number else "")
    if state == "complete":
        head = f"{name}: {metric} {shown_value(trial.value, metric)}"
    elif state == "pruned":
        steps = max(trial.intermediate_values, default=0)
        last = trial.intermediate_values.get(steps)
        why = trial.user_attrs.get("pruned", f"pruned at step {steps}")
        head = f"{name}: {why}" + (
            f" ({metric} {shown_value(last, metric)})" if last is not None else "")
    else:
        reason = trial.user_attrs.get("failure") or (
            "interrupted" if trial.user_attrs.get("interrupted") else "failed")
        head = f"{name}: failed ({reason})"
    return f"{head}, {cpu}; {params}"


__all__ = ["Objective", "best_validation", "describe", "draw", "trial_dir", "validations"]
