"""A run directory: the resolved config, metrics and checkpoints of one training job.

Layout::

    RUN_DIR/config.json          the resolved configuration (written once, atomically)
    RUN_DIR/metrics.jsonl        one JSON object per logged step / validation / evaluation
    RUN_DIR/checkpoints/last.*   the latest checkpoint (see :mod:`funcgraph.train.checkpoint`)
    RUN_DIR/checkpoints/best.*   the best checkpoint by the validation metric

``config.json`` holds everything needed to rebuild the model and continue the job; commands
store the model under ``config["model"]`` (a registered name or a config) with its
hyperparameters, so ``funcgraph evaluate``/``export`` can rebuild it from the directory alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from .. import distributed
from ..errors import CheckpointError, ConfigError
from ..files import atomic_write
from .checkpoint import checkpoint_exists, load_checkpoint, save_checkpoint

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class Run:
    """Handle on a run directory; create with :meth:`create` or :meth:`open`."""

    path: Path
    config: dict[str, Any]

    @classmethod
    def create(
        cls,
        out: str | Path,
        config: Mapping[str, Any],
        *,
        resume: bool = False,
        may_change: Iterable[str] = ("steps",),
        env: distributed.DistEnv | None = None,
    ) -> Run:
        """Start a new run in ``out``, or continue the one there with ``resume=True``.

        A new run refuses a directory that already holds a run (so nothing is overwritten by
        accident). Resuming requires the stored config to equal ``config`` except for the keys
        in ``may_change`` (by default the step budget may be extended).

        With a multi-process ``env`` only rank 0 checks and writes the directory; the other
        ranks open it after a barrier. (Were every rank to check, one could find the config
        that rank 0 has just written and refuse it as an existing run.)
        """
        shared = env if env is not None and env.active else None
        if shared is not None and not shared.is_main:
            distributed.barrier(shared)
            return cls.open(out)
        path = Path(out)
        resolved: dict[str, Any] = json.loads(json.dumps(dict(config)))  # JSON types only
        stored_path = path / CONFIG_FILE
        if resume:
            if not stored_path.exists():
                raise CheckpointError(
                    f"--resume: no run to resume in {path} (expected {stored_path}); "
                    "start it without --resume"
                )
            stored = json.loads(stored_path.read_text())
            changed = sorted(
                k for k in set(stored) | set(resolved)
                if k not in set(may_change) and stored.get(k) != resolved.get(k)
            )
            if changed:
                diffs = ", ".join(f"{k}: {stored.get(k)!r} -> {resolved.get(k)!r}" for k in changed)
                raise ConfigError(f"--resume: options differ from the run in {path}: {diffs}")
            run = cls(path, resolved)
        else:
            if stored_path.exists():
                raise ConfigError(
                    f"{path} already holds a run; pass --resume to continue it "
                    "or --out for a new one"
                )
            run = cls(path, resolved)
        path.mkdir(parents=True, exist_ok=True)
        atomic_write(stored_path, json.dumps(resolved, indent=2, sort_keys=True).encode())
        if shared is not None:
            distributed.barrier(shared)
        return run

    @classmethod
    def open(cls, path: str | Path) -> Run:
        """Open an existing run directory (for evaluate/export)."""
        path = Path(path)
        cfg = path / CONFIG_FILE
        if not cfg.exists():
            raise CheckpointError(f"{path} is not a run directory (no {CONFIG_FILE})")
        try:
            config = json.loads(cfg.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{cfg} is not valid JSON: {e}") from None
        return cls(path, config)

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
        """Append one JSON line to ``metrics.jsonl`` (flushed at once)."""
        with open(self.path / METRICS_FILE, "a") as f:
            f.write(json.dumps(dict(record), sort_keys=True) + "\n")
            f.flush()

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


__all__ = ["CONFIG_FILE", "METRICS_FILE", "Run"]
