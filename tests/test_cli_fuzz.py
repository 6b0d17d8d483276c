"""A hypothesis-driven fuzzer of the command line: every command, its own declared options,
hostile values. Each invocation must end with exit 0 or 2, print no traceback, and create no
file outside the ``--out`` it names (meta-train, train and search run with ``--dry-run``, so
they write nothing at all)."""

from __future__ import annotations

import enum
import json
import os
import shutil
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
        "5way1shot", "10shot", "conv4", "1,1,28,28", "hidden=0",
        # sizes near and past what memory holds: refused from shapes, before allocating
        "100000000shot", "5way100000shot", "100000way1shot", "hidden=100000000",
        "data.max_length=100000", "data.max_length=abc", "width=1000000", "ways=3"]
INTS = ["-1", "0", "1", str(10**30), "nan", "abc", "1e3", "[bold]", "", "100000", "65536",
        str(2**31 - 1)]
FLOATS = ["nan", "inf", "-inf", "-1", "0.5", "1e400", "abc", ""]
"""Mostly invalid values, and a few valid cheap ones so that some invocations get past
parsing into the commands themselves."""


def value_type(cmd: Command, param: Any) -> Any:
    """The Python type the command declares for ``param`` (Optional unwrapped): its callback's
    hints, the shared options ``commands.run_options`` gives a training command included."""
    hint = typing.get_type_hints(cmd.callback)[param.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    return args[0] if union and args else hint


def hostile(kind: Any) -> st.SearchStrategy[str]:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return st.sampled_from([*(m.value for m in kind), "nope", "[/x]"])
    if typing.get_origin(kind) is typing.Literal:  # a choice
        return st.sampled_from([*typing.get_args(kind), "nope", "[/x]"])
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


# -- runs that are not what they claim: tampered sidecars, mismatched runs -------------------

SINE = ["--dataset", "sinusoid", "--steps", "2", "--meta-batch", "2", "--episodes", "2",
        "--val-episodes", "2", "--validate-every", "1", "--device", "cpu"]
GLYPHS = ["--tasks", "5way1shot", "--steps", "1", "--meta-batch", "1", "--episodes", "2",
          "--val-episodes", "1", "--validate-every", "0", "--device", "cpu"]


def invoke(args: list[str]) -> tuple[int, str]:
    threads = torch.get_num_threads()
    try:
        result = CliRunner().invoke(app, args)
    finally:
        torch.set_num_threads(threads)
    assert "Traceback" not in result.output, f"{args}:\n{result.output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{args}: raised {result.exception!r}")
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished sinusoid MAML run and a finished 5-way glyph ProtoNet run."""
    root = tmp_path_factory.mktemp("fuzz-runs")
    made = {"sine": root / "sine", "protonet": root / "protonet"}
    for name, args in (("sine", SINE), ("protonet", GLYPHS)):
        code, output = invoke(["meta-train", *args, "--out", str(made[name])])
        assert code == 0, output
    return made


def _sidecars(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob("*.json"))


def _edit_sidecars(run: Path, edit: Any) -> None:
    for sidecar in _sidecars(run):
        meta = json.loads(sidecar.read_text())
        sidecar.write_text(json.dumps(edit(meta)))


HOSTILE_RUNS: dict[str, Any] = {
    "names is an int": lambda run: _edit_sidecars(run, lambda m: {**m, "names": 1}),
    "groups is an int": lambda run: _edit_sidecars(run, lambda m: {**m, "groups": 1}),
    "names of ints": lambda run: _edit_sidecars(run, lambda m: {**m, "names": {"params": [1]}}),
    "step is text": lambda run: _edit_sidecars(run, lambda m: {**m, "step": "2"}),
    "step is huge": lambda run: _edit_sidecars(run, lambda m: {**m, "step": 10**30}),
    "sha256 of other bytes": lambda run: _edit_sidecars(run, lambda m: {**m, "sha256": "0" * 64}),
    "tensors outside": lambda run: _edit_sidecars(run, lambda m: {**m, "tensors": "../c.pt"}),
    "sidecar is a list": lambda run: [s.write_text("[1, 2]") for s in _sidecars(run)],
    "sidecar truncated": lambda run: [s.write_text(s.read_text()[:20]) for s in _sidecars(run)],
    "tensor file gone": lambda run: [p.unlink() for p in
                                     (run / "checkpoints").glob("*.safetensors")],
    "config of another model": lambda run: (run / "config.json").write_text(json.dumps(
        {**json.loads((run / "config.json").read_text()),
         "model": {"name": "mlp", "in_features": 1, "out_features": 1, "hidden": [7]}})),
    "config of a train run": lambda run: (run / "config.json").write_text(json.dumps(
        {"command": "train", "model": {"name": "mlp", "in_features": 1, "hidden": [3]}})),
    "config is a list": lambda run: (run / "config.json").write_text("[]"),
}


@pytest.mark.parametrize("damage", sorted(HOSTILE_RUNS))
def test_a_tampered_or_mismatched_run_is_one_error_line(runs: dict[str, Path], tmp_path: Path,
                                                        damage: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs["sine"], run)
    HOSTILE_RUNS[damage](run)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    for args in (["evaluate", str(run), "--episodes", "2", "--device", "cpu"],
                 ["export", str(run), "--out", str(run / "m.pt2")],
                 ["meta-train", *SINE, "--steps", "3", "--out", str(run), "--resume"],
                 ["runs", str(tmp_path)]):
        code, output = invoke(args)
        errors = [ln for ln in output.splitlines() if ln.startswith("error:")]
        assert (code, len(errors)) in ((0, 0), (2, 1)), f"{damage}: {args}\n{output}"
        if args[0] == "evaluate":
            assert code == 2, f"{damage}: evaluate scored a damaged run\n{output}"
    created = {p for p in tmp_path.rglob("*")} - set(before)
    assert all(p.is_relative_to(run) for p in created), f"{damage}: wrote {created}"


# -- documented decisions ---------------------------------------------------------------------

def test_re_running_into_a_run_that_never_saved_starts_over(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"command": "meta-train", "steps": 99}))
    (out / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    code, output = invoke(["meta-train", *SINE, "--out", str(out)])  # no --resume
    assert code == 0, output
    assert json.loads((out / "config.json").read_text())["steps"] == 2  # the new run's
    code, output = invoke(["meta-train", *SINE, "--out", str(out)])  # now it saved steps
    assert code == 2 and "already holds a run (2 steps done); pass --resume" in output, output


def test_protonet_is_an_embedding_and_accepts_what_an_embedding_may(runs: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    run = runs["protonet"]
    code, output = invoke(["evaluate", str(run), "--tasks", "10way1shot", "--episodes", "2",
                           "--device", "cpu"])
    assert code == 0 and "acc" in output, output  # 10-way tasks by their prototypes
    code, output = invoke(["export", str(run), "--out", str(tmp_path / "e.pt2"),
                           "--batch-dependent"])
    assert code == 0, output
    features = torch.export.load(str(tmp_path / "e.pt2")).module()(torch.ones(4, 1, 28, 28))
    assert features.shape == (4, 64), features.shape  # [N, 64] features, not 5 logits
    code, output = invoke(["meta-train", *GLYPHS, "--set", "ways=3", "--dry-run"])
    assert code == 0 and '"ways": 3' in output, output  # a 3-dimensional embedding
    code, output = invoke(["meta-train", *GLYPHS, "--tasks", "10way1shot", "--dry-run"])
    assert code == 0, output
