"""The options every training command (``meta-train``, ``train``, ``search``) shares, declared
once: the fields of :class:`RunOptions`.

A command names ``run: RunOptions`` (keyword-only) where the shared options belong in its
``--help``; :func:`run_options` puts them there, each with its own flag, panel and default, and
calls the command with their values gathered in one :class:`RunOptions`::

    @run_options(threads=1, without=("precision", "place"))
    def search(ctx: typer.Context, epochs: ... = 10, *, run: RunOptions) -> None:
        run.start()
        ...

The command's annotations are resolved when it is decorated, from its module's globals (as
typer would). Each option keeps its parameter name (``ctx.params``, ``NOT_IN_CONFIG`` and
``OPTION_FIELDS`` see ``threads``, ``import_``, ``dist_timeout`` as before). Torch-free, as
every module of this package that ``--help`` imports.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, get_type_hints

from .common import (
    BackendOption,
    DeviceOption,
    DistTimeoutOption,
    DryRunOption,
    F,
    ImportOption,
    NprocOption,
    PlaceOption,
    PrecisionOption,
    ResumeOption,
    RunDirOption,
    SeedOption,
    TensorBoardOption,
    ThreadsOption,
    console,
    distributed_env,
    resumed_config,
    run_dir,
    start_run,
    use_threads,
)

if TYPE_CHECKING:
    from ..distributed import DistEnv


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The values of a training command's shared options, in the order ``--help`` lists them
    (each panel keeps this order; the command's own options sit around them)."""

    device: DeviceOption = "auto"
    precision: PrecisionOption = None
    threads: ThreadsOption = 0
    seed: SeedOption = 0
    dry_run: DryRunOption = False
    tensorboard: TensorBoardOption = False
    import_: ImportOption = None
    place: PlaceOption = None
    out: RunDirOption = None
    resume: ResumeOption = False
    nproc: NprocOption = 1
    backend: BackendOption = "auto"
    dist_timeout: DistTimeoutOption = 600.0

    def start(self, *, threads: int | None = None) -> dict[str, Any] | None:
        """:func:`~funcgraph.commands.common.start_run` with these options, at ``threads``
        if given (a resume's count) instead of ``--threads``."""
        return start_run(threads=self.threads if threads is None else threads,
                         imports=self.import_, tensorboard=self.tensorboard,
                         resume=self.resume, out=self.out)

    def join(self) -> DistEnv:
        """Join (or start) the run's data-parallel job
        (:func:`~funcgraph.commands.common.distributed_env`)."""
        return distributed_env(self.nproc, self.backend, self.dist_timeout, self.device,
                               self.out)

    def run_dir(self, label: str, env: DistEnv) -> Path:
        """``--out``, or a new ``runs/LABEL-...`` (:func:`~funcgraph.commands.common.run_dir`)."""
        return run_dir(self.out, label, env)


class _Recorded(Protocol):
    @property
    def threads(self) -> int: ...


R = TypeVar("R", bound=_Recorded)


def resumed(recorded: R, named: frozenset[str], values: dict[str, Any],
            fields: dict[str, tuple[str, ...]], unrecorded: Collection[str]) -> R:
    """The config a ``--resume`` continues with
    (:func:`~funcgraph.commands.common.resumed_config`), its thread count applied before the
    run's data is built."""
    cfg = resumed_config(recorded, named, values, fields, unrecorded)
    use_threads(cfg.threads)
    return cfg


def echo(line: str) -> None:
    """Print one line of a run's progress as it is (no markup, no highlighting)."""
    console.print(line, highlight=False, markup=False)


def run_options(*, threads: int = 0, without: Collection[str] = ()) -> Callable[[F], F]:
    """Give a command the shared options in place of its keyword-only ``run: RunOptions``
    parameter, ``--threads`` defaulting to ``threads``, less the options named in
    ``without`` (their fields keep :class:`RunOptions`' defaults)."""
    hints = get_type_hints(RunOptions, include_extras=True)
    shared = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[f.name],
                                default=threads if f.name == "threads" else f.default)
              for f in dataclasses.fields(RunOptions) if f.name not in without]

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn, eval_str=True)
        own = signature.parameters
        assert own["run"].kind is inspect.Parameter.KEYWORD_ONLY, f"{fn.__name__}: run"
        params = [q for p in own.values() for q in (shared if p.name == "run" else [p])]

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            run = RunOptions(**{p.name: kwargs.pop(p.name) for p in shared})
            return fn(*args, run=run, **kwargs)

        command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command  # type: ignore[return-value]

    return decorate
