"""The study of ``funcgraph tune``: its options, where it is stored, the pruner, and the
bookkeeping of trials that an earlier start left unfinished.

Optuna keeps the study (``STUDY/study.db`` by default, or any storage ``--storage`` names);
this module opens it with a seeded TPE sampler and the pruner chosen, and decides which
trials count against the budget and which are retried (see :mod:`funcgraph.runs.tune.run`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ...errors import ConfigError
from .identity import (
    TRIALS_DIR,
    StudyRecord,
    check_identity,
    check_store,
    no_study,
    remember,
    started,
    store_file,
    study_lock,
    study_record,
)
from .space import SearchSpace

SPACE_FILE = "space.toml"
MAX_RETRIES = 3
"""Times an interrupted or killed trial is retried (Optuna's ``RetryFailedTrialCallback``)
before it stays failed."""

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
            filesystem); ``None``: the one the study directory remembers, else
            ``STUDY/study.db``.
        study_name: the study's name in the storage; ``None``: the one the directory
            remembers, else the directory's name.
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
        heartbeat_s: with an RDB store, each running trial beats this often; one silent for
            :data:`GRACE_BEATS` beats (its worker died) is failed and retried by whichever
            worker starts a trial next.
    """

    space: SearchSpace
    study_dir: Path
    storage: str | None = None
    study_name: str | None = None
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
    heartbeat_s: int = 60

    def __post_init__(self) -> None:
        if self.pruner not in PRUNERS:
            raise ConfigError(f"tune: --pruner must be one of {', '.join(PRUNERS)}, got "
                              f"{self.pruner!r}")
        for name, flag in (("trials", "--trials"), ("timeout_s", "--timeout"),
                           ("cpu_hours", "--cpu-hours"), ("trial_cpu_s", "--trial-cpu-s")):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"tune: {flag} must be a number above 0 (a budget of 0 "
                                  f"runs nothing; leave the option out for no limit), got "
                                  f"{value!r}")
        if self.workers < 1:
            raise ConfigError(f"tune: --workers must be >= 1, got {self.workers}")
        if self.heartbeat_s < 1:
            raise ConfigError(f"tune: --heartbeat-s must be >= 1, got {self.heartbeat_s}")

    @property
    def record(self) -> StudyRecord:
        """The study's name and storage (:func:`~funcgraph.runs.tune.identity.study_record`)."""
        return study_record(self.study_dir, name=self.study_name, storage=self.storage)

    @property
    def shared(self) -> bool:
        """Whether the study lives in a store other processes may share (``--storage``, or
        the one the directory remembers)."""
        return self.record.storage is not None


GRACE_BEATS = 5
"""Missed heartbeats after which a running trial of an RDB store counts as dead."""

def retry_callback() -> Any:
    """Optuna's ``RetryHeartbeatStaleTrialCallback`` (``RetryFailedTrialCallback`` before
    Optuna 4.9): enqueue a dead or interrupted trial's settings again (at most
    :data:`MAX_RETRIES` times), marked with the trial it retries."""
    import warnings

    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)


def origin(trial: Any) -> int:
    """The number of the first attempt of a ``FrozenTrial``'s settings: its own, or the
    trial it retries (Optuna's ``retried_trial_number``). The run directory is the first
    attempt's, so a retry resumes its checkpoint."""
    import warnings

    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        first = RetryHeartbeatStaleTrialCallback.retried_trial_number(trial)
    return trial.number if first is None else int(first)


def attempt_cpu_s(trial: Any) -> float:
    """The CPU seconds of this attempt alone. Optuna's retry copies the failed attempt's user
    attributes into the retry, ``cpu_s`` included; the objective marks its own figure with
    ``cpu_of`` (the attempt's number), so a copied figure counts once, for the attempt that
    spent it."""
    if trial.user_attrs.get("cpu_of", trial.number) != trial.number:
        return 0.0
    return float(trial.user_attrs.get("cpu_s", 0.0))


def open_storage(url: str, heartbeat_s: int = 60) -> Any:
    """The Optuna storage ``url`` names: a journal file (``journal:PATH``) or an RDB URL.
    An RDB store gets Optuna's heartbeat: a trial whose process died is failed after
    :data:`GRACE_BEATS` silent beats and retried (:func:`retry_callback`). Optuna's journal
    store has no heartbeat: a killed worker's trial there is retried when the study is next
    started with the directory's lock (see :func:`recover`)."""
    import warnings

    import optuna

    try:
        if url.startswith("journal:"):
            from optuna.storages.journal import JournalFileBackend

            return optuna.storages.JournalStorage(JournalFileBackend(url[len("journal:"):]))
        kwargs: dict[str, Any] = ({"connect_args": {"timeout": 60}}
                                  if url.startswith("sqlite") else {})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url, engine_kwargs=kwargs, heartbeat_interval=heartbeat_s,
                grace_period=GRACE_BEATS * heartbeat_s,
                heartbeat_stale_trial_callback=retry_callback())
    except Exception as e:  # a bad URL, a missing driver, an unreachable server: one line
        raise ConfigError(f"--storage {url}: {type(e).__name__}: {str(e).splitlines()[0]}"
                          ) from None


def make_pruner(name: str, space: SearchSpace) -> Any:
    """The pruner: Hyperband or successive halving from the first validation step, the
    median rule after two trials, or none."""
    import optuna

    first = max(1, space.config(space.lowest()).validate_every)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=first)
    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=first)
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=first)
    return optuna.pruners.NopPruner()


def open_study(opts: TuneOptions, worker: int = 0, *, create: bool = True) -> Any:
    """The study of ``opts``' directory in its storage (see :mod:`~funcgraph.runs.tune.identity`:
    its name, its attributes, a lost store refused), created on first use (``create=False``:
    refused where there is none, as ``tune show`` and ``tune confirm`` want).

    The sampler is Optuna's TPE with ``constant_liar`` (parallel workers do not draw the same
    settings while each other's trials run), seeded ``seed + worker`` moved on by the trials
    the study already holds: a resumed study draws new settings instead of repeating the first
    start's sequence, and the same study state gives the same draws."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # trials get one line each from us
    # A start takes its turn with the directory's other starts (study_lock): it reads the
    # record another may have just written, and they agree on the directory's id.
    with study_lock(opts.study_dir) if create else contextlib.nullcontext():
        record = opts.record
        check_store(opts.study_dir, record)
        stored = store_file(record)
        if not create and stored is not None and not stored.is_file():  # opening would make it
            raise ConfigError(f"{opts.study_dir}: its storage holds no study {record.name!r} "
                              f"(no {stored.name}); start one with funcgraph tune run SPACE "
                              "--study DIR")
        storage = open_storage(record.url, opts.heartbeat_s)
        try:
            names = optuna.get_all_study_names(storage)
        except Exception as e:  # a file that is not a store, an unreachable server
            raise ConfigError(f"{record.url}: cannot read the study store "
                              f"({type(e).__name__}: {str(e).splitlines()[0]})") from None
        created = False
        if record.name not in names:
            if started(opts.study_dir) or not create:
                raise ConfigError(no_study(opts.study_dir, record, names))
            try:  # the store decides which of two racing starts creates it
                optuna.create_study(study_name=record.name, storage=storage,
                                    direction=direction(opts.space))
                created = True
            except optuna.exceptions.DuplicatedStudyError:
                pass  # another directory's start made it a moment ago: check_identity

        def load(sampler: Any) -> Any:
            # Loading writes nothing to the store (create_study adds a journal entry).
            return optuna.load_study(study_name=record.name, storage=storage,
                                     sampler=sampler, pruner=make_pruner(opts.pruner, opts.space))

        study = load(optuna.samplers.RandomSampler())
        record = check_identity(study, record, opts.space, metric_of(opts.space),
                                opts.study_dir, write=create, created=created)
        if create:
            remember(opts.study_dir, record)
    held = len(study.get_trials(deepcopy=False))
    return load(optuna.samplers.TPESampler(seed=opts.seed + worker + 7919 * held,
                                           constant_liar=True))


def dataset_metric(dataset: str) -> str:
    """The figure runs on ``dataset`` are scored by: accuracy for classification, mean
    squared error for regression."""
    from ...data.registry import dataset_type

    return "acc" if dataset_type(dataset).kind == "classification" else "mse"


def metric_of(space: SearchSpace) -> str:
    """The validation metric the study's trials are chosen on."""
    return dataset_metric(space.study["dataset"])


def study_metric(study: Any) -> str:
    """The validation metric an Optuna study's trials were chosen on, as the study recorded
    it (its ``metric`` attribute); for a study from before its attributes, the one its
    direction says (:func:`direction`: accuracy is maximised, an error minimised)."""
    recorded = study.user_attrs.get("metric")
    if recorded is not None:
        return str(recorded)
    return "acc" if study.direction.name == "MAXIMIZE" else "mse"


def higher_is_better(metric: str) -> bool:
    """Whether a larger ``metric`` is the better figure: accuracy; an error is not."""
    return metric == "acc"


def direction(space: SearchSpace) -> Literal["maximize", "minimize"]:
    return "maximize" if higher_is_better(metric_of(space)) else "minimize"


def shown_value(value: float, metric: str) -> str:
    """A figure as every tune line and table shows it: accuracy in percent, an error as is."""
    return f"{100 * value:.2f}%" if metric == "acc" else f"{value:.4g}"


def shown_setting(value: Any) -> str:
    """A drawn setting as lines and tables show it (4 significant digits; the command lines
    that reproduce a trial carry the exact value)."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def recover(study: Any, *, owned: bool, dead: str | None = None) -> list[int]:
    """Retry the trials an earlier start left unfinished: each trial whose newest attempt
    failed with no reason (interrupted, or killed). With ``owned`` (the study directory's
    lock held over its own store) a trial still marked running is dead and is failed first;
    with ``dead`` (a worker's ``process`` attribute, ``HOST pid N``, of a worker that died)
    so are that process's. Returns the numbers of the trials retried.

    Call it under :func:`~funcgraph.runs.tune.identity.study_lock`: two starts recovering at
    once would each queue the same retry."""
    import optuna
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if owned or (dead is not None and t.user_attrs.get("process") == dead):
            try:
                study.tell(t.number, state=TrialState.FAIL)
            except (optuna.exceptions.UpdateFinishedTrialError, ValueError, RuntimeError):
                pass  # Optuna's heartbeat failed it meanwhile (and queued its retry)
    attempts: dict[int, Any] = {}
    for t in study.get_trials(deepcopy=False):
        first = origin(t)
        if first not in attempts or t.number > attempts[first].number:
            attempts[first] = t
    again = [t for t in attempts.values()
             if t.state == TrialState.FAIL and "failure" not in t.user_attrs]
    retry = retry_callback()
    for t in again:
        retry(study, t)
    return [t.number for t in again]


def retry_unfinished(opts: TuneOptions, study: Any, *, dead: str | None = None) -> list[int]:
    """:func:`recover` under the study directory's lock, as every start and the command
    (for a worker that died, ``dead``) call it: two starts at once queue a retry once. A
    start owns its own store's running trials (none can be running); the command, with its
    other workers alive, only the dead worker's."""
    with study_lock(opts.study_dir):
        return recover(study, owned=not opts.shared and dead is None, dead=dead)


def finished(study: Any) -> int:
    """Trials that count against ``--trials``: complete, pruned, or failed for a reason. An
    interrupted or killed attempt does not count: its retry does. (Optuna's
    ``MaxTrialsCallback`` counts by state alone, so it would count the interrupted attempt
    too, and the same command after a Ctrl-C would stop before retrying it.)"""
    from optuna.trial import TrialState

    return sum(1 for t in study.get_trials(deepcopy=False)
               if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
               or (t.state == TrialState.FAIL and "failure" in t.user_attrs))


def cpu_seconds(study: Any) -> float:
    """CPU seconds the study's trials have used (every attempt of every trial, each once)."""
    return sum(attempt_cpu_s(t) for t in study.get_trials(deepcopy=False))


__all__ = ["CAP_CHECK_STEPS", "GRACE_BEATS", "MAX_RETRIES", "PRUNERS", "SPACE_FILE",
           "TRIALS_DIR", "TuneOptions", "attempt_cpu_s", "cpu_seconds", "dataset_metric",
           "direction", "finished",
           "make_pruner", "metric_of", "open_storage", "open_study", "origin", "recover",
           "retry_callback", "retry_unfinished", "shown_setting", "shown_value", "study_metric"]
