"""What every command shares: the console, clean exits for user mistakes, shared options."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from ..errors import FuncgraphError

console = Console(stderr=False)
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

USER_ERROR_EXIT = 2


def fail(message: str) -> typer.Exit:
    """Print ``message`` as one red line on stderr and return the exit to raise (code 2)."""
    err_console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(USER_ERROR_EXIT)


def user_errors(fn: F) -> F:
    """Turn a :class:`FuncgraphError` raised by a command into one line and exit code 2.

    Anything else is a bug in funcgraph and keeps its traceback. Ctrl-C exits 130 quietly
    (commands that train save a checkpoint before re-raising it).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FuncgraphError as e:
            raise fail(str(e)) from None
        except KeyboardInterrupt:
            err_console.print("interrupted", highlight=False)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


DeviceOption = Annotated[
    str,
    typer.Option(help="Device: auto (CUDA, then MPS, else CPU), cpu, cuda, cuda:N or mps."),
]
SeedOption = Annotated[int, typer.Option(min=0, help="Seed of the run's root key.")]
