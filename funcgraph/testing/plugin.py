"""pytest plugin: deterministic funcgraph keys as fixtures.

Registered through the ``pytest11`` entry point, so installing funcgraph makes these fixtures
available in every project's tests, with no conftest:

- ``key``: a key of its own for each test, ``fold_in(key(seed), crc32(test id))``. It depends
  only on the root seed and the test's id, not on which other tests run or in what order, so
  ``pytest -k one_test`` reproduces exactly the key a full run used.
- ``keys``: a :class:`KeyStream` from that key; each call folds in the next counter
  (``keys()`` gives ``fold_in(key, 0)``, then ``fold_in(key, 1)``, ...) for a fresh key per
  use inside one test.
- ``funcgraph_seed``: the root seed, from ``--funcgraph-seed N`` or the ``FUNCGRAPH_SEED``
  environment variable (default 0). The run header prints it.

This module imports no hypothesis, so the fixtures work where the ``test`` extra is absent.
"""

from __future__ import annotations

import os
import zlib

import pytest

from .. import random
from ..random import Key

_OPTION = "--funcgraph-seed"


class KeyStream:
    """Fresh keys on demand: the n-th call (from 0) returns ``fold_in(base, n)``."""

    def __init__(self, base: Key) -> None:
        self.base = base
        self.count = 0

    def __call__(self) -> Key:
        k = random.fold_in(self.base, self.count)
        self.count += 1
        return k


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("funcgraph").addoption(
        _OPTION,
        type=int,
        default=None,
        help="root seed of the funcgraph `key` fixture (default: $FUNCGRAPH_SEED or 0)",
    )


def _root_seed(config: pytest.Config) -> int:
    seed = config.getoption(_OPTION)
    return int(os.environ.get("FUNCGRAPH_SEED", "0")) if seed is None else int(seed)


def pytest_report_header(config: pytest.Config) -> str:
    return f"funcgraph: key fixture root seed {_root_seed(config)} ({_OPTION} N to change)"


@pytest.fixture(scope="session")
def funcgraph_seed(pytestconfig: pytest.Config) -> int:
    """The root seed of the ``key`` fixture."""
    return _root_seed(pytestconfig)


@pytest.fixture
def key(request: pytest.FixtureRequest, funcgraph_seed: int) -> Key:
    """A key for this test: the root key with the test id's CRC-32 folded in."""
    test_id = zlib.crc32(request.node.nodeid.encode())
    return random.fold_in(random.key(funcgraph_seed), test_id)


@pytest.fixture
def keys(key: Key) -> KeyStream:
    """A :class:`KeyStream` over this test's ``key``: call it for each fresh key."""
    return KeyStream(key)
