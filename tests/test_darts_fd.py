"""benchmarks/darts_fd.py's measurement at a tiny size: on smooth ops the paper's
finite-difference hypergradient and a central difference of the unrolled loss agree with the
exact hypergradient; on DARTS' ReLU and max-pool ops the finite difference is far off."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from funcgraph import random

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "darts_fd.py"


@pytest.fixture(scope="module")
def darts_fd() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_bench_darts_fd", SCRIPT)
    assert spec is not None and spec.loader is not None, f"cannot load {SCRIPT}"
    module = importlib.util.module_from_spec(spec)
    sys.modules["_bench_darts_fd"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows(darts_fd: ModuleType) -> dict[str, dict[str, float]]:
    """Each op set's row at radius 1e-3 on a C=2, 3-cell supernet and 8x8 random images."""
    x = random.normal(random.key(5), (16, 1, 8, 8))
    y = torch.arange(16) % 3
    train, val = (x[:8], y[:8]), (x[8:], y[8:])
    return {space: darts_fd.measure(space, train, val, C=2, layers=3, num_classes=3,
                                    radii=[1e-3])[0] for space in ("darts", "smooth")}


def test_on_smooth_ops_both_differences_match_the_exact_hypergradient(
        rows: dict[str, dict[str, float]]) -> None:
    row = rows["smooth"]
    assert row["fd_max"] < 1e-4 and row["fd_l2"] < 1e-4, (
        f"SiLU and average pooling: the paper's difference at radius 1e-3 is within O(r^2) "
        f"of exact, got {row}")
    assert row["cd"] < 1e-6, f"the unrolled loss's central difference vs exact . d: {row}"


def test_on_darts_ops_the_finite_difference_is_far_off(
        rows: dict[str, dict[str, float]]) -> None:
    darts, smooth = rows["darts"], rows["smooth"]
    assert darts["fd_max"] > 0.1, f"ReLU/max-pool kinks inside the difference: {darts}"
    assert darts["fd_max"] > 1e3 * smooth["fd_max"], (darts, smooth)


def test_the_smooth_space_swaps_relu_for_silu_and_max_for_average_pooling(
        darts_fd: ModuleType) -> None:
    x = torch.linspace(-2, 2, 9)
    with darts_fd.activation("smooth"):
        swapped = (torch.relu(x), torch.nn.functional.relu(x))
    for y in swapped:
        torch.testing.assert_close(y, torch.nn.functional.silu(x))
    torch.testing.assert_close(torch.relu(x), x.clamp_min(0), msg="the mode ends with its block")
    names = [p if isinstance(p, str) else p[0] for p in darts_fd.SPACES["smooth"]]
    assert "max_pool_3x3" not in names and len(names) == len(darts_fd.SPACES["darts"]), names
