"""The ``funcgraph`` command line: a Typer app that mounts one module per command.

Commands live in :mod:`funcgraph.commands`; to add one, write a module there with a
``register(app)`` function and name it in ``COMMANDS`` below.
"""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

from . import __version__

COMMANDS = [
    "info",
    "graph",
    "export",
    "model",
    "meta_train",
    "evaluate",
    "train",
    "search",
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
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
