"""A hypothesis-driven fuzzer of the command line: every command, its own declared options,
hostile values. Each invocation must end with exit 0 or 2, print no traceback, and create no
file outside the ``--out`` it names (meta-train, train and search run with ``--dry-run``, so
they write nothing at all)."""

from __future__ import annotations

import enum
import inspect
import os
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.main import get_command
from typer.testing import CliRunner

from funcgraph.cli import app

ROOT = get_command(app)
# Typer may run on its own copy of click, so commands and parameters are told apart by what
# they have, not by click's classes.
Command = Any


def leaf_commands(group: Command, prefix: tuple[str, ...] = ()) -> dict[str, Command]:
    out: dict[str, Command] = {}
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            out.update(leaf_commands(cmd, (*prefix, name)))
        else:
            out[" ".join((*prefix, name))] = cmd
    return out


COMMANDS = leaf_commands(ROOT)
DRY = {"meta-train", "train", "search"}
"""Commands that train: fuzzed with --dry-run, so a valid combination does no work either."""

TEXT = ["/", "/proc/funcgraph-x", "[bold]x[/bold]", "[/x]", "", "no/such/dir", "-",
        "{FILE}", "5wayXshot", "hidden=abc", "=", "a" * 300, "../up", "1,1,0,28",
        "5way1shot", "10shot", "conv4", "1,1,28,28", "hidden=0"]
INTS = ["-1", "0", "1", str(10**30), "nan", "abc", "1e3", "[bold]", ""]
FLOATS = ["nan", "inf", "-inf", "-1", "0.5", "1e400", "abc", ""]
"""Mostly invalid values, and a few valid cheap ones so that some invocations get past
parsing into the commands themselves."""


def value_type(cmd: Command, param: Any) -> Any:
    """The Python type the command's function declares for ``param`` (Optional unwrapped)."""
    hint = typing.get_type_hints(inspect.unwrap(cmd.callback))[param.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if isinstance(hint, types.UnionType) and args else hint


def hostile(kind: Any) -> st.SearchStrategy[str]:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return st.sampled_from([*(m.value for m in kind), "nope", "[/x]"])
    if kind is int:
        return st.sampled_from(INTS)
    if kind is float:
        return st.sampled_from(FLOATS)
    return st.sampled_from(TEXT)


@st.composite
def invocation(draw: st.DrawFn, name: str) -> list[str]:
    cmd = COMMANDS[name]
    args: list[str] = [*name.split()]
    for param in cmd.params:
        if param.param_type_name == "argument":
            args.append(draw(hostile(value_type(cmd, param))))
    options = [p for p in cmd.params if p.param_type_name == "option" and p.name != "help"
               and p.name not in ("dry_run", "nproc")]
    chosen = draw(st.lists(st.sampled_from(options), max_size=5, unique_by=id)) if options else []
    for param in chosen:
        flag = param.opts[-1]
        if param.is_flag:
            args.append(flag if not param.secondary_opts or draw(st.booleans())
                        else param.secondary_opts[0])
        else:
            args += [flag, draw(hostile(value_type(cmd, param)))]
    if name in DRY:
        args.append("--dry-run")
    return args


@pytest.mark.parametrize("name", sorted(COMMANDS))
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_hostile_arguments_end_in_exit_0_or_2_without_traceback_or_files(
        name: str, data: st.DataObject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "cwd"
    work.mkdir(exist_ok=True)
    existing = work / "a-file"
    existing.write_bytes(b"\x00\xffnot a config")
    monkeypatch.chdir(work)
    args = [a.replace("{FILE}", str(existing)) for a in data.draw(invocation(name))]
    threads = torch.get_num_threads()
    before = {p for p in work.rglob("*")}
    try:
        result = CliRunner().invoke(app, args)
    finally:
        torch.set_num_threads(threads)
    output = result.output  # stdout and stderr, interleaved
    assert result.exit_code in (0, 2), f"{args}: exit {result.exit_code}\n{output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{args}: raised {result.exception!r}")
    assert "Traceback" not in output, f"{args}:\n{output}"
    named = [Path(args[i + 1]).resolve() for i, a in enumerate(args[:-1])
             if a in ("--out", "-o")]
    created = sorted(str(p) for p in set(work.rglob("*")) - before
                     if not any(p.resolve().is_relative_to(n) for n in named))
    assert not created, f"{args} created {created} outside the --out it named"
    assert not os.path.exists("/proc/funcgraph-x"), "something was written under /proc"
