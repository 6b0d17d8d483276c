"""Property tests for your own ``torch.nn.Module``.

Run ``pytest examples/property_tests_own_model.py`` (or ``python
examples/property_tests_own_model.py``, which runs pytest on this file).

The module is converted once with ``funcgraph.from_module``; hypothesis then draws what the
tests need from :mod:`funcgraph.testing.strategies`:

* ``params_for(model)``: a fresh initialisation per example, drawn from a key through the
  module's own ``reset_parameters`` (so 20 examples test 20 different initialisations);
* ``tensors(...)``: inputs of varying batch size.

Each property is one short test: outputs are finite and shaped right; a call is pure (no
argument, no global generator changed); in evaluation each sample's output is independent of
the rest of the batch (``vmap`` over samples equals a loop); the gradient matches finite
differences; training updates the batch-norm running statistics as torch does.
"""

from __future__ import annotations

import copy

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

import funcgraph as fg
from funcgraph.testing import (
    assert_grad_matches_finite_differences,
    assert_pure,
    assert_vmap_matches_loop,
)
from funcgraph.testing import strategies as fst


class MyNet(nn.Module):
    """The module under test: linear -> batch norm (running statistics) -> GELU -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.GELU())
        self.head = nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x))


MODEL = fg.from_module(MyNet())
SETTINGS = settings(max_examples=20, deadline=None)  # deadline off: first calls warm up torch


def batches(min_batch: int = 2, max_batch: int = 6) -> st.SearchStrategy[Tensor]:
    """Inputs ``(B, 3)``: batch norm needs two samples per batch in training."""
    return st.integers(min_batch, max_batch).flatmap(
        lambda b: fst.tensors((b, 3), min_value=-3.0, max_value=3.0))


@SETTINGS
@given(fst.params_for(MODEL, with_state=True), batches(), st.booleans())
def test_outputs_are_finite_and_shaped(drawn: tuple[fg.Params, fg.State], x: Tensor,
                                       train: bool) -> None:
    params, state = drawn
    y, _ = assert_pure(MODEL.apply, params, state, x, train=train)
    assert y.shape == (x.shape[0], 2) and bool(torch.isfinite(y).all())


@SETTINGS
@given(fst.params_for(MODEL, with_state=True), batches())
def test_evaluation_treats_each_sample_alone(drawn: tuple[fg.Params, fg.State],
                                             x: Tensor) -> None:
    params, state = drawn
    assert_vmap_matches_loop(lambda row: MODEL.apply(params, state, row[None])[0][0], x)


@settings(max_examples=2, deadline=None)
@given(fst.params_for(MODEL, with_state=True), batches())
def test_gradient_matches_finite_differences(drawn: tuple[fg.Params, fg.State],
                                             x: Tensor) -> None:
    params, state = drawn
    # the state goes in as an argument, so the check casts it to float64 with the params
    assert_grad_matches_finite_differences(
        lambda p, s, inputs: MODEL.apply(p, s, inputs, train=True)[0].square().sum(),
        params, state, x)


@SETTINGS
@given(fst.keys(), batches())
def test_training_updates_running_statistics_as_torch_does(key: Tensor, x: Tensor) -> None:
    params, state = MODEL.init(key)
    _, new_state = MODEL.apply(params, state, x, train=True)
    reference = copy.deepcopy(MyNet()).train()
    reference.load_state_dict({**params, **state})
    reference(x)
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(new_state[name], buffer, msg=name)


def test_params_for_draws_a_new_initialisation_per_example() -> None:
    seen: set[bytes] = set()

    @SETTINGS
    @given(fst.params_for(MODEL))
    def record(params: fg.Params) -> None:
        seen.add(params["head.weight"].numpy().tobytes())

    record()
    assert len(seen) > 10, f"only {len(seen)} distinct initialisations in 20 examples"


if __name__ == "__main__":
    import sys

    import pytest

    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
