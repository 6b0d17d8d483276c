"""How ``--help`` is laid out: rich panels in a terminal, plain text everywhere else.

In a terminal, typer draws each option panel (``rich_help_panel=``) as a box sized to the
window. Piped (``funcgraph meta-train --help | less``, a log, a test's runner) those boxes are
drawn at a guessed width, where rich squeezes the flag column until names are cut
(``--inner-steps-ev…``). Outside a terminal these classes print click's plain layout instead:
the same panels as titled sections, each flag written in full (a long one gets its help on
the next line), help wrapped to at most 80 columns.

:mod:`funcgraph.cli` gives every command and group these classes, so a new command needs
nothing beyond its ``rich_help_panel=`` titles.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from typer.core import TyperCommand, TyperGroup

ARGUMENTS = "Arguments"
OPTIONS = "Options"

CLICK_COMMAND: Any = TyperCommand.__mro__[1]
"""click's own ``Command`` (its ``format_help`` writes usage, help text, options, epilog),
from whichever click typer uses (recent releases vendor their own copy)."""


def in_terminal() -> bool:
    """Whether help goes to a terminal (rich panels) rather than a pipe or file (plain)."""
    return sys.stdout.isatty()


def sections(command: Any, ctx: Any) -> dict[str, list[tuple[str, str]]]:
    """``command``'s help records (flags, help) by help panel, in the order plain help and
    ``docs/cli.md`` print them: the untitled arguments first, then each titled panel as its
    first parameter appears, then the untitled options (``--help`` among them)."""
    found: dict[str, list[tuple[str, str]]] = {ARGUMENTS: []}
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        untitled = ARGUMENTS if param.param_type_name == "argument" else OPTIONS
        found.setdefault(getattr(param, "rich_help_panel", None) or untitled,
                         []).append(record)
    found[OPTIONS] = found.pop(OPTIONS, [])  # last
    return {title: records for title, records in found.items() if records}


def write_sections(command: Any, ctx: Any, formatter: Any) -> None:
    """Write ``command``'s arguments and options as one section per help panel."""
    for title, records in sections(command, ctx).items():
        with formatter.section(title):
            formatter.write_dl(records)


def write_help_text(command: Any, formatter: Any) -> None:
    """Write ``command``'s help as click does, paragraphs wrapped, except that an
    ``Example:`` paragraph keeps its lines as written, so a command copies whole."""
    text = inspect.cleandoc(command.help or "").partition("\f")[0].strip()
    if not text:
        return
    formatter.write_paragraph()
    with formatter.indentation():
        for i, paragraph in enumerate(text.split("\n\n")):
            if i:
                formatter.write_paragraph()
            if paragraph.startswith(("Example:", "Examples:")):
                for line in paragraph.splitlines():
                    formatter.write(f"{'':>{formatter.current_indent}}{line.strip()}\n")
            else:
                formatter.write_text(paragraph)


class _PlainOutsideTerminal:
    """Help as plain text outside a terminal (every flag in full, a section per panel), rich
    panels in one; shared by :class:`Command` and :class:`Group`."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        if in_terminal():
            super().format_help(ctx, formatter)  # type: ignore[misc]
        else:
            CLICK_COMMAND.format_help(self, ctx, formatter)

    def format_help_text(self, ctx: Any, formatter: Any) -> None:
        write_help_text(self, formatter)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        write_sections(self, ctx, formatter)


class Command(_PlainOutsideTerminal, TyperCommand):
    """A typer command whose help is plain text outside a terminal."""


class Group(_PlainOutsideTerminal, TyperGroup):
    """A typer group whose help is plain text outside a terminal, each command's summary
    written in full."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        super().format_options(ctx, formatter)
        rows = [(name, command.get_short_help_str(limit=10_000))
                for name, command in self.commands.items() if not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
