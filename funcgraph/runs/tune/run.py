"""What ``funcgraph tune`` runs: an Optuna study over ``meta-train`` settings.

Optuna does the searching (a seeded TPE sampler, a Hyperband or successive-halving pruner,
the study store); this module says what is ours: the objective (one ordinary ``meta-train``
run per trial, choosing on the validation split's best accuracy, the held-out test never
looked at), the budget (trials, wall seconds, CPU hours, a CPU cap per trial), and the study
directory::

    STUDY/space.toml        the space the study was started with (a later start must match)
    STUDY/study.json        the study's name, storage and directory id (show and confirm
                            read it; the study's attributes hold the same id)
    STUDY/study.db          the SQLite study store (unless --storage names another)
    STUDY/trials/trial-0007 trial 7's run directory: config, metrics, checkpoints, curves

Each validation of a trial is reported to the pruner, which may stop the trial (``pruned``).
A trial whose run diverges or is refused fails with the reason in its ``failure`` attribute,
and the study goes on. Ctrl-C saves the running trial's checkpoint and exits; the same command
again retries each interrupted trial with the same settings, resuming from its checkpoint in
its own run directory (so no step is trained twice), and then samples on. A trial whose process
was killed is retried the same way: with the default store at the next start (the directory
lock says no process is running it), with an RDB store by Optuna's heartbeat, and a worker of
``--workers`` that dies is seen by the command at once, which queues its trial for the living
workers (:func:`lost_worker`).

The study (options, storage, pruner, which trials count and which are retried) is
:mod:`~funcgraph.runs.tune.study`; one trial is :mod:`~funcgraph.runs.tune.objective`; the
space is :mod:`~funcgraph.runs.tune.space`; ``tune show`` and ``tune confirm`` are
:mod:`~funcgraph.runs.tune.report` and :mod:`~funcgraph.runs.tune.confirm`.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any

from ...errors import ConfigError, RunDirectoryError
from ...files import atomic_write
from ...plugins import import_plugins
from ...train.ownership import OWN_FILES, RunLock
from .identity import LOCK_FILE
from .objective import Objective, describe
from .space import check_run, parse_space
from .study import (
    SPACE_FILE,
    Echo,
    TuneOptions,
    cpu_seconds,
    finished,
    metric_of,
    open_study,
    origin,
    retry_unfinished,
)


def run_worker(opts: TuneOptions, worker: int, echo: Echo = print) -> None:
    """One worker: sample and run trials on the shared study until a budget is spent."""
    import torch

    from ...allocator import keep_freed_memory

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


def _remove_if_bare(folder: Path, made: Path) -> None:
    """Remove ``folder`` if it holds nothing but its lock files, and its empty parents up to
    ``made``: the study directory (and the folders above it) this call made for a study
    that was refused."""
    try:
        if all(p.name in OWN_FILES | {LOCK_FILE} for p in folder.iterdir()):
            for p in folder.iterdir():
                p.unlink()
            folder.rmdir()
            while folder != made and not any(folder.parent.iterdir()):
                folder = folder.parent
                folder.rmdir()
    except OSError:
        pass  # another process wrote there meanwhile: leave it


def _first_missing(folder: Path) -> Path:
    """The outermost of ``folder`` and its parents that does not exist (``folder`` itself
    where its parent does)."""
    missing = folder.absolute()
    while not missing.parent.exists():
        missing = missing.parent
    return missing


def _toml(path: Path) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(path.read_text())


def tune(opts: TuneOptions, echo: Echo = print) -> Any:
    """Run (or resume) the study of ``opts`` until a budget is spent; returns the study.

    With ``workers > 1`` the workers are spawned processes on the one study; Ctrl-C reaches
    each, which saves its trial, and the study can be resumed by running the same call.
    """
    check_run(opts.space)
    fresh = not opts.study_dir.exists()
    made = _first_missing(opts.study_dir)
    lock = prepare(opts)
    opened = False
    try:
        study = open_study(opts)
        opened = True
        keep_space(opts)
        again = retry_unfinished(opts, study)
        if again:
            echo(f"retrying interrupted trial(s) {', '.join(map(str, again))} from their "
                 "checkpoints")
        if opts.workers == 1:
            run_worker(opts, 0, echo)
        else:
            _run_workers(opts, echo)
        return open_study(opts)
    finally:
        if lock is not None:
            lock.release()
        if fresh and not opened:  # a refused study leaves no directory behind
            _remove_if_bare(opts.study_dir.absolute(), made)


def _run_workers(opts: TuneOptions, echo: Echo = print) -> None:
    """Run ``opts.workers`` spawned workers to the end. A Ctrl-C reaches every process of
    the terminal's group; a SIGTERM sent to this process alone is passed on to each worker,
    so either way every worker saves its trial before this one returns.

    A worker that dies on its own (``kill -9``, the out-of-memory killer) is seen at once:
    its running trial is failed and queued to be retried (:func:`lost_worker`), so a worker
    still running takes it up. The command then ends as the study does: with the budget
    spent it exits normally, with a line for each lost worker naming its trial's retry."""
    from multiprocessing.connection import wait

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
    lost: list[tuple[int, multiprocessing.process.BaseProcess]] = []
    try:
        for w in workers:
            w.start()
        running = list(workers)
        while running:
            ended = wait([w.sentinel for w in running])
            for w in [w for w in running if w.sentinel in ended]:
                w.join()
                running.remove(w)
                if w.exitcode != 0:
                    lost.append((workers.index(w), w))
                    lost_worker(opts, w.pid)
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
    if not lost:
        return
    study = open_study(opts)
    lines = [lost_line(study, i, w.pid, w.exitcode) for i, w in lost]
    if _spent(study, opts):
        for line in lines:
            echo(f"{line}; the study met its budget")
        return
    raise RunDirectoryError(f"tune: {'; '.join(lines)}; the study keeps every finished "
                            "trial, run the same command to go on")


def _process(pid: int | None) -> str:
    """A worker's ``process`` attribute (see the objective)."""
    return f"{socket.gethostname()} pid {pid}"


def lost_worker(opts: TuneOptions, pid: int | None) -> list[int]:
    """Fail the trials a dead worker (process ``pid`` of this host) left running and queue
    their retries (under the study's lock, as a start does), so the living workers take
    them up. Returns the numbers of the trials queued."""
    return retry_unfinished(opts, open_study(opts), dead=_process(pid))


def lost_line(study: Any, worker: int, pid: int | None, code: int | None) -> str:
    """What became of a lost worker's trial: ``worker 1 (pid 4242) was killed by SIGKILL
    in trial 3, retried as trial 5 (complete)``."""
    how = (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0
           and -code in signal.Signals._value2member_map_ else f"exited with code {code}")
    trials = study.get_trials(deepcopy=False)
    mine = [t for t in trials if t.user_attrs.get("process") == _process(pid)
            and t.state.name == "FAIL" and "failure" not in t.user_attrs]
    parts = []
    for t in mine:
        retries = [r for r in trials if origin(r) == origin(t) and r.number > t.number]
        state = retries[0].state.name.lower() if retries else ""
        fate = (f"queued to be retried as trial {retries[0].number}" if state == "waiting"
                else f"retried as trial {retries[0].number} ({state})" if retries
                else "not retried (it has been retried as often as allowed)")
        parts.append(f"in trial {t.number}, {fate}")
    return f"worker {worker} (pid {pid}) {how}" + (f" {'; '.join(parts)}" if parts else
                                                   " between trials")


__all__ = ["TuneOptions", "keep_space", "lost_line", "lost_worker", "prepare", "run_worker",
           "stop_on_sigterm", "tune"]
