"""The ``funcgraph`` command line: a Typer app that mounts one module per command.

Commands live in :mod:`funcgraph.commands`; to add one, write a module there with a
``register(app)`` function and name it in ``COMMANDS`` below. Every command gets the help
layout of :mod:`funcgraph.commands.help_layout` (rich panels in a terminal, plain text with
full flag names elsewhere).
"""

from __future__ import annotations

import importlib
from typing import Annotated

import typer
from typer.core import TyperCommand

from .commands import help_layout
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
    "tune",
    "runs_on_disk",
    "docgen",
]

app = typer.Typer(
    name="funcgraph",
    help="Dynamic-graph deep learning as pure functions on torch.func.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    cls=help_layout.Group,
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


def _with_help_layout(typer_app: typer.Typer) -> None:
    """Give each command registered on ``typer_app`` (and on its groups) the help layout,
    unless it chose a class of its own."""
    for command in typer_app.registered_commands:
        if command.cls in (None, TyperCommand):  # typer's default (None in older releases)
            command.cls = help_layout.Command
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _with_help_layout(group.typer_instance)


for _name in COMMANDS:
    importlib.import_module(f"funcgraph.commands.{_name}").register(app)
_with_help_layout(app)


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
        if type(e).__name__ == "NoArgsIsHelpError" or not e.format_message():
            # no command given: the message is the help (rich has already printed it)
            if e.format_message():
                typer.echo(e.format_message())
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
