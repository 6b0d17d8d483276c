"""Write ``docs/cli.md``, the CLI reference, from the Typer app itself.

A hidden maintainer command: run ``funcgraph docs`` after changing a command's options or
help text (``--check`` exits 2 when the file is stale; the test suite runs that comparison).
Every command's help, usage, arguments and options come from the same click objects
``--help`` prints (``get_help_record``), so the reference cannot drift from the CLI.

The app arrives as an argument (:func:`render`, and :func:`register` closes over the app it
registers on), so this module never imports :mod:`funcgraph.cli`, which sits above it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import typer.main

from . import help_layout
from .common import fail, user_errors

HEADER = """# CLI reference

Generated from the Typer app by `funcgraph docs`; do not edit by hand.
Every command also prints this with `--help`. User mistakes (a bad option value, a missing
file, an impossible task spec) exit with code 2 and one line on stderr; Ctrl-C exits 130.
`meta-train`, `train` and `search` take `--dry-run`: everything is checked (options, data,
model, one step, a memory estimate) and the resolved config is printed; nothing is written.

`--threads` defaults: `search` defaults to 1, because on a machine shared with other jobs
OpenMP threads spin against each other and a second thread can make a search many times
slower; `train`, `meta-train` and `evaluate` keep torch's default (0: one thread per core),
the faster on an idle machine. On a machine shared with other jobs, `--threads 1` can be much
faster (see docs/design.md, "Threads").
"""

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _help_text(help_text: str) -> str:
    """Docstring help as Markdown: prose kept, ``Example: funcgraph ...`` lines as a block."""
    prose: list[str] = []
    commands: list[str] = []
    for raw in help_text.strip().splitlines():
        line = raw.strip()
        if line.lower().startswith(("example:", "examples:")):
            line = line.split(":", 1)[1].strip()
        if line.startswith("funcgraph "):
            commands.append(line)
        elif line or prose:
            prose.append(line)
    out = "\n".join(prose).strip()
    if commands:
        out += "\n\nExample:\n\n```bash\n" + "\n".join(commands) + "\n```"
    return out


def _render_command(path: str, command: Any, ctx: Any) -> list[str]:
    lines = [f"## `{path}`", ""]
    if command.help:
        lines += [_help_text(command.help), ""]
    pieces = " ".join(command.collect_usage_pieces(ctx))
    lines += [f"Usage: `{path} {pieces}`".rstrip(), ""]
    for title, shown in help_layout.sections(command, ctx).items():
        records = [(name, text) for name, text in shown if name != "--help"]  # every one has it
        if not records:
            continue
        lines += [f"| {title} | Description |", "|---|---|"]
        lines += [f"| `{_cell(name)}` | {_cell(text)} |" for name, text in records]
        lines.append("")
    return lines


def _walk(path: str, command: Any, parent: Any) -> list[str]:
    ctx = command.make_context(path.split()[-1], [], parent=parent, resilient_parsing=True)
    lines = _render_command(path, command, ctx) if parent is not None else []
    if hasattr(command, "list_commands"):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not getattr(sub, "hidden", False):
                lines += _walk(f"{path} {name}", sub, ctx)
    return lines


def render(app: typer.Typer) -> str:
    """The Markdown reference of every (non-hidden) command of ``app``."""
    root = typer.main.get_group(app)
    ctx = root.make_context("funcgraph", [], resilient_parsing=True)
    names = [name for name in root.list_commands(ctx) if not root.commands[name].hidden]
    lines = [HEADER, _help_text(root.help or ""), "",
             "Commands: " + ", ".join(f"[`{n}`](#funcgraph-{n})" for n in names), ""]
    lines += _walk("funcgraph", root, None)
    return "\n".join(lines).rstrip() + "\n"


def register(app: typer.Typer) -> None:
    """Add the hidden ``docs`` command, which documents ``app`` itself."""

    @app.command("docs", hidden=True)
    @user_errors
    def docs(
        out: Annotated[Path, typer.Option(help="The Markdown file to write.")] = DEFAULT_PATH,
        check: Annotated[bool, typer.Option(
            "--check", help="Write nothing; exit 2 if the file is stale.")] = False,
    ) -> None:
        """Regenerate docs/cli.md, the CLI reference, from the commands' own help.

        Example: funcgraph docs --check
        """
        from ..files import atomic_write

        text = render(app)
        if not check:
            atomic_write(out, text.encode())
            typer.echo(f"wrote {out}")
        elif not out.is_file() or out.read_bytes() != text.encode():
            raise fail(f"{out} is stale: run funcgraph docs")
