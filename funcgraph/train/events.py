"""TensorBoard event files beside ``metrics.jsonl``, for those who have TensorBoard.

An optional sink: with ``tensorboard`` installed, a run started with ``tensorboard=True``
writes every numeric value it logs as a scalar ``<kind>/<name>`` at its step (``train/loss``,
``validation/acc``...) into ``RUN_DIR/events/``. Without it, :func:`require_tensorboard`
refuses the option before the run starts, naming the package to install.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError

EVENTS_DIR = "events"


def require_tensorboard() -> None:
    """Refuse ``--tensorboard`` when the ``tensorboard`` package is not installed."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError('--tensorboard needs the tensorboard package: pip install tensorboard '
                          '(or pip install "funcgraph[tensorboard]")')


class EventLog:
    """Scalars of logged records, written with ``torch.utils.tensorboard``."""

    def __init__(self, run_dir: Path) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(run_dir / EVENTS_DIR))

    def write(self, record: Mapping[str, Any]) -> None:
        step, kind = record.get("step"), record.get("kind", "record")
        if not isinstance(step, int):
            return
        for name, value in record.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and name != "step" \
                    and math.isfinite(value):
                self._writer.add_scalar(f"{kind}/{name}", value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


__all__ = ["EVENTS_DIR", "EventLog", "require_tensorboard"]
