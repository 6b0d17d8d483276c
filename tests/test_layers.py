"""The floors hold: import-linter's layer contract, and what a plain import pulls in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HEAVY = ("matplotlib", "rich.progress", "funcgraph.runs", "funcgraph.data.glyphs",
         "funcgraph.data.strokes", "funcgraph.data.omniglot", "PIL")
"""Modules that ``import funcgraph`` and ``funcgraph --help`` must not load: plotting,
progress bars, the run drivers and the data generators load when they are used."""


def test_each_floor_imports_only_the_floors_below_it() -> None:
    from importlinter.cli import lint_imports

    code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True,
                        no_logo=True)
    assert code == 0, "import-linter found a broken layer contract (see the output above)"


def _loaded_after(code: str) -> list[str]:
    """The modules loaded in a fresh interpreter after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("code", [
    "import funcgraph",
    "import funcgraph.random",
    "import funcgraph.meta, funcgraph.nas, funcgraph.train",
    ("import sys\nfrom funcgraph.cli import app\n"
     "try:\n    app(['--help'])\nexcept SystemExit:\n    pass"),
], ids=["package", "random", "algorithms", "cli-help"])
def test_light_imports(code: str) -> None:
    loaded = _loaded_after(code)
    heavy = [m for m in loaded if m.startswith(HEAVY)]
    assert not heavy, f"{code!r} loaded {heavy}"


def test_subpackages_load_on_first_attribute_access() -> None:
    loaded = _loaded_after("import funcgraph\nfuncgraph.nas.mixed_op")
    assert "funcgraph.nas" in loaded, "funcgraph.nas did not load on attribute access"
    assert "funcgraph.runs" not in loaded, "funcgraph.nas pulled in the run layer"
