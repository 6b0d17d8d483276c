"""A test run leaves nothing behind: caches, Hypothesis data and plots go to temporary
directories (``tests/conftest.py``), so a run on an empty ``HOME`` leaves it empty."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]
# Tests that write through every default location: the dataset cache (glyphs generated for a
# search), the Hypothesis example database, matplotlib (a curves PNG).
PROBES = [
    "tests/test_nas_spaces.py::test_search_command_takes_a_space_file",
    "tests/test_params.py::test_prefix_select_round_trip",
    "tests/test_run_views.py::test_every_run_writes_a_png_of_its_curves_that_follows_its_metrics",
]


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_the_configuration_points_every_cache_at_a_temporary_directory() -> None:
    from funcgraph.data.cache import cache_path

    temp, home = Path(tempfile.gettempdir()).resolve(), Path.home().resolve()
    for name in ("FUNCGRAPH_CACHE", "MPLCONFIGDIR"):
        where = Path(os.environ[name]).resolve()
        assert where.is_relative_to(temp) and not where.is_relative_to(home), (name, where)
    assert cache_path(None, "x").parent == Path(os.environ["FUNCGRAPH_CACHE"])
    assert settings().database is None, "the hypothesis profile must store no examples"


def test_tests_on_an_empty_home_leave_it_and_the_working_directory_empty(tmp_path: Path) -> None:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("FUNCGRAPH_CACHE", "FUNCGRAPH_TEST_CACHE", "MPLCONFIGDIR")
           and not k.startswith(("XDG_", "PYTEST_"))}
    env["HOME"] = str(home)
    before = set(_files(ROOT / "tests"))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider",
         "--rootdir", str(ROOT),
         "-c", str(ROOT / "pyproject.toml"), *(str(ROOT / p) for p in PROBES)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 passed" in proc.stdout, proc.stdout[-2000:]
    assert _files(home) == [], f"the tests wrote into HOME: {_files(home)}"
    assert _files(cwd) == [], f"the tests wrote into the working directory: {_files(cwd)}"
    new = sorted(set(_files(ROOT / "tests")) - before)
    assert not [n for n in new if "__pycache__" not in n], f"the tests wrote into tests/: {new}"
