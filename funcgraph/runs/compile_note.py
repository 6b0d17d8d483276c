"""What a ``meta-train --compile`` run says about compiling: the first step's progress line
("compiling the meta-step, ~43 s"), from the time the same meta-step took to compile the last
time (kept beside torch's compile cache), and each :class:`~funcgraph.meta.compiled.
CompileFallback` as one line through the run's ``echo``."""

from __future__ import annotations

import contextlib
import hashlib
import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..files import atomic_write
from ..meta.compiled import CompileFallback

TIMES_FILE = "funcgraph-compile-seconds.json"


def signature(cfg: Any) -> str:
    """What a meta-step's compiled code depends on: the algorithm and its settings, the model,
    the task shapes, the strategy and the precision (a hash of the config without its run
    length, seed and evaluation fields)."""
    data = {k: v for k, v in cfg.to_json().items() if k not in (
        "steps", "seed", "validate_every", "val_episodes", "test_episodes", "checkpoint_every")}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _times(cache: Path) -> dict[str, float]:
    try:
        data = json.loads((cache / TIMES_FILE).read_text())
        return {str(k): float(v) for k, v in data.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def compile_note(cache: Path, key: str) -> str:
    """The first step's progress text: the last compile time of this meta-step, if known."""
    seconds = _times(cache).get(key)
    if seconds is None:
        return "compiling the meta-step (the first time for these shapes: about a minute " \
               "for a conv4 on a CPU)"
    return f"compiling the meta-step, ~{seconds:.0f} s (the last time it took)"


def remember_compile(cache: Path, key: str, seconds: float) -> None:
    """Keep the first step's seconds as this meta-step's compile time."""
    times = _times(cache)
    times[key] = round(seconds, 1)
    with contextlib.suppress(OSError):  # a read-only cache costs only the estimate
        atomic_write(cache / TIMES_FILE, json.dumps(times, indent=1).encode())


@contextlib.contextmanager
def fallbacks_to(echo: Callable[[str], object]) -> Iterator[None]:
    """Inside the block, each :class:`CompileFallback` warning is one ``warning: ...`` line
    through ``echo`` instead of Python's two-line warning."""
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
            if issubclass(category, CompileFallback):
                echo(f"warning: {message}")
            else:
                shown(message, category, *args, **kwargs)

        warnings.simplefilter("always", CompileFallback)
        warnings.showwarning = show
        yield


__all__ = ["TIMES_FILE", "compile_note", "fallbacks_to", "remember_compile", "signature"]
