"""The pytest plugin: registered by entry point, deterministic per-test keys, no hypothesis."""

from __future__ import annotations

import subprocess
import sys
import zlib
from importlib.metadata import entry_points

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
    assert torch.equal(key, expected)


def test_keys_fixture_folds_in_a_counter(key: torch.Tensor, keys: KeyStream) -> None:
    drawn = [keys(), keys(), keys()]
    assert all(torch.equal(k, random.fold_in(key, i)) for i, k in enumerate(drawn))
    assert len({tuple(k.tolist()) for k in drawn}) == 3


def test_importing_the_plugin_and_assertions_needs_no_hypothesis() -> None:
    code = (
        "import sys; sys.modules['hypothesis'] = None\n"
        "import funcgraph.testing, funcgraph.testing.plugin\n"
        "try:\n    import funcgraph.testing.strategies\nexcept ImportError:\n    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok", out.stderr
