"""The documentation site builds with warnings as errors, and its API reference is generated
from the docstrings of every public package (``mkdocs.yml``, ``docs/reference/``)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["nn", "models", "meta", "nas", "data", "train", "factory", "testing", "debug",
            "export"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    started = time.perf_counter()
    # Not --quiet: it drops warnings before --strict counts them (griffe's among them).
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--site-dir", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    seconds = time.perf_counter() - started
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}{proc.stderr}"
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "WARNING" in line]
    assert not warnings, "the docs build warns:\n" + \
        "\n".join(warnings)
    assert seconds < 120, f"the docs build took {seconds:.0f} s"
    return out


def test_every_public_package_has_a_reference_page_with_every_module() -> None:
    for package in PACKAGES:
        page = (ROOT / "docs" / "reference" / f"{package}.md").read_text()
        modules = sorted(p.stem for p in (ROOT / "funcgraph" / package).glob("*.py")
                         if not p.stem.startswith("_"))
        missing = [m for m in modules if f"::: funcgraph.{package}.{m}\n" not in page]
        assert not missing, (f"docs/reference/{package}.md lacks modules {missing}: add a "
                             f"section `::: funcgraph.{package}.NAME` for each")
    nav = (ROOT / "mkdocs.yml").read_text()
    assert all(f"reference/{p}.md" in nav for p in PACKAGES), "a reference page not in the nav"


@pytest.mark.parametrize(("page", "names"), [
    ("nn", ["linear", "batch_norm", "stochastic_depth", "drop_block", "serial"]),
    ("meta", ["maml", "reptile", "protonet", "mean_task_grads", "MetaTrainer", "TrainState",
              "tasks", "TaskStream"]),
    ("train", ["adam", "sgd", "cosine_lr"]),
    ("data", ["load_glyphs", "sample_tasks", "TaskSpec"]),
    ("index", ["bind", "Model", "key", "split"]),
])
def test_the_reference_renders_the_docstrings(site: Path, page: str, names: list[str]) -> None:
    html = (site / "reference" / ("" if page == "index" else page) / "index.html").read_text()
    headings = set(re.findall(r'id="(?:[\w.]+\.)?(\w+)"', html))
    missing = [n for n in names if n not in headings]
    assert not missing, f"reference/{page}: no entry for {missing}"
    # A docstring sentence, not only the signature: the optimiser module's own words.
    if page == "train":
        assert "matching <code>torch.optim</code> step for step" in html
