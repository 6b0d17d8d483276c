"""examples/testing_my_model.py is itself a test module: its tests are collected here too,
so the example cannot rot (they run with this suite's fixtures and hypothesis profile)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "testing_my_model.py"

_spec = importlib.util.spec_from_file_location("testing_my_model", EXAMPLE)
assert _spec is not None and _spec.loader is not None
_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_example)

globals().update({n: f for n, f in vars(_example).items() if n.startswith("test_")})


def test_the_example_has_tests_for_both_models() -> None:
    names = [n for n in vars(_example) if n.startswith("test_")]
    assert len(names) == 7 and any("early_exit" in n for n in names), names
