"""The "your own model" examples run end to end and hold what they show.

Each example asserts its own claims (vmap equals the loop, the held-out loss fell, exported
output equals eager...); these tests run them with their defaults, small by design, check
what they print, and collect the property-test example's tests into this suite.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_maml_own_module_lowers_the_held_out_loss(capsys: pytest.CaptureFixture[str]) -> None:
    before, after = _load("maml_own_module").main([])
    out = capsys.readouterr().out
    assert after < before, f"held-out MSE {before} -> {after}"
    assert "vmap over tasks vs a loop" in out, out


def test_maml_own_module_is_about_fifteen_lines_of_user_code() -> None:
    text = (EXAMPLES / "maml_own_module.py").read_text()
    user = text.split("# --- the user code")[1].split("# -----")[0]
    lines = [line for line in user.splitlines()[1:] if line.strip()]
    assert len(lines) <= 18, f"the user code grew to {len(lines)} lines:\n" + "\n".join(lines)


def test_dynamic_own_model_checks_pass_and_restore_the_dtype(
        capsys: pytest.CaptureFixture[str]) -> None:
    before = torch.get_default_dtype()
    _load("dynamic_own_model").main(["--keys", "2000"])
    assert torch.get_default_dtype() == before, "the example must restore the default dtype"
    out = capsys.readouterr().out
    assert "vmap over keys == loop" in out and "(= finite differences)" in out, out
    gap, error = (float(v) for v in re.findall(r"= (\d\.\d+) \(standard error (\d\.\d+)\)",
                                               out)[0])
    assert gap < 4 * error, out


def test_export_own_model_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "net.pt2"
    _load("export_own_model").main(["--steps", "3", "--out", str(path)])
    assert path.is_file(), "the example must save the program where --out says"
    out = capsys.readouterr().out
    assert out.count("equals the eager model") == 2, out
    assert "batch norm has seen 3 batches" in out, out


_property_tests = _load("property_tests_own_model")
globals().update({n: f for n, f in vars(_property_tests).items() if n.startswith("test_")})


def test_the_property_example_has_its_tests() -> None:
    names = [n for n in vars(_property_tests) if n.startswith("test_")]
    assert len(names) == 5, names
