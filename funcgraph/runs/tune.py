"""What ``funcgraph tune`` runs: an Optuna study over ``meta-train`` settings.

Optuna does the searching (a seeded TPE sampler, a Hyperband or successive-halving pruner,
the study store); this module says what is ours: the objective (one ordinary ``meta-train``
run per trial, choosing on the validation split's best accuracy, the held-out test never
looked at), the budget (trials, wall seconds, CPU hours, a CPU cap per trial), and the study
directory::

    STUDY/space.toml        the space the study was started with (a later start must match)
    STUDY/study.db          the SQLite study store (unless --storage names another)
    STUDY/trials/trial-0007 trial 7's run directory: config, metrics, checkpoints, curves

Each validation of a trial is reported to the pruner, which may stop the trial (``pruned``).
A trial whose run diverges or is refused fails with the reason in its ``failure`` attribute,
and the study goes on. Ctrl-C saves the running trial's checkpoint and exits; the same command
again retries each interrupted trial with the same settings, resuming from its checkpoint in
its own run directory (so no step is trained twice), and then samples on. A trial whose process
was killed is retried the same way: with the default store at the next start (the directory
lock says no process is running it), with an RDB store by Optuna's heartbeat.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from ..errors import ConfigError, FuncgraphError, RunDirectoryError
from ..files import atomic_write
from ..train.ownership import RunLock
from .meta_plan import model_config
from .meta_train import meta_train
from .task_sources import TaskSources, task_sources
from .tune_space import SearchSpace, parse_space

STUDY_NAME = "funcgraph"
SPACE_FILE = "space.toml"
DB_FILE = "study.db"
TRIALS_DIR = "trials"
MAX_RETRIES = 3
"""Times an interrupted or killed trial is retried before it stays failed."""

CAP_CHECK_STEPS = 10
"""A trial's CPU seconds are projected to its last step after this many steps (and again at
each validation): one that will pass ``--trial-cpu-s`` is pruned before it has cost much, and
the sampler, seeing no accuracy from it, learns to avoid such settings."""

PRUNERS = ("hyperband", "halving", "median", "none")
Echo = Callable[[str], object]


@dataclass(frozen=True)
class TuneOptions:
    """One ``funcgraph tune run``: the space, where the study lives, how to spend the budget.

    Attributes:
        storage: an Optuna storage URL (``postgresql://...``, ``mysql://...``,
            ``sqlite:///...``) or ``journal:PATH`` (a journal file, for processes sharing a
            filesystem); ``None``: ``STUDY/study.db``.
        workers: local worker processes on the study; each gets ``threads`` torch threads
            (0: the cores divided between the workers).
        trials: stop once the study holds this many finished trials (complete, pruned or
            failed for a reason; interrupted ones are retried, not counted).
        timeout_s: stop starting trials after this many wall seconds of this invocation.
        cpu_hours: stop once the study's trials have used this many CPU hours in all.
        trial_cpu_s: prune a trial whose CPU seconds, projected to its last step after
            :data:`CAP_CHECK_STEPS` steps and at each validation, exceed this cap.
        seed: the sampler's seed (worker ``i`` uses ``seed + i``).
        pruner: ``hyperband`` (default), ``halving``, ``median`` or ``none``.
        imports: ``--import`` modules each worker loads (a user's algorithms and datasets).
    """

    space: SearchSpace
    study_dir: Path
    storage: str | None = None
    workers: int = 1
    threads: int = 0
    trials: int | None = None
    timeout_s: float | None = None
    cpu_hours: float | None = None
    trial_cpu_s: float | None = None
    seed: int = 0
    pruner: str = "hyperband"
    device: str = "cpu"
    imports: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.pruner not in PRUNERS:
            raise ConfigError(f"tune: --pruner must be one of {', '.join(PRUNERS)}, got "
                              f"{self.pruner!r}")
        for name in ("trials", "timeout_s", "cpu_hours", "trial_cpu_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"tune: {name} must be a finite number > 0, got {value!r}")
        if self.workers < 1:
            raise ConfigError(f"tune: workers must be >= 1, got {self.workers}")

    @property
    def shared(self) -> bool:
        """Whether the study lives in a store other processes may share (``--storage``)."""
        return self.storage is not None


def storage_url(study_dir: Path, storage: str | None) -> str:
    """``storage`` or the study directory's SQLite file."""
    return storage if storage is not None else f"sqlite:///{(study_dir / DB_FILE).resolve()}"


def open_storage(url: str, on_stale: Callable[..., None] | None = None) -> Any:
    """The Optuna storage ``url`` names: a journal file (``journal:PATH``) or an RDB URL;
    an RDB store gets a heartbeat, so a trial whose process died is failed and retried by
    ``on_stale``."""
    import optuna

    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url[len("journal:"):]))
    import inspect
    import warnings

    kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    # Optuna 4.9 renamed the stale-trial callback; take whichever this Optuna has.
    stale = ("heartbeat_stale_trial_callback"
             if "heartbeat_stale_trial_callback" in inspect.signature(
                 optuna.storages.RDBStorage).parameters else "failed_trial_callback")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            heartbeat: dict[str, Any] = {"heartbeat_interval": 60, "grace_period": 300,
                                         stale: on_stale}
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, **heartbeat)
    except Exception as e:  # a bad URL, a missing driver, an unreachable server: one line
        raise ConfigError(f"--storage {url}: {type(e).__name__}: {str(e).splitlines()[0]}"
                          ) from None


def make_pruner(name: str, space: SearchSpace) -> Any:
    """The pruner: Hyperband or successive halving from the first validation step, the
    median rule after two trials, or none."""
    import optuna

    first = max(1, space.config(_lowest(space)).validate_every)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=first)
    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=first)
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=first)
    return optuna.pruners.NopPruner()


def _lowest(space: SearchSpace) -> dict[str, Any]:
    return {k.name: k.extremes()[0] for k in space.knobs}


def open_study(opts: TuneOptions, worker: int = 0) -> Any:
    """The study in ``opts``' storage, created on first use.

    The sampler's seed is ``seed + worker``, moved on by the trials the study already holds:
    a resumed study draws new settings instead of repeating the first start's sequence, and
    the same study state gives the same draws."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # trials get one line each from us
    storage = open_storage(storage_url(opts.study_dir, opts.storage), on_stale=retry_trial)

    def create(sampler: Any) -> Any:
        return optuna.create_study(
            study_name=STUDY_NAME, storage=storage, direction=direction(opts.space),
            load_if_exists=True, sampler=sampler, pruner=make_pruner(opts.pruner, opts.space))

    held = len(create(optuna.samplers.RandomSampler()).get_trials(deepcopy=False))
    return create(optuna.samplers.TPESampler(seed=opts.seed + worker + 7919 * held))


def metric_of(space: SearchSpace) -> str:
    """The validation metric trials are chosen on: accuracy for classification, mean squared
    error for regression."""
    from ..data.registry import dataset_type

    kind = dataset_type(space.study["dataset"]).kind
    return "acc" if kind == "classification" else "mse"


def direction(space: SearchSpace) -> Literal["maximize", "minimize"]:
    return "maximize" if metric_of(space) == "acc" else "minimize"


def retry_trial(study: Any, trial: Any) -> None:
    """Enqueue ``trial``'s settings again, marked as a retry of the trial whose run
    directory it continues (at most :data:`MAX_RETRIES` times)."""
    origin = trial.user_attrs.get("retry_of", trial.number)
    tries = sum(1 for t in study.get_trials(deepcopy=False)
                if t.user_attrs.get("retry_of") == origin)
    if tries < MAX_RETRIES:
        study.enqueue_trial(trial.params, user_attrs={"retry_of": origin})


def recover(study: Any, *, owned: bool) -> list[int]:
    """Retry the trials an earlier start left unfinished: each trial whose newest attempt
    failed with no reason (interrupted, or killed). With ``owned`` (the study directory's
    lock held over its own store) a trial still marked running is dead and is failed first.
    Returns the numbers of the trials retried."""
    from optuna.trial import TrialState

    if owned:
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            study.tell(t.number, state=TrialState.FAIL)
    attempts: dict[int, Any] = {}
    for t in study.get_trials(deepcopy=False):
        origin = int(t.user_attrs.get("retry_of", t.number))
        if origin not in attempts or t.number > attempts[origin].number:
            attempts[origin] = t
    again = [t for t in attempts.values()
             if t.state == TrialState.FAIL and "failure" not in t.user_attrs]
    for t in again:
        retry_trial(study, t)
    return [t.number for t in again]


def finished(study: Any) -> int:
    """Trials that count against ``--trials``: complete, pruned, or failed for a reason."""
    from optuna.trial import TrialState

    return sum(1 for t in study.get_trials(deepcopy=False)
               if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
               or (t.state == TrialState.FAIL and "failure" in t.user_attrs))


def cpu_seconds(study: Any) -> float:
    """CPU seconds the study's trials have used (every attempt of every trial)."""
    return sum(float(t.user_attrs.get("cpu_s", 0.0)) for t in study.get_trials(deepcopy=False))


def trial_dir(study_dir: Path, number: int) -> Path:
    return study_dir / TRIALS_DIR / f"trial-{number:04d}"


def best_validation(run_dir: Path, metric: str) -> float | None:
    """The best validation ``metric`` in a run's ``metrics.jsonl`` (the ``best``
    checkpoint's: the highest accuracy, the lowest error), or ``None`` before its first
    validation."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    values = [r[metric] for line in path.read_text().splitlines() if line.strip()
              for r in [json.loads(line)] if r.get("kind") == "validation" and metric in r]
    if not values:
        return None
    return max(values) if metric == "acc" else min(values)


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
            self._sources[key] = task_sources(cfg.dataset, spec=cfg.tasks,
                                              train_queries=cfg.train_queries,
                                              data_root=cfg.data_root, rotate=cfg.rotate,
                                              image_size=cfg.image_size)
        return self._sources[key]

    def __call__(self, trial: Any) -> float:
        import optuna

        space = self.opts.space
        drawn = {k.name: draw(trial, k) for k in space.knobs}
        origin = int(trial.user_attrs.get("retry_of", trial.number))
        out = trial_dir(self.opts.study_dir, origin)
        trial.set_user_attr("run_dir", str(out.relative_to(self.opts.study_dir)))
        trial.set_user_attr("worker", self.worker)
        started = time.process_time()
        try:
            cfg = space.config(drawn)
            sources = self.sources(cfg)
            cfg = replace(cfg, model=model_config(cfg.algo, sources,
                                                  overrides=space.model_overrides(drawn)))
            metric = metric_of(space)

            begun: list[int] = []  # the step this attempt started from (a retry resumes)

            def over_cap(step: int) -> None:
                used, base = time.process_time() - started, begun[0] if begun else 0
                cap = self.opts.trial_cpu_s
                if cap is not None and used * (cfg.steps - base) / max(1, step - base) > cap:
                    raise optuna.TrialPruned(f"over the CPU cap: {used:.0f} CPU s at step "
                                             f"{step} of {cfg.steps}")

            def report(step: int, figures: Any) -> None:
                trial.set_user_attr("cpu_s", round(time.process_time() - started, 2))
                if metric in figures:
                    trial.report(float(figures[metric]), step)
                over_cap(step)
                if trial.should_prune():
                    raise optuna.TrialPruned(f"pruned at step {step}")

            def early(step: int) -> None:
                if not begun:
                    begun.append(step - 1)
                if step - begun[0] == CAP_CHECK_STEPS:
                    over_cap(step)

            meta_train(cfg, out, resume=(out / "config.json").is_file(),
                       device=self.opts.device, sources=sources, show_progress=False,
                       echo=self.echo, on_validation=report, on_step=early, score_test=False)
        except KeyboardInterrupt:
            trial.set_user_attr("interrupted", True)
            raise
        except optuna.TrialPruned as e:
            trial.set_user_attr("pruned", str(e))
            raise
        except Exception as e:
            trial.set_user_attr("failure", f"{type(e).__name__}: {e}".splitlines()[0][:300])
            raise
        finally:
            trial.set_user_attr("cpu_s", round(time.process_time() - started, 2))
        value = best_validation(out, metric)
        if value is None:
            raise ConfigError(f"trial {trial.number}: no validation ran (set validate_every)")
        return value


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
    cpu = f"{float(trial.user_attrs.get('cpu_s', 0)):.0f} CPU s"
    params = " ".join(f"{k}={_short(v)}" for k, v in trial.params.items())
    if state == "complete":
        head = f"trial {trial.number}: {metric} {_value(trial.value, metric)}"
    elif state == "pruned":
        steps = max(trial.intermediate_values, default=0)
        last = trial.intermediate_values.get(steps)
        why = trial.user_attrs.get("pruned", f"pruned at step {steps}")
        head = f"trial {trial.number}: {why}" + (
            f" ({metric} {_value(last, metric)})" if last is not None else "")
    else:
        reason = trial.user_attrs.get("failure") or (
            "interrupted" if trial.user_attrs.get("interrupted") else "failed")
        head = f"trial {trial.number}: failed ({reason})"
    return f"{head}, {cpu}; {params}"


def _value(value: float, metric: str) -> str:
    """A validation figure as shown: accuracy in percent, an error as is."""
    return f"{100 * value:.2f}%" if metric == "acc" else f"{value:.4g}"


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def run_worker(opts: TuneOptions, worker: int, echo: Echo = print) -> None:
    """One worker: sample and run trials on the shared study until a budget is spent."""
    import torch

    from ..allocator import keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(opts.threads or max(1, (os.cpu_count() or 1) // opts.workers))
    _import_all(opts.imports)
    study = open_study(opts, worker)

    def after(study: Any, trial: Any) -> None:
        if not trial.user_attrs.get("interrupted"):
            echo(describe(trial, metric_of(opts.space)))
        if opts.trials is not None and finished(study) >= opts.trials:
            study.stop()
        if opts.cpu_hours is not None and cpu_seconds(study) >= 3600 * opts.cpu_hours:
            study.stop()

    if _spent(study, opts):
        return
    study.optimize(Objective(opts, echo, worker), timeout=opts.timeout_s, callbacks=[after],
                   catch=(FuncgraphError,), gc_after_trial=True)


def _spent(study: Any, opts: TuneOptions) -> bool:
    return (opts.trials is not None and finished(study) >= opts.trials) or (
        opts.cpu_hours is not None and cpu_seconds(study) >= 3600 * opts.cpu_hours)


def _import_all(modules: tuple[str, ...]) -> None:
    import importlib
    import sys

    if "" not in sys.path:
        sys.path.insert(0, "")
    for name in modules:
        importlib.import_module(name)


def _worker_main(opts: TuneOptions, worker: int) -> None:
    """A spawned worker process: Ctrl-C or SIGTERM ends it quietly (its trial is saved by
    then)."""
    stop_on_sigterm()
    try:
        run_worker(opts, worker, echo=lambda line: print(f"[worker {worker}] {line}",
                                                         flush=True))
    except KeyboardInterrupt:
        raise SystemExit(130) from None


def stop_on_sigterm() -> None:
    """Treat SIGTERM (a scheduler's or ``kill``'s stop) as Ctrl-C, so a running trial saves
    its checkpoint and is retried when the study resumes."""
    import signal

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def prepare(opts: TuneOptions) -> RunLock | None:
    """Check and claim the study directory: the space file it was started with must equal
    ``opts.space`` (a changed space is a new study), and without ``--storage`` no other
    process may hold the directory. Returns the held lock (``None`` with a shared store)."""
    opts.study_dir.mkdir(parents=True, exist_ok=True)
    lock = None if opts.shared else RunLock(opts.study_dir).acquire()
    stored = opts.study_dir / SPACE_FILE
    try:
        if stored.is_file():
            if parse_space(_toml(stored), stored.read_text()) != opts.space:
                raise ConfigError(f"{opts.study_dir}: the study was started with another "
                                  f"space ({stored}); use a new study directory, or the same "
                                  "space file")
        else:
            atomic_write(stored, opts.space.text.encode())
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock


def _toml(path: Path) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(path.read_text())


def tune(opts: TuneOptions, echo: Echo = print) -> Any:
    """Run (or resume) the study of ``opts`` until a budget is spent; returns the study.

    With ``workers > 1`` the workers are spawned processes on the one study; Ctrl-C reaches
    each, which saves its trial, and the study can be resumed by running the same call.
    """
    lock = prepare(opts)
    try:
        study = open_study(opts)
        again = recover(study, owned=not opts.shared)
        if again:
            echo(f"retrying interrupted trial(s) {', '.join(map(str, again))} from their "
                 "checkpoints")
        if opts.workers == 1:
            run_worker(opts, 0, echo)
        else:
            _run_workers(opts)
        return open_study(opts)
    finally:
        if lock is not None:
            lock.release()


def _run_workers(opts: TuneOptions) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_worker_main, args=(opts, i), daemon=False)
               for i in range(opts.workers)]
    for w in workers:
        w.start()
    try:
        for w in workers:
            w.join()
    except KeyboardInterrupt:
        for w in workers:  # each got the Ctrl-C too and is saving its trial
            w.join(timeout=120)
        raise
    codes = [w.exitcode for w in workers]
    if any(c not in (0, None) for c in codes):
        raise RunDirectoryError(f"tune: worker exit codes {codes}; the study keeps every "
                                "finished trial, run the same command to resume")


__all__ = ["DB_FILE", "MAX_RETRIES", "PRUNERS", "SPACE_FILE", "STUDY_NAME", "TRIALS_DIR",
           "Objective", "TuneOptions", "best_validation", "cpu_seconds", "describe",
           "finished", "open_study", "open_storage", "prepare", "recover", "retry_trial",
           "run_worker", "stop_on_sigterm", "storage_url", "trial_dir", "tune"]
