"""What ``funcgraph tune`` runs: an Optuna study over ``meta-train`` settings.

Optuna does the searching (a seeded TPE sampler, a Hyperband or successive-halving pruner,
the study store); this module says what is ours: the objective (one ordinary ``meta-train``
run per trial, choosing on the validation split's best accuracy, the held-out test never
looked at), the budget (trials, wall seconds, CPU hours, a CPU cap per trial), and the study
directory::

    STUDY/space.toml        the space the study was started with (a later start must match)
    STUDY/study.json        the study's name and storage (tune show and confirm read it)
    STUDY/study.db          the SQLite study store (unless --storage names another)
    STUDY/trials/trial-0007 trial 7's run directory: config, metrics, checkpoints, curves

Each validation of a trial is reported to the pruner, which may stop the trial (``pruned``).
A trial whose run diverges or is refused fails with the reason in its ``failure`` attribute,
and the study goes on. Ctrl-C saves the running trial's checkpoint and exits; the same command
again retries each interrupted trial with the same settings, resuming from its checkpoint in
its own run directory (so no step is trained twice), and then samples on. A trial whose process
was killed is retried the same way: with the default store at the next start (the directory
lock says no process is running it), with an RDB store by Optuna's heartbeat.

The study (options, storage, pruner, which trials count and which are retried) is
:mod:`~funcgraph.runs.tune_study`; one trial is :mod:`~funcgraph.runs.tune_objective`; the
space is :mod:`~funcgraph.runs.tune_space`; ``tune show`` and ``tune confirm`` are
:mod:`~funcgraph.runs.tune_report` and :mod:`~funcgraph.runs.tune_confirm`.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from pathlib import Path
from typing import Any

from ..errors import ConfigError, RunDirectoryError
from ..files import atomic_write
from ..plugins import import_plugins
from ..train.ownership import OWN_FILES, RunLock
from .tune_objective import Objective, describe
from .tune_space import check_model_knobs, parse_space
from .tune_study import (
    SPACE_FILE,
    Echo,
    TuneOptions,
    cpu_seconds,
    finished,
    metric_of,
    open_study,
    recover,
)


def run_worker(opts: TuneOptions, worker: int, echo: Echo = print) -> None:
    """One worker: sample and run trials on the shared study until a budget is spent."""
    import torch

    from ..allocator import keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(opts.threads or max(1, (os.cpu_count() or 1) // opts.workers))
    import_plugins(opts.imports)
    study = open_study(opts, worker)

    def after(study: Any, trial: Any) -> None:
        if not trial.user_attrs.get("interrupted"):
            echo(describe(trial, metric_of(opts.space)))
        if _spent(study, opts):
            study.stop()

    if _spent(study, opts):
        return
    # Any exception a trial raises fails that trial with its reason (the objective records
    # it) and the study goes on; Ctrl-C is not an Exception and stops the worker.
    study.optimize(Objective(opts, echo, worker), timeout=opts.timeout_s, callbacks=[after],
                   catch=(Exception,), gc_after_trial=True)


def _spent(study: Any, opts: TuneOptions) -> bool:
    """Whether the study has used its trials or its CPU hours."""
    return (opts.trials is not None and finished(study) >= opts.trials) or (
        opts.cpu_hours is not None and cpu_seconds(study) >= 3600 * opts.cpu_hours)


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
    def interrupt(signum: int, frame: object) -> None:
        # Once: a stop sent to the process group and passed on by the command arrives twice,
        # and a second interrupt must not break the checkpoint the first one is saving.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def prepare(opts: TuneOptions) -> RunLock | None:
    """Check and claim the study directory: the space file it was started with must equal
    ``opts.space`` (a changed space is a new study), and without ``--storage`` no other
    process may hold the directory. Returns the held lock (``None`` with a shared store).
    The space file is written once the study is open (:func:`keep_space`)."""
    opts.study_dir.mkdir(parents=True, exist_ok=True)
    lock = None if opts.shared else RunLock(opts.study_dir).acquire()
    stored = opts.study_dir / SPACE_FILE
    try:
        if stored.is_file() and parse_space(_toml(stored), stored.read_text()) != opts.space:
            raise ConfigError(f"{opts.study_dir}: the study was started with another space "
                              f"({stored}); use a new study directory, or the same space file")
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock


def keep_space(opts: TuneOptions) -> None:
    """Write ``STUDY/space.toml`` (the space the study was started with), once."""
    stored = opts.study_dir / SPACE_FILE
    if not stored.is_file():
        atomic_write(stored, opts.space.text.encode())


def _remove_if_bare(folder: Path) -> None:
    """Remove ``folder`` if it holds nothing but its lock files: a study directory this call
    made for a study that was refused."""
    try:
        if all(p.name in OWN_FILES for p in folder.iterdir()):
            for p in folder.iterdir():
                p.unlink()
            folder.rmdir()
    except OSError:
        pass  # another process wrote there meanwhile: leave it


def _toml(path: Path) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(path.read_text())


def tune(opts: TuneOptions, echo: Echo = print) -> Any:
    """Run (or resume) the study of ``opts`` until a budget is spent; returns the study.

    With ``workers > 1`` the workers are spawned processes on the one study; Ctrl-C reaches
    each, which saves its trial, and the study can be resumed by running the same call.
    """
    check_model_knobs(opts.space)
    fresh = not opts.study_dir.exists()
    lock = prepare(opts)
    opened = False
    try:
        study = open_study(opts)
        opened = True
        keep_space(opts)
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
        if fresh and not opened:  # a refused study leaves no directory behind
            _remove_if_bare(opts.study_dir)


def _run_workers(opts: TuneOptions) -> None:
    """Run ``opts.workers`` spawned workers to the end. A Ctrl-C reaches every process of
    the terminal's group; a SIGTERM sent to this process alone is passed on to each worker,
    so either way every worker saves its trial before this one returns."""
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_worker_main, args=(opts, i), daemon=False)
               for i in range(opts.workers)]

    def pass_on(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the wait below is not cut short
        for w in workers:
            if w.is_alive():
                w.terminate()  # SIGTERM: the worker saves its trial (stop_on_sigterm)
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    if main:
        signal.signal(signal.SIGTERM, pass_on)
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    except KeyboardInterrupt:
        if main:  # a second Ctrl-C or stop: still wait for the workers' checkpoints
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        for w in workers:
            if w.is_alive():
                w.join(timeout=120)
        raise
    finally:
        if main:
            for sig, handler in previous.items():
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    codes = [w.exitcode for w in workers]
    if any(c not in (0, None) for c in codes):
        raise RunDirectoryError(f"tune: worker exit codes {codes}; the study keeps every "
                                "finished trial, run the same command to resume")


__all__ = ["TuneOptions", "keep_space", "prepare", "run_worker", "stop_on_sigterm", "tune"]
