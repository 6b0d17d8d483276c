"""What every command shares: the console, clean exits for user mistakes, shared options, the
start of a training command (:func:`start_run`).

``funcgraph --help`` imports every module of this package and must not import torch
(tests/test_layers.py checks each command's ``--help``). So a command module's top imports
only typer, rich, the standard library and torch-free funcgraph modules (``errors``,
``version``, ``data.registry``), and no option's type needs torch: a choice a registry holds
(an algorithm, a dataset) is a plain ``str`` option whose help lists the names from a
torch-free table (``data/registry.py`` names its built-in loaders as ``"module:function"``
strings, imported on use) and which the command body checks after ``--import`` has run (a
click ``Choice`` fixed at start-up could not know a user's ``--import`` entries anyway).
Everything else is imported inside the command function.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import ConfigError, FuncgraphError
from ..plugins import import_plugins, import_recorded

if TYPE_CHECKING:
    from ..distributed import DistEnv

console = Console(stderr=False)
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

USER_ERROR_EXIT = 2

RUN_PANEL = "Run"
DEVICES_PANEL = "Devices and processes"
MODEL_PANEL = "Model"
DATA_PANEL = "Data"
"""Help panels (``rich_help_panel=``) the shared options sit in; a command groups its own
options in panels of its own beside these (``--help`` prints one section per panel)."""


def fail(message: str) -> typer.Exit:
    """Print ``message`` as one red line on stderr and return the exit to raise (code 2).

    Only the first line is printed (an error's later lines, such as torch's dump under an
    ``ExportError``, follow with ``FUNCGRAPH_VERBOSE=1``). The message is escaped: user text
    such as ``[bold]`` or ``[/x]`` prints as written, never as rich markup (which would vanish
    or crash the printer)."""
    import os

    first, _, rest = message.strip().partition("\n")
    err_console.print(f"[red]error:[/red] {escape(first)}", highlight=False, soft_wrap=True)
    if rest.strip() and os.environ.get("FUNCGRAPH_VERBOSE"):
        err_console.print(escape(rest.strip()), highlight=False, soft_wrap=True)
    return typer.Exit(USER_ERROR_EXIT)


MAX_INPUT_ELEMENTS = 2**27
"""The largest example input ``--input-shape`` may ask for (512 MiB of float32)."""


def parse_shape(text: str, option: str = "--input-shape") -> tuple[int, ...]:
    """``"1,1,28,28"`` (or ``1x1x28x28``) -> ``(1, 1, 28, 28)``; :class:`ConfigError` for
    anything but positive ints."""
    try:
        shape = tuple(int(p) for p in re.split(r"[,x]", text.strip()))
    except ValueError:
        shape = ()
    if not shape or any(d < 1 for d in shape):
        raise ConfigError(f"{option}: expected positive ints like 1,1,28,28, got {text!r}")
    if math.prod(shape) > MAX_INPUT_ELEMENTS:
        raise ConfigError(f"{option} {text}: {math.prod(shape):,} elements, more than the "
                          f"{MAX_INPUT_ELEMENTS:,} an example input may have")
    return shape


_OUT_OF_MEMORY = ("can't allocate memory", "out of memory", "storage size calculation overflowed")


def _out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation failure: a ``MemoryError``, torch's
    ``OutOfMemoryError`` or the CPU allocator's ``RuntimeError``."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    return any(text in str(error).lower() for text in _OUT_OF_MEMORY)


def user_errors(fn: F) -> F:
    """Turn a :class:`FuncgraphError` raised by a command into one line and exit code 2.

    An :class:`OSError` that reaches a command (a path too long, a disk full, a permission
    refused) is about a file the user named or the machine: it is printed the same way, with
    the path and the system's reason. Running out of memory past the estimate checked before
    the run (torch's allocator refusing, a ``MemoryError``) is one line too, with torch's
    first line and what to lower. Anything else is a bug in funcgraph and keeps its
    traceback. Ctrl-C exits 130 quietly (commands that train save a checkpoint before
    re-raising it).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FuncgraphError as e:
            raise fail(str(e)) from None
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            raise fail(f"{where}{e.strerror or e}") from None
        except (MemoryError, RuntimeError) as e:
            if not _out_of_memory(e):
                raise
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise fail(f"out of memory: {first}; the estimate made before the run fell short: "
                       "lower the batch, meta-batch, model or input sizes") from None
        except KeyboardInterrupt:
            err_console.print("interrupted", highlight=False)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


NprocOption = Annotated[int, typer.Option(
    min=1, max=256, rich_help_panel=DEVICES_PANEL,
    help="Data-parallel processes on this machine (spawned with torchrun); each takes "
                "its slice of every batch.")]
BackendOption = Annotated[str, typer.Option(
    rich_help_panel=DEVICES_PANEL,
    help="torch.distributed backend under torchrun or --nproc: auto (nccl on CUDA, else "
         "gloo), gloo, nccl.")]
DistTimeoutOption = Annotated[float, typer.Option(
    min=1.0, max=86400.0, rich_help_panel=DEVICES_PANEL,
    help="Seconds a rank waits for the others before the job fails.")]


def distributed_env(
    nproc: int, backend: str, timeout_s: float, device: str, out: Path | None
) -> DistEnv:
    """Join (or start) the data-parallel job a command runs in.

    Under torchrun, join the process group; with ``--nproc N > 1`` outside torchrun, re-run
    this very command line under torchrun in N processes and exit with its status; otherwise
    return the single-process environment. Distributed runs need an explicit ``--out``, the
    one run directory every rank shares.
    """
    from .. import distributed
    from ..placement import resolve_device

    distributed.check_backend(backend)
    if out is None and (nproc > 1 or distributed.launched_by_torchrun()):
        raise typer.BadParameter("a distributed run needs --out RUN_DIR shared by all ranks",
                                 param_hint="--out")
    if nproc > 1 and not distributed.launched_by_torchrun():
        argv = distributed.without_option(sys.argv[1:], "--nproc")
        raise typer.Exit(distributed.spawn(nproc, argv))
    return distributed.init(backend, timeout_s=timeout_s, device=resolve_device(device))


ThreadsOption = Annotated[int, typer.Option(
    min=0, max=4096, rich_help_panel=DEVICES_PANEL,
    help="CPU threads for torch (0: torch's default, one per core). Each command's default "
         "is the faster one measured on a 2-core machine (docs/cli.md).")]


def use_threads(threads: int) -> None:
    """Apply ``--threads`` (0 keeps torch's default)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


Precision = Literal["float32", "bf16", "auto"]
PrecisionOption = Annotated[Precision | None, typer.Option(
    rich_help_panel=DEVICES_PANEL,
    help="Compute precision: float32, bf16 (bfloat16 convolutions and matmuls, float32 "
         "params, optimiser state, losses and batch-norm statistics) or auto (bf16 where the "
         "CPU has AVX-512 BF16 or AMX, or the GPU supports it; else float32). Default: "
         "float32 (evaluate: the run's).")]


DeviceOption = Annotated[
    str,
    typer.Option(rich_help_panel=DEVICES_PANEL,
                 help="Device: auto (CUDA, then MPS, else CPU), cpu, cuda, cuda:N or mps."),
]
SeedOption = Annotated[int, typer.Option(
    min=0, max=2**31 - 1, rich_help_panel=RUN_PANEL,
    help="Seed of the root key every random draw comes from (params, data, dropout).")]
DataRootOption = Annotated[Path | None, typer.Option(
    rich_help_panel=DATA_PANEL,
    help="The folder of a dataset that needs --data-root (layouts in docs/data.md).")]
CheckpointOption = Annotated[str, typer.Option(
    rich_help_panel=RUN_PANEL,
    help="Which checkpoint of the run: best (highest validation accuracy) or last.")]
TensorBoardOption = Annotated[bool, typer.Option(
    "--tensorboard", envvar="FUNCGRAPH_TENSORBOARD", rich_help_panel=RUN_PANEL,
    help="Also write TensorBoard event files (RUN_DIR/events/) with the logged scalars; needs "
         "the tensorboard package.")]
ImportOption = Annotated[list[str] | None, typer.Option(
    "--import", envvar="FUNCGRAPH_IMPORT", rich_help_panel=RUN_PANEL,
    help="Import this Python module first, so the layers, models, ops, algorithms or "
         "datasets it registers can be named (repeatable; FUNCGRAPH_IMPORT takes several, "
         "space-separated).")]


def start_run(*, threads: int, imports: list[str] | None, tensorboard: bool, resume: bool,
              out: Path | None) -> dict[str, Any] | None:
    """The start every training command (``meta-train``, ``train``, ``search``) shares.

    Keep freed activation memory for reuse (:func:`funcgraph.allocator.keep_freed_memory`),
    apply ``--threads``, import the ``--import`` modules and, under ``--resume``, those the run
    recorded (before any name they register is looked up), refuse ``--tensorboard`` without
    the tensorboard package and ``--resume`` without ``--out``: each mistake exits before data
    or model are built.

    Returns the ``config.json`` of the run that ``--resume`` continues (the command continues
    it with the recorded options, :func:`resumed_config`), or None for a new run; a
    ``--resume`` with no run in ``--out`` is refused here, before the run directory is named
    or made (:func:`funcgraph.train.run_dir.check_resumable`).
    """
    from ..allocator import keep_freed_memory
    from ..train.events import require_tensorboard

    keep_freed_memory()
    use_threads(threads)
    import_plugins(imports)
    if tensorboard:
        require_tensorboard()
    if resume and out is None:
        raise typer.BadParameter("--resume needs --out RUN_DIR (the run to continue)",
                                 param_hint="--resume")
    if resume and out is not None:  # the run's --import modules
        from ..train import Run
        from ..train.run_dir import check_resumable

        check_resumable(out)
        recorded = Run.open(out).config
        import_recorded(recorded, out)
        return recorded
    return None


def named_options(ctx: typer.Context) -> frozenset[str]:
    """The options the user named, on the command line or through their environment variable,
    by parameter name (``meta_batch``, ``set_``); the others hold the command's defaults."""
    def source(name: str) -> str:  # by name: typer may bring a click of its own
        found = ctx.get_parameter_source(name)
        return "" if found is None else found.name

    return frozenset(n for n in ctx.params if source(n) in ("COMMANDLINE", "ENVIRONMENT"))


C = TypeVar("C")


def resumed_config(recorded: C, named: frozenset[str], values: dict[str, Any],
                   fields: dict[str, tuple[str, ...]] | None = None,
                   unrecorded: Collection[str] = ()) -> C:
    """The config a ``--resume`` continues with: ``recorded`` (the run's own, a frozen
    dataclass), with the fields of the options the user named taken from ``values`` (config
    field -> the value the options give). An option sets the field of its own name, or the
    fields ``fields[option]`` lists (``--episodes`` sets ``test_episodes``); the options in
    ``unrecorded`` (``--device``, ``--out``) set none. An option left out keeps the run's
    value, never the command's default; the run directory then compares the result with the
    run's config and refuses a change it does not allow, naming only the options given.

    Raises:
        TypeError: a named option neither in ``unrecorded`` nor giving a value for each of its
            fields: a command that would drop it silently (a bug, never the user's).
    """
    from dataclasses import replace

    taken: dict[str, Any] = {}
    for name in sorted(named):
        if name in unrecorded:
            continue
        for f in (fields or {}).get(name, (name,)):
            if f not in values:
                raise TypeError(f"resumed_config: option {name!r} sets field {f!r}, which the "
                                "command gives no value for; map it or list it as unrecorded")
            taken[f] = values[f]
    return replace(recorded, **taken)  # type: ignore[type-var]


ResumeOption = Annotated[bool, typer.Option(
    "--resume", rich_help_panel=RUN_PANEL,
    help="Continue the run in --out from its last checkpoint.")]
RunDirOption = Annotated[Path | None, typer.Option(
    rich_help_panel=RUN_PANEL,
    help="Run directory (default: a new one under runs/, named after the run and its start "
         "time).")]


def run_dir(out: Path | None, label: str, env: DistEnv) -> Path:
    """The run directory a training command writes, said once by the main process: ``--out``,
    or when it is not given ``runs/LABEL-YYYYmmdd-HHMMSS`` (its start time, local clock)."""
    import time

    if out is None:
        out = Path("runs") / f"{label}-{time.strftime('%Y%m%d-%H%M%S')}"
    if env.is_main:
        console.print(f"run directory: {out}", highlight=False, markup=False, soft_wrap=True)
    return out


PlaceOption = Annotated[str | None, typer.Option(
    "--place", rich_help_panel=DEVICES_PANEL,
    help="Placement plan spreading the model's params over devices, e.g. "
         "'stem=cuda:0,*=cuda:1' (longest prefix wins; * for the rest). "
         "Activations follow their params.")]


DryRunOption = Annotated[bool, typer.Option(
    "--dry-run", rich_help_panel=RUN_PANEL,
    help="Check everything (options, data, model, one step, memory), print the resolved "
         "config, and write nothing.")]


def show_plan(config: dict[str, Any], lines: list[str]) -> None:
    """Print a ``--dry-run``'s resolved config (JSON) and its summary lines."""
    import json

    console.print(json.dumps(config, indent=2, sort_keys=True), highlight=False, markup=False,
                  soft_wrap=True)
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


RUN_OPTIONS_NOT_IN_CONFIG: dict[str, str] = {
    "dry_run": "writes nothing: no run to record",
    "tensorboard": "another copy of metrics.jsonl's numbers",
    "import_": "the run directory records the modules as config.json's imports and a resume "
               "imports them again (funcgraph.plugins)",
    "out": "the run directory itself",
    "resume": "continues the run in --out; nothing of its own to record",
    "nproc": "the data-parallel world size, recorded in each checkpoint",
    "backend": "how the ranks talk (gloo, nccl), chosen for the device",
    "dist_timeout": "how long a rank waits for the others; no result depends on it",
}
"""The options every training command shares that set no ``config.json`` key, each with why
its value needs no record; a command's own ``NOT_IN_CONFIG`` extends it."""
