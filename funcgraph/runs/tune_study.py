"""The study of ``funcgraph tune``: its options, where it is stored, the pruner, and the
bookkeeping of trials that an earlier start left unfinished.

Optuna keeps the study (``STUDY/study.db`` by default, or any storage ``--storage`` names);
this module opens it with a seeded TPE sampler and the pruner chosen, and decides which
trials count against the budget and which are retried (see :mod:`funcgraph.runs.tune`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import ConfigError
from .tune_space import SearchSpace

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


def open_study(opts: TuneOptions, worker: int = 0, *, create: bool = True) -> Any:
    """The study in ``opts``' storage, created on first use (``create=False``: refused
    where there is none, as ``tune show`` and ``tune confirm`` want).

    The sampler's seed is ``seed + worker``, moved on by the trials the study already holds:
    a resumed study draws new settings instead of repeating the first start's sequence, and
    the same study state gives the same draws."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # trials get one line each from us
    storage = open_storage(storage_url(opts.study_dir, opts.storage), on_stale=retry_trial)

    if not create and STUDY_NAME not in optuna.get_all_study_names(storage):
        raise ConfigError(f"{opts.study_dir}: its storage holds no study yet; start one with "
                          "funcgraph tune run SPACE --study DIR")

    def make(sampler: Any) -> Any:
        return optuna.create_study(
            study_name=STUDY_NAME, storage=storage, direction=direction(opts.space),
            load_if_exists=True, sampler=sampler, pruner=make_pruner(opts.pruner, opts.space))

    held = len(make(optuna.samplers.RandomSampler()).get_trials(deepcopy=False))
    return make(optuna.samplers.TPESampler(seed=opts.seed + worker + 7919 * held))


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


__all__ = ["CAP_CHECK_STEPS", "DB_FILE", "MAX_RETRIES", "PRUNERS", "SPACE_FILE", "STUDY_NAME",
           "TRIALS_DIR", "TuneOptions", "cpu_seconds", "direction", "finished", "make_pruner",
           "metric_of", "open_storage", "open_study", "recover", "retry_trial", "storage_url"]
