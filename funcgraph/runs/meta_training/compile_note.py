"""What a ``meta-train --compile`` run says and records about compiling.

:class:`CompileReporter` is the run's side of it: its first line names the compiler and the
cache folder (set before anything compiles, ``--strategy measure``'s probe included); a line
when a compile starts ("compiling the meta-step, ~43 s", from the time the same meta-step
took to compile the last time, kept beside torch's compile cache) and one when it ends, with
the seconds it took, whether or not the output is a terminal; a ``compile`` record in
``metrics.jsonl`` for each and ``"compiled"`` in ``config.json`` (whether the meta-step ran
compiled); each :class:`~funcgraph.meta.compiled.CompileFallback` as one line through the
run's ``echo``."""

from __future__ import annotations

import contextlib
import hashlib
import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ...files import atomic_write
from ...meta.compiled import CompileFallback, CompileRecord, recording, use_compile_cache

TIMES_FILE = "funcgraph-compile-seconds.json"

OUTCOMES = ("compiled",)
"""What a compiled run adds to its ``config.json`` once it ran: whether the meta-step ran
compiled (an outcome, not an option: a resume may find another)."""


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


class CompileReporter:
    """A run's report of its compiled meta-step (see the module docstring); ``with reporter:``
    around what takes meta-steps (the strategy probe, the loop).

    Arguments:
        cfg: the run's config (``cfg.compile``: whether it compiles at all; without, the
            reporter only turns fallback warnings into lines).
        run: the run directory (its ``log`` and ``record``), or ``None`` on a rank that does
            not write.
        echo: where lines go (``None``: nowhere).
        start: the step the run starts from.
    """

    def __init__(self, cfg: Any, run: Any, echo: Callable[[str], object] | None, *,
                 start: int) -> None:
        self.compile = bool(cfg.compile)
        self.run, self.echo = run, echo or (lambda line: None)
        self.key = signature(cfg) if self.compile else ""
        self.step = start
        self.first = True
        self.record = CompileRecord(on_start=self._started, on_done=self._done)
        self.cache = use_compile_cache() if self.compile else None
        if self.compile:
            backend = "inductor" if cfg.compile is True else cfg.compile
            self.echo(f"compile: the meta-step with torch.compile ({backend}), its code cached "
                      f"in {self.cache}")

    def at(self, step: int) -> None:
        """The meta-steps done so far (the next one is ``step + 1``)."""
        self.step = step

    def _started(self) -> None:
        assert self.cache is not None
        self.echo(f"step {self.step + 1}: {compile_note(self.cache, self.key)}")

    def _done(self, seconds: float, reason: str | None) -> None:
        assert self.cache is not None
        if reason is None:
            self.echo(f"step {self.step + 1}: compiled the meta-step in {seconds:.1f} s")
            if self.first:
                remember_compile(self.cache, self.key, seconds)
        self.first = False
        if self.run is not None:
            self.run.log({"kind": "compile", "step": self.step + 1, "compiled": reason is None,
                          "seconds": round(seconds, 3), **({"reason": reason} if reason else {})})
            self.run.record({"compiled": reason is None})

    @property
    def compiled(self) -> bool | None:
        """Whether the last meta-step ran compiled (``None``: no compiled step asked)."""
        return self.record.compiled

    def __enter__(self) -> CompileReporter:
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(fallbacks_to(self.echo))
        if self.compile:
            self._stack.enter_context(recording(self.record))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        if self.compile and self.run is not None and self.record.compiled is not None:
            self.run.record({"compiled": self.record.compiled})


__all__ = ["OUTCOMES", "TIMES_FILE", "CompileReporter", "compile_note", "fallbacks_to",
           "remember_compile", "signature"]
