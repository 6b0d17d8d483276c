"""The ``funcgraph`` command line: a Typer app that mounts one module per command.

Commands live in :mod:`funcgraph.commands`; to add one, write a module there with a
``register(app)`` function and name it in ``COMMANDS`` below.
"""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

from .version import __version__

COMMANDS = [
    "info",
    "graph",
    "export",
    "model",
    "meta_train",
    "evaluate",
    "train",
    "search",
    "runs",
    "docgen",
]

app = typer.Typer(
    name="funcgraph",
    help="Dynamic-graph deep learning as pure functions on torch.func.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"funcgraph {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """funcgraph: every model a pure function over a parameter dict."""


for _name in COMMANDS:
    importlib.import_module(f"funcgraph.commands.{_name}").register(app)


def main() -> None:
    """Console-script entry point.

    Usage mistakes (an unknown flag, a bad value, a missing argument) print one line and exit
    with code 2, as :func:`funcgraph.commands.common.user_errors` does for library errors,
    instead of click's usage box.
    """
    import sys

    from rich.markup import escape

    from .commands.common import USER_ERROR_EXIT, err_console

    # click's UsageError (unknown option, bad value, missing argument), whichever click typer
    # uses (its own vendored copy in recent releases): BadParameter's base in every version.
    usage_error: type[typer.BadParameter] = typer.BadParameter.__mro__[1]
    try:
        code = app(standalone_mode=False)
    except usage_error as e:
        if not e.format_message():  # no command given: click has already printed the usage
            sys.exit(USER_ERROR_EXIT)
        hint = f" (see {e.ctx.command_path} --help)" if e.ctx is not None else ""
        err_console.print(f"[red]error:[/red] {escape(e.format_message() + hint)}",
                          highlight=False, soft_wrap=True)
        sys.exit(USER_ERROR_EXIT)
    except typer.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
