"""``--help`` outside a terminal: every flag written in full, within 80 columns, in panels."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from funcgraph.cli import app
from funcgraph.commands import help_layout

COMMANDS = ["info", "graph", "export", "meta-train", "evaluate", "train", "search", "runs",
            "plot", "model check", "model list"]

PANELLED = [c for c in COMMANDS if c != "info"]
"""Every command with options: each of them (``--help`` aside) sits in a titled help panel."""


def _command(path: str) -> typer.main.click.Command:  # type: ignore[name-defined]
    command = typer.main.get_command(app)
    for name in path.split():
        command = command.commands[name]  # type: ignore[attr-defined]
    return command


def _help(path: str, width: int = 80) -> str:
    result = CliRunner().invoke(app, [*path.split(), "--help"], terminal_width=width)
    assert result.exit_code == 0, f"funcgraph {path} --help failed: {result.output}"
    return result.output


@pytest.mark.parametrize("path", COMMANDS)
def test_every_flag_is_written_in_full_at_80_columns(path: str) -> None:
    text = _help(path)
    for param in _command(path).params:
        for flag in [*param.opts, *param.secondary_opts]:
            if flag.startswith("-"):
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), (
                    f"funcgraph {path} --help does not show {flag} in full:\n{text}")
    long = [line for line in text.splitlines()
            if len(line) > 80 and not line.lstrip().startswith("Example")]
    assert not long, f"funcgraph {path} --help has lines over 80 columns: {long[:3]}"
    assert "…" not in text, f"funcgraph {path} --help cuts something short:\n{text}"


def test_meta_train_help_is_short_outside_a_terminal() -> None:
    lines = _help("meta-train").splitlines()
    assert len(lines) < 180, f"meta-train --help is {len(lines)} lines at 80 columns"
    assert not any("╭" in line or "│" in line for line in lines), "boxes drawn into a pipe"


@pytest.mark.parametrize("path", PANELLED)
def test_options_are_grouped_in_panels(path: str) -> None:
    loose = [param.opts[0] for param in _command(path).params
             if param.param_type_name == "option" and param.name != "help"
             and not getattr(param, "rich_help_panel", None)]
    assert not loose, f"funcgraph {path}: options outside any help panel: {loose}"
    text = _help(path)
    sections = re.findall(r"^(\S[^:\n]*):$", text, re.M)
    assert sections[-1] == "Options" and len(sections) >= 2, (
        f"funcgraph {path} --help: expected titled panels, then Options; got {sections}")


def test_train_help_sections_hold_their_options() -> None:
    text = _help("train")
    training = text.split("\nTraining:\n", 1)[1].split("\n\n", 1)[0]
    flags = re.findall(r"^  (--[\w-]+)", training, re.M)
    assert flags == ["--steps", "--batch-size", "--lr", "--validate-every"], flags


def test_a_terminal_gets_rich_panels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(help_layout, "in_terminal", lambda: True)
    text = _help("train", width=120)
    assert "╭─ Training" in text and "╭─ Devices and processes" in text, text


def test_examples_keep_their_lines_whole() -> None:
    text = _help("graph")
    example = "  Example: funcgraph graph --model conv4 --set ways=5 --input-shape 1,1,28,28 "
    assert example + "--format mermaid\n" in text, text


def test_the_command_list_gives_each_summary_in_full() -> None:
    text = _help("")
    assert "test result, time and status (finished, interrupted, failed, in use)." in " ".join(
        text.split()), text
    assert "docs " not in text, "the hidden docs command is listed"


def test_docs_writes_the_reference_and_check_names_a_stale_one(tmp_path: Path) -> None:
    from funcgraph.commands.docgen import render

    out = tmp_path / "cli.md"
    result = CliRunner().invoke(app, ["docs", "--out", str(out)])
    assert result.exit_code == 0 and out.read_text() == render(app), result.output
    assert CliRunner().invoke(app, ["docs", "--out", str(out), "--check"]).exit_code == 0
    out.write_text("old\n")
    result = CliRunner().invoke(app, ["docs", "--out", str(out), "--check"])
    assert result.exit_code == 2, result.output
    assert f"error: {out} is stale: run funcgraph docs" in " ".join(result.output.split())
    assert out.read_text() == "old\n", "--check wrote the file"
