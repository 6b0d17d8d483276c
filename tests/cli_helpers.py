"""Running ``funcgraph`` commands in-process for tests, one way for every test file."""

from __future__ import annotations

from typer.testing import CliRunner

from funcgraph.cli import app


def invoke(*args: str) -> tuple[int, str]:
    """Exit code and output of ``funcgraph ARGS``; whatever the exit, never a traceback and
    never an exception other than the exit itself."""
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{args} raised {result.exception!r}")
    return result.exit_code, result.output


def run_ok(*args: str) -> str:
    """The output of ``funcgraph ARGS``, which must exit 0."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, f"{args}: exit {result.exit_code}\n{result.output}"
    return result.output
