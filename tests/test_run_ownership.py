"""One process per run directory, and only a directory that is new, empty or a run."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from funcgraph.errors import CheckpointError, RunDirectoryError
from funcgraph.train import Run

HOLD = """
import sys, time
from funcgraph.train import Run
run = Run.create(sys.argv[1], {"steps": 3})
print("holding", flush=True)
time.sleep(60)
"""


def test_a_second_writer_is_refused_with_the_holder_named(tmp_path: Path) -> None:
    with Run.create(tmp_path / "r", {"steps": 3}):
        with pytest.raises(RunDirectoryError, match=f"in use by process {os.getpid()}"):
            Run.create(tmp_path / "r", {"steps": 3}, resume=True)
    Run.create(tmp_path / "r", {"steps": 3}, resume=True).close()  # released: fine


def test_the_lock_dies_with_a_killed_process(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "r")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with pytest.raises(RunDirectoryError, match=f"process {holder.pid}"):
            Run.create(tmp_path / "r", {"steps": 3})
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    Run.create(tmp_path / "r", {"steps": 3}).close()  # kill -9 left no stale lock behind


@pytest.mark.parametrize("setup,message", [
    (lambda p: p.write_text("not a directory"), "is a file"),
    (lambda p: (p.mkdir(), (p / "notes.txt").write_text("mine")), "holds other files"),
])
def test_out_must_be_new_empty_or_a_run(tmp_path: Path, setup: object, message: str) -> None:
    out = tmp_path / "out"
    setup(out)  # type: ignore[operator]
    before = sorted(os.listdir(out)) if out.is_dir() else None
    with pytest.raises(RunDirectoryError, match=message):
        Run.create(out, {"steps": 3})
    after = sorted(os.listdir(out)) if out.is_dir() else None
    assert before == after, f"a refused --out was written to: {before} -> {after}"


def test_out_that_cannot_be_created_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RunDirectoryError, match="cannot be used as a run directory"):
        Run.create("/proc/funcgraph-run", {"steps": 3})
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirectoryError):
        Run.create(tmp_path / "file" / "run", {"steps": 3})


def test_a_run_that_never_saved_a_step_is_started_afresh(tmp_path: Path) -> None:
    """A start killed or interrupted before its first checkpoint blocks nothing: a new start
    (with other options, or with --resume) takes the directory over and clears its log."""
    with Run.create(tmp_path / "r", {"steps": 3, "lr": 0.1}) as run:
        run.log({"kind": "train", "step": 1, "loss": 1.0})
    with Run.create(tmp_path / "r", {"steps": 3, "lr": 0.2}) as run:
        assert run.metrics() == [], "the stale log of the failed start survived"
        assert run.config["lr"] == 0.2, "the new options were not written"
    Run.create(tmp_path / "r", {"steps": 3, "lr": 0.3}, resume=True).close()


def test_metrics_are_valid_json_lines_with_non_finite_numbers_as_null(tmp_path: Path) -> None:
    with Run.create(tmp_path / "r", {"steps": 1}) as run:
        run.log({"kind": "train", "step": 1, "loss": math.nan, "acc": math.inf, "lr": 0.1})
    line = (tmp_path / "r" / "metrics.jsonl").read_text().strip()
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in {line}")) == {
        "kind": "train", "step": 1, "loss": None, "acc": None, "lr": 0.1}


def test_broken_sidecar_or_config_is_a_checkpoint_error(tmp_path: Path) -> None:
    with Run.create(tmp_path / "r", {"steps": 3}) as run:
        run.save("last", {"p": {"w": torch.zeros(1)}}, {"step": 2})
    sidecar = tmp_path / "r" / "checkpoints" / "last.json"
    meta = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**meta, "step": "two"}))
    with pytest.raises(CheckpointError,
                       match=re.escape("field 'step' must be an int in [0, 2**63), got 'two'")):
        Run.create(tmp_path / "r", {"steps": 3}, resume=True)
    sidecar.write_text(json.dumps(meta))
    config = tmp_path / "r" / "config.json"
    config.write_text(config.read_text()[:7])
    with pytest.raises(CheckpointError, match="not valid JSON"):
        Run.open(tmp_path / "r")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        Run.create(tmp_path / "r", {"steps": 3}, resume=True)


def test_two_meta_train_processes_on_one_out_exactly_one_proceeds(tmp_path: Path) -> None:
    """Start two identical runs on one --out, then a --resume while one is still running:
    exactly one process trains, the others exit 2 naming the holder, and the run is intact."""
    out = tmp_path / "race"
    base = [sys.executable, "-m", "funcgraph", "meta-train", "--dataset", "sinusoid",
            "--steps", "150", "--meta-batch", "2", "--episodes", "2", "--val-episodes", "2",
            "--validate-every", "0", "--device", "cpu", "--out", str(out)]
    procs = [subprocess.Popen([*base, "--seed", str(s)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for s in (1, 2)]
    deadline = time.monotonic() + 120
    while not (out / "config.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    late = subprocess.run([*base, "--seed", "1", "--resume"], capture_output=True, text=True,
                          timeout=120)
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], f"expected one success and one refusal, got {results}"
    loser = next(err for code, _, err in results if code == 2)
    assert "in use by process" in loser and "Traceback" not in loser, loser
    if late.returncode == 2:
        assert "in use by process" in late.stderr, late.stderr
    else:  # the winner had already finished: the resume found a complete run and continued it
        assert late.returncode == 0, late.stderr
    winner_seed = json.loads((out / "config.json").read_text())["seed"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == sorted(steps) and len(steps) == len(set(steps)), (
        f"metrics.jsonl interleaves two writers: {steps[:20]}...")
    assert winner_seed in (1, 2) and records[-1]["kind"] == "test", "the run is not intact"
