"""The start every training command shares (``commands.common.start_run``): the same
refusals, in one line and exit 2, before any data or model is built."""

from __future__ import annotations

import importlib.util
import re
from typing import Any

import pytest
import torch
import typer
from typer.testing import CliRunner

from funcgraph.cli import app
from funcgraph.commands.common import start_run
from funcgraph.commands.run_options import RunOptions, run_options
from funcgraph.errors import ConfigError

TRAINING = ["meta-train", "train", "search"]


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    unboxed = re.sub(r"[│╭╮╰╯─]", " ", result.output)  # click's usage errors come boxed here
    return result.exit_code, " ".join(unboxed.split())


@pytest.mark.parametrize("command", ["meta-train", "train"])
def test_resume_without_out_is_refused(command: str) -> None:
    code, out = _run(command, "--resume")
    assert code == 2 and "--resume needs --out RUN_DIR (the run to continue)" in out, out


@pytest.mark.parametrize("command", TRAINING)
def test_a_missing_import_module_is_one_line(command: str) -> None:
    code, out = _run(command, "--import", "no_such_module_here", "--dry-run")
    assert code == 2, out
    assert "--import no_such_module_here: ModuleNotFoundError" in out and "Traceback" not in out


@pytest.mark.parametrize("command", TRAINING)
def test_tensorboard_without_the_package_is_refused(command: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    code, out = _run(command, "--tensorboard", "--dry-run")
    assert code == 2 and "--tensorboard needs the tensorboard package" in out, out


def test_start_run_applies_threads_and_checks_in_order() -> None:
    threads = torch.get_num_threads()
    try:
        start_run(threads=1, imports=None, tensorboard=False, resume=False, out=None)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(ConfigError, match="--import no_such_module_here"):
        start_run(threads=0, imports=["no_such_module_here"], tensorboard=False, resume=True,
                  out=None)  # the module fails first, as it would on the command line
    with pytest.raises(typer.BadParameter, match="--resume needs --out"):
        start_run(threads=0, imports=None, tensorboard=False, resume=True, out=None)


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't "
                 "allocate memory: you tried to allocate 4000000000000 bytes.\nmore text"),
    MemoryError(),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
])
def test_running_out_of_memory_past_the_estimate_is_one_line(
        error: BaseException, capsys: pytest.CaptureFixture[str]) -> None:
    from funcgraph.commands.common import user_errors

    def command() -> None:
        raise error

    with pytest.raises(typer.Exit) as info:
        user_errors(command)()
    assert info.value.exit_code == 2
    line = " ".join(capsys.readouterr().err.split())
    assert line.startswith("error: out of memory: ") and "lower the batch" in line, line
    assert "more text" not in line, "only torch's first line"


def test_other_runtime_errors_keep_their_traceback() -> None:
    from funcgraph.commands.common import user_errors

    def command() -> None:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        user_errors(command)()


def test_the_shared_options_are_spliced_where_each_command_names_them() -> None:
    """``run: RunOptions`` gives each training command every field of ``RunOptions`` as its own
    option (less those it leaves out), with the command's ``--threads`` default, in the
    dataclass's order, at the place the command named it."""
    import dataclasses

    group: Any = typer.main.get_command(app)
    fields = [f.name for f in dataclasses.fields(RunOptions)]
    expected = {"meta-train": (fields, 0), "train": (fields, 0),
                "search": ([f for f in fields if f not in ("precision", "place")], 1)}
    for command, (names, threads) in expected.items():
        params = [p for p in group.commands[command].params if p.name != "help"]
        shared = [p for p in params if p.name in fields]
        assert [p.name for p in shared] == names, f"{command}: {[p.name for p in shared]}"
        first = params.index(shared[0])
        assert params[first:first + len(shared)] == shared, f"{command}: split by its own options"
        assert {p.name: p.default for p in shared}["threads"] == threads, command
    dist_timeout = next(p for p in group.commands["train"].params if p.name == "dist_timeout")
    assert dist_timeout.opts == ["--dist-timeout"] and dist_timeout.default == 600.0


def test_a_command_gets_its_shared_options_as_one_record() -> None:
    """The values given on the command line reach the command body, gathered in RunOptions."""
    seen: list[RunOptions] = []

    @run_options(threads=3, without=("place",))
    def command(ctx: object, steps: int = 1, *, run: RunOptions) -> int:
        seen.append(run)
        return steps

    assert command(None, steps=5, device="cpu", precision="bf16", threads=2, seed=7,
                   dry_run=True, tensorboard=False, import_=None, out=None, resume=False,
                   nproc=1, backend="gloo", dist_timeout=9.0) == 5
    assert seen == [RunOptions(device="cpu", precision="bf16", threads=2, seed=7, dry_run=True,
                               backend="gloo", dist_timeout=9.0)]
