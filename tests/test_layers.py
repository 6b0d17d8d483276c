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


DIR_PROBE = """
import importlib, json, pkgutil, funcgraph
packages = ["funcgraph", *(f"funcgraph.{m.name}" for m in pkgutil.iter_modules(funcgraph.__path__)
                           if m.ispkg)]
missing = {}
for name in packages:
    package = importlib.import_module(name)
    missing[name] = sorted(set(getattr(package, "__all__", ())) - set(dir(package)))
print(json.dumps(missing))
"""


def test_dir_of_every_package_lists_its_public_names_before_they_load() -> None:
    """Completion reads ``dir()``: a package whose names load on first use (``meta``,
    ``data``, the top level) still lists every name of ``__all__``, in a fresh interpreter
    where none of them has loaded yet."""
    out = subprocess.run([sys.executable, "-c", DIR_PROBE], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    missing = json.loads(out.strip().splitlines()[-1])
    assert {"funcgraph", "funcgraph.meta", "funcgraph.data", "funcgraph.runs"} <= set(missing), (
        f"the probe did not reach every package: {sorted(missing)}")
    assert not any(missing.values()), {k: v for k, v in missing.items() if v}


HELP_PROBE = """
from typer.testing import CliRunner
from funcgraph.cli import app
for command in {commands!r}:
    result = CliRunner().invoke(app, [*command.split(), "--help"])
    assert result.exit_code == 0, (command, result.output)
"""

COMMAND_PATHS = ("", "info", "graph", "export", "model", "model check", "model list",
                 "meta-train", "evaluate", "train", "search", "runs", "plot")


def test_no_help_imports_torch() -> None:
    """Every ``--help`` (and ``import funcgraph``) runs without torch: options, choices and
    help text come from torch-free modules; command bodies import what they use."""
    loaded = _loaded_after(HELP_PROBE.format(commands=COMMAND_PATHS))
    assert "torch" not in loaded, "a --help imported torch: " + ", ".join(
        m for m in loaded if m.startswith("funcgraph."))
    assert "torch" not in _loaded_after("import funcgraph"), "import funcgraph imported torch"


def test_help_from_the_console_script_imports_no_torch() -> None:
    """``python -X importtime -m funcgraph --help``: the import log names no torch module."""
    log = subprocess.run([sys.executable, "-X", "importtime", "-m", "funcgraph", "--help"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stderr
    torch_lines = [line for line in log.splitlines() if line.rsplit("|", 1)[-1].strip()
                   .startswith("torch")]
    assert not torch_lines, f"funcgraph --help imported torch:\n{torch_lines[:5]}"
    assert "funcgraph.cli" in log, "the import log does not show the CLI loading"
