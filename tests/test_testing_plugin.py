"""The pytest plugin: registered by entry point, deterministic per-test keys, no hypothesis."""

from __future__ import annotations

import subprocess
import sys
import zlib
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

from funcgraph import random
from funcgraph.testing.plugin import KeyStream


def test_plugin_is_registered_through_the_pytest11_entry_point() -> None:
    found = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert found.get("funcgraph") == "funcgraph.testing.plugin"


def test_key_fixture_depends_only_on_the_seed_and_the_test_id(
    key: torch.Tensor, funcgraph_seed: int, request: pytest.FixtureRequest
) -> None:
    expected = random.fold_in(random.key(funcgraph_seed), zlib.crc32(request.node.nodeid.encode()))
    assert torch.equal(key, expected), f"key {key} != fold_in(seed, crc32(id)) {expected}"


def test_keys_fixture_folds_in_a_counter(key: torch.Tensor, keys: KeyStream) -> None:
    drawn = [keys(), keys(), keys()]
    wrong = [i for i, k in enumerate(drawn) if not torch.equal(k, random.fold_in(key, i))]
    assert not wrong, f"draws {wrong} are not fold_in(key, i)"
    assert len({tuple(k.tolist()) for k in drawn}) == 3


def test_importing_the_plugin_and_assertions_needs_no_hypothesis() -> None:
    code = (
        "import sys; sys.modules['hypothesis'] = None\n"
        "import funcgraph.testing, funcgraph.testing.plugin\n"
        "try:\n    import funcgraph.testing.strategies\nexcept ImportError:\n    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_any_project_gets_the_fixtures_and_the_seed_option(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(
        "import zlib, torch\n"
        "from funcgraph import random\n"
        "def test_key(key, request):\n"
        "    expected = random.fold_in(random.key(5), zlib.crc32(request.node.nodeid.encode()))\n"
        "    assert torch.equal(key, expected)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--funcgraph-seed", "5",
         str(tmp_path / "test_user.py")],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "funcgraph: key fixture root seed 5" in done.stdout
