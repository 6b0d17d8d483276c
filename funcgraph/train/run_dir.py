"""A run directory: the resolved config, metrics and checkpoints of one training job.

Layout::

    RUN_DIR/config.json          the resolved configuration (written once, atomically)
    RUN_DIR/metrics.jsonl        one JSON object per logged step / validation / evaluation
    RUN_DIR/checkpoints/last.*   the latest checkpoint (see :mod:`funcgraph.train.checkpoint`)
    RUN_DIR/checkpoints/best.*   the best checkpoint by the validation metric
    RUN_DIR/.lock, .owner.json   held by the one process writing the run (see ownership)

``config.json`` holds everything needed to rebuild the model and continue the job; commands
store the model under ``config["model"]`` (a registered name or a config) with its
hyperparameters, so ``funcgraph evaluate``/``export`` can rebuild it from the directory alone.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from .. import distributed
from ..errors import CheckpointError, ConfigError
from ..files import atomic_write
from ..plugins import imported_plugins
from .checkpoint import checkpoint_exists, checkpoint_step, load_checkpoint, save_checkpoint
from .events import EventLog, require_tensorboard
from .ownership import CONFIG_FILE, RunLock, check_out_dir

METRICS_FILE = "metrics.jsonl"


def check_resumable(out: str | Path) -> None:
    """Refuse ``--resume`` where ``out`` holds no run (no ``config.json``), in one line."""
    config = Path(out) / CONFIG_FILE
    if not config.is_file():
        raise CheckpointError(f"--resume: no run to resume in {out} (expected {config}); "
                              "start it without --resume")


@dataclass(frozen=True)
class Run:
    """Handle on a run directory; create with :meth:`create` or :meth:`open`.

    A created run owns its directory (:class:`~funcgraph.train.ownership.RunLock`) until
    :meth:`close`; use it as a context manager so the lock goes with the run.
    """

    path: Path
    config: dict[str, Any]
    lock: RunLock | None = field(default=None, compare=False, repr=False)
    events: EventLog | None = field(default=None, compare=False, repr=False)

    @classmethod
    def create(
        cls,
        out: str | Path,
        config: Mapping[str, Any],
        *,
        resume: bool = False,
        may_change: Iterable[str] = ("steps",),
        env: distributed.DistEnv | None = None,
        tensorboard: bool = False,
        added: Mapping[str, Any] | None = None,
    ) -> Run:
        """Start a new run in ``out``, or continue the one there with ``resume=True``.

        ``out`` must be new, empty or a run (:func:`check_out_dir`), and no other process may
        hold it. A new run refuses a directory holding a run that has saved a step (so nothing
        is overwritten by accident); a run that never saved one (a start that was killed or
        interrupted at once) is started afresh, with or without ``resume``. Resuming requires
        the stored config to equal ``config`` except for the keys in ``may_change``, and a
        step budget (``config["steps"]``) no smaller than the steps already done.

        With a multi-process ``env`` only rank 0 checks, locks and writes the directory; the
        other ranks open it after a barrier. (Were every rank to check, one could find the
        config that rank 0 has just written and refuse it as an existing run.)

        ``tensorboard=True`` also writes every logged number as a TensorBoard scalar
        (:mod:`funcgraph.train.events`; needs the ``tensorboard`` package). ``added`` names
        config keys newer than some runs, with the value a run that predates a key ran with
        (``{"precision": "float32"}``): such a run resumes when the new value is that one.
        The modules imported by ``--import`` (:func:`funcgraph.plugins.imported_plugins`) are
        recorded as ``"imports"``, for whatever reads the run later.
        """
        shared = env if env is not None and env.active else None
        if shared is not None and not shared.is_main:
            distributed.barrier(shared)
            return cls.open(out)
        path = Path(out)
        resolved: dict[str, Any] = json.loads(json.dumps(dict(config)))  # JSON types only
        if imported_plugins():  # what a later evaluate, export or --resume must import
            resolved.setdefault("imports", imported_plugins())
        check_out_dir(path)
        if resume:
            check_resumable(path)  # before the lock makes the directory
        if tensorboard:
            require_tensorboard()
        lock = RunLock(path).acquire()
        try:
            cls._check_start(path, resolved, resume, set(may_change), dict(added or {}))
            atomic_write(path / CONFIG_FILE,
                         json.dumps(resolved, indent=2, sort_keys=True).encode())
        except BaseException:
            lock.release()
            raise
        if shared is not None:
            distributed.barrier(shared)
        return cls(path, resolved, lock, EventLog(path) if tensorboard else None)

    @staticmethod
    def _check_start(path: Path, resolved: dict[str, Any], resume: bool,
                     may_change: set[str], added: dict[str, Any]) -> None:
        """Refuse what :meth:`create` refuses; clear the remains of a run that never saved."""
        stored_path = path / CONFIG_FILE
        done = _steps_done(path / "checkpoints" / "last") if stored_path.exists() else 0
        if done == 0:
            if resume:
                check_resumable(path)
            for leftover in (path / METRICS_FILE, path / "checkpoints"):
                if leftover.is_dir():
                    shutil.rmtree(leftover)
                else:
                    leftover.unlink(missing_ok=True)
            return
        if not resume:
            raise ConfigError(f"{path} already holds a run ({done} steps done); pass --resume "
                              "to continue it or --out for a new one")
        stored = {**added, **_read_config(stored_path)}
        changed = sorted(k for k in set(stored) | set(resolved)
                         if k not in may_change and stored.get(k) != resolved.get(k))
        if changed:
            diffs = ", ".join(f"{k}: {stored.get(k)!r} -> {resolved.get(k)!r}" for k in changed)
            raise ConfigError(f"--resume: options differ from the run in {path}: {diffs}")
        steps = resolved.get("steps")
        if isinstance(steps, int) and steps < done:
            raise ConfigError(f"--resume: --steps {steps} is below the {done} steps the run in "
                              f"{path} has done; pass --steps {done} or more")

    def close(self) -> None:
        """Release the directory for other processes (idempotent)."""
        if self.events is not None:
            self.events.close()
        if self.lock is not None:
            self.lock.release()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def open(cls, path: str | Path) -> Run:
        """Open an existing run directory for reading (evaluate, export); takes no lock."""
        path = Path(path)
        cfg = path / CONFIG_FILE
        if not cfg.exists():
            raise CheckpointError(f"{path} is not a run directory (no {CONFIG_FILE})")
        return cls(path, _read_config(cfg))

    def record(self, values: Mapping[str, Any]) -> None:
        """Add to ``config.json`` what the run resolved once it started (the strategy it took,
        the thread count it ran with): ``values`` replace those keys, atomically; nothing is
        written when the config holds them already."""
        resolved = json.loads(json.dumps(dict(values)))
        if all(self.config.get(k) == v and k in self.config for k, v in resolved.items()):
            return
        self.config.update(resolved)
        atomic_write(self.path / CONFIG_FILE,
                     json.dumps(self.config, indent=2, sort_keys=True).encode())

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    def has_checkpoint(self, tag: str = "last") -> bool:
        return checkpoint_exists(self.checkpoint_dir / tag)

    def save(
        self, tag: str, groups: Mapping[str, Mapping[str, Tensor]], meta: Mapping[str, Any]
    ) -> None:
        """Atomically write checkpoint ``tag`` (``"last"``, ``"best"``...)."""
        save_checkpoint(self.checkpoint_dir / tag, groups, meta)

    def load(
        self,
        tag: str = "last",
        *,
        expect: Mapping[str, Mapping[str, Tensor]] | None = None,
        device: str = "cpu",
    ) -> tuple[dict[str, dict[str, Tensor]], dict[str, Any]]:
        """Read and verify checkpoint ``tag``; see :func:`load_checkpoint`."""
        return load_checkpoint(self.checkpoint_dir / tag, expect=expect, device=device)

    def log(self, record: Mapping[str, Any]) -> None:
        """Append one JSON line to ``metrics.jsonl`` (flushed at once); non-finite numbers
        are written as ``null``, so every line stays valid JSON."""
        with open(self.path / METRICS_FILE, "a") as f:
            f.write(json.dumps(_finite(dict(record)), sort_keys=True) + "\n")
            f.flush()
        if self.events is not None:
            self.events.write(record)

    def metrics(self) -> list[dict[str, Any]]:
        """All records of ``metrics.jsonl`` (a torn last line from a crash is skipped)."""
        path = self.path / METRICS_FILE
        if not path.exists():
            return []
        records = []
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records

    def truncate_metrics(self, after_step: int) -> None:
        """Drop records logged after ``after_step`` (work lost since the last checkpoint), so a
        resumed run's metrics read as if it had never stopped."""
        kept = [r for r in self.metrics() if int(r.get("step", 0)) <= after_step]
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept)
        atomic_write(self.path / METRICS_FILE, text.encode())


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in record.items()}


def _read_config(path: Path) -> dict[str, Any]:
    """A run's ``config.json``; a truncated or hand-broken file is a :class:`CheckpointError`."""
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); the run cannot be read") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def _steps_done(last: Path) -> int:
    """The step of checkpoint ``last``, 0 when there is none."""
    return checkpoint_step(last) if checkpoint_exists(last) else 0


__all__ = ["CONFIG_FILE", "METRICS_FILE", "Run", "check_resumable"]
