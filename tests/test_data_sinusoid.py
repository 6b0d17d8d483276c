"""Sinusoid regression tasks: ranges, the formula, shapes, determinism."""

from __future__ import annotations

import math

import pytest
import torch

from funcgraph import random
from funcgraph.data import sinusoid_tasks
from funcgraph.errors import TaskSpecError


def test_shapes_ranges_and_formula() -> None:
    b = sinusoid_tasks(random.key(0), num_tasks=500, shots=10, queries=7)
    assert b.support_x.shape == (500, 10, 1) and b.support_y.shape == (500, 10, 1)
    assert b.query_x.shape == (500, 7, 1) and b.query_y.shape == (500, 7, 1)
    assert 0.1 <= b.amplitude.min() and b.amplitude.max() <= 5.0
    assert 0.0 <= b.phase.min() and b.phase.max() <= math.pi
    for x in (b.support_x, b.query_x):
        assert -5.0 <= x.min() and x.max() <= 5.0
    assert b.amplitude.max() > 4.5 and b.amplitude.min() < 0.6, "the whole range is used"
    for x, y in ((b.support_x, b.support_y), (b.query_x, b.query_y)):
        expected = b.amplitude[:, None, None] * torch.sin(x - b.phase[:, None, None])
        assert torch.allclose(y, expected, atol=1e-5), "y must be amplitude * sin(x - phase)"


def test_deterministic_per_key() -> None:
    a = sinusoid_tasks(random.key(7), 3, 5, 5)
    b = sinusoid_tasks(random.key(7), 3, 5, 5)
    c = sinusoid_tasks(random.key(8), 3, 5, 5)
    assert torch.equal(a.query_y, b.query_y), "the same key must give the same tasks"
    assert not torch.equal(a.query_y, c.query_y), "different keys gave the same tasks"


def test_bad_counts() -> None:
    with pytest.raises(TaskSpecError, match="shots must be an int >= 1, got 0"):
        sinusoid_tasks(random.key(0), 2, 0, 5)
