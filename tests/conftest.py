"""Shared test settings: deterministic, single-threaded torch, quick hypothesis profile, and
every cache a test run could write pointed at one temporary directory.

A test run leaves nothing behind: funcgraph's dataset cache (``FUNCGRAPH_CACHE``), Hypothesis's
example database and matplotlib's configuration and font cache go under a directory made for
the run and removed at its end (``tests/test_leaves_nothing.py`` runs tests on an empty
``HOME`` and checks it stays empty). Set ``FUNCGRAPH_TEST_CACHE`` to a directory to keep the
generated datasets between runs (the glyphs take about 20 s of CPU to generate).
"""

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

_SCRATCH = Path(tempfile.mkdtemp(prefix="funcgraph-tests-"))
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)
os.environ["FUNCGRAPH_CACHE"] = os.environ.get("FUNCGRAPH_TEST_CACHE") or str(_SCRATCH / "cache")
os.environ["MPLCONFIGDIR"] = str(_SCRATCH / "matplotlib")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(_SCRATCH / "inductor")
os.environ["TRITON_CACHE_DIR"] = str(_SCRATCH / "triton")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

set_hypothesis_home_dir(_SCRATCH / "hypothesis")
torch.set_num_threads(int(os.environ.get("FUNCGRAPH_TEST_THREADS", "1")))

settings.register_profile(
    "funcgraph",
    max_examples=20,
    deadline=None,
    database=None,  # examples are drawn afresh each run; nothing is stored
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("funcgraph")


@pytest.fixture(autouse=True)
def _no_plugin_imports_carried_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no ``--import`` modules remembered (funcgraph.plugins records
    them into every run a process creates), so one test's plugin is not another's."""
    import funcgraph.plugins

    monkeypatch.setattr(funcgraph.plugins, "_IMPORTED", [])


@pytest.fixture
def float64_default() -> Iterator[None]:
    """torch's default dtype is float64 during the test (``pytestmark =
    pytest.mark.usefixtures("float64_default")`` for a whole module), restored after it."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)
