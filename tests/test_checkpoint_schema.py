"""A checkpoint sidecar is checked as data: every field by type and range, so a tampered or
foreign sidecar is one CheckpointError line on ``evaluate`` and ``--resume``, never an
AttributeError or TypeError from the loader."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import invoke

from funcgraph.errors import CheckpointError
from funcgraph.train.checkpoint import check_sidecar

SINE = ["meta-train", "--dataset", "sinusoid", "--steps", "2", "--meta-batch", "2",
        "--episodes", "2", "--val-episodes", "2", "--validate-every", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "sine"
    code, output = invoke(*SINE, "--out", str(out))
    assert code == 0, output
    return out


TAMPERED: list[tuple[str, Any, str]] = [
    ("names", 7, "field 'names' must be an object of group name -> list of tensor names, got 7"),
    ("names", {"params": 3}, "field 'names' must be"),
    ("groups", 7, "field 'groups' must be a list of group names, got 7"),
    ("step", "12", "field 'step' must be an int in [0, 2**63), got '12'"),
    ("step", -1, "field 'step' must be an int in [0, 2**63), got -1"),
    ("sha256", 5, "field 'sha256' must be 64 lowercase hex digits, got 5"),
    ("tensors", "../../etc/passwd", "field 'tensors' must be a .safetensors file name"),
    ("format", 99, "field 'format' must be 1"),
    ("best_value", "high", "field 'best_value' must be a number or null"),
    ("strategy", 3, "field 'strategy' must be a strategy name or null"),
]


def tamper(run: Path, tmp_path: Path, field: str, value: Any) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    for sidecar in (copy / "checkpoints").glob("*.json"):
        meta = json.loads(sidecar.read_text())
        meta[field] = value
        sidecar.write_text(json.dumps(meta))
    return copy


@pytest.mark.parametrize("field,value,message", TAMPERED)
def test_a_tampered_sidecar_is_one_error_on_evaluate_and_resume(
        finished_run: Path, tmp_path: Path, field: str, value: Any, message: str) -> None:
    run = tamper(finished_run, tmp_path, field, value)
    for args in (["evaluate", str(run), "--episodes", "2", "--device", "cpu"],
                 [*SINE, "--steps", "3", "--out", str(run), "--resume"]):
        code, output = invoke(*args)
        errors = [ln for ln in output.splitlines() if ln.startswith("error:")]
        assert code == 2 and len(errors) == 1, (args, output)
        assert message in errors[0] and "the sidecar was edited" in errors[0], errors[0]


def test_the_schema_accepts_what_save_writes(finished_run: Path) -> None:
    for sidecar in (finished_run / "checkpoints").glob("*.json"):
        check_sidecar(json.loads(sidecar.read_text()), sidecar)  # raises if it refused


def test_a_sidecar_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(CheckpointError, match="must be a JSON object, got \\[1, 2\\]"):
        check_sidecar([1, 2], "x.json")
