"""count_calls counts one torch function's calls, and only inside its block."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from funcgraph import random
from funcgraph.debug import count_calls
from funcgraph.models import mlp


def test_counts_one_function_only_inside_the_block() -> None:
    x = torch.ones(2, 3)
    F.relu(x)
    with count_calls(F.relu) as relus, count_calls(torch.tanh) as tanhs:
        F.relu(x)
        F.relu(F.relu(x))
        torch.sigmoid(x)
    F.relu(x)
    assert (relus.count, tanhs.count) == (3, 0)


def test_sees_the_calls_a_model_makes_and_leaves_its_output_unchanged() -> None:
    model = mlp(3, 2, hidden=[4, 4])
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (5, 3))
    want, _ = model.apply(params, state, x)
    with count_calls(F.linear) as linears:
        got, _ = model.apply(params, state, x)
    assert linears.count == 3, "two hidden layers and the output layer"
    torch.testing.assert_close(got, want, rtol=0, atol=0)
