"""Smoke tests: the dynamic-architecture examples run end to end with tiny settings."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(("script", "argv", "expected"), [
    ("cond.py", ["--no-export"], "vmap over rows"),
    ("stochastic_depth.py", ["--depth", "8", "--steps", "1", "--keys", "50"], "mean over 50 keys"),
    ("early_exit.py", ["--steps", "2", "--classes", "3", "--width", "4", "--image-size", "8",
                       "--synthetic"], "exit rate"),
    ("rnn.py", ["--steps", "2", "--max-length", "4", "--hidden", "8"], "nn.LSTM packed"),
])
def test_example_runs(script: str, argv: list[str], expected: str,
                      capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location(f"example_{script[:-3]}", EXAMPLES / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(argv)
    assert expected in capsys.readouterr().out
