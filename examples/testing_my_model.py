"""Testing dynamic models with funcgraph.testing: run ``pytest examples/testing_my_model.py``.

Two models whose computation depends on the data:

* the guide's conditional model, ``x * 2`` if ``x.sum() > 0`` else ``x / 2``, written with
  ``funcgraph.cond`` so it also works under ``vmap`` and ``torch.export``;
* the early-exit CNN (``funcgraph.models.early_exit_cnn``), where each sample either stops
  after the first block or continues through the second.

For each: every branch is taken by the test inputs (``assert_branches_covered``), each branch
computes what it should, input shapes vary (hypothesis), and gradients match finite
differences. The ``key`` fixture comes from funcgraph's pytest plugin: a key per test, the same
on every run.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given, settings
from torch import Tensor

import funcgraph as fg
from funcgraph.models import early_exit_cnn
from funcgraph.models.early_exit import ExitOutput
from funcgraph.testing import (
    assert_branches_covered,
    assert_grad_matches_finite_differences,
    assert_pure,
    assert_vmap_matches_loop,
)
from funcgraph.testing import strategies as fst


def double_or_halve(x: Tensor) -> Tensor:
    """The conditional model: ``x * 2`` when ``x.sum() > 0``, else ``x / 2``."""
    return fg.cond(x.sum() > 0, lambda v: v * 2, lambda v: v / 2, x)


# --- the conditional model -------------------------------------------------------------------


def test_both_branches_are_taken() -> None:
    record = assert_branches_covered(double_or_halve, [torch.ones(3), -torch.ones(3)])
    ((site, outcomes),) = record.taken.items()
    assert outcomes == {True: [0], False: [1]}, site


@settings(max_examples=20, deadline=None)  # deadline off: the first call warms torch up
@given(fst.tensors(fst.shapes(min_dims=1, max_dims=3)))
def test_each_branch_computes_its_formula_for_any_shape(x: Tensor) -> None:
    y = assert_pure(double_or_halve, x)
    expected = x * 2 if float(x.sum()) > 0 else x / 2
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_batched_inputs_take_their_own_branch() -> None:
    xs = torch.tensor([[1.0, 2.0], [-1.0, -2.0], [3.0, -1.0]])
    ys = assert_vmap_matches_loop(double_or_halve, xs)
    torch.testing.assert_close(ys, torch.tensor([[2.0, 4.0], [-0.5, -1.0], [6.0, -2.0]]))


def test_gradient_of_each_branch() -> None:
    for x, slope in ((torch.tensor([1.0, 2.0]), 2.0), (torch.tensor([-1.0, -2.0]), 0.5)):
        grad = assert_grad_matches_finite_differences(lambda v: double_or_halve(v).sum(), x)
        torch.testing.assert_close(grad, torch.full((2,), slope, dtype=torch.float64))


# --- the early-exit CNN ----------------------------------------------------------------------


def early_exit_setup(key: Tensor) -> tuple[fg.Model, fg.Params, fg.State, list[Tensor]]:
    """A small early-exit CNN whose threshold sits at the median continue probability of the
    test images, so some samples exit early and others continue."""
    images = [fg.random.normal(k, (4, 1, 8, 8)) for k in fg.random.split(key, 3)]
    model = early_exit_cnn(num_classes=3, width=4)
    params, state = model.init(key)
    probs = torch.cat([model.apply(params, state, x)[0].continue_prob for x in images])
    model = early_exit_cnn(num_classes=3, width=4, threshold=float(probs.median()))
    return model, params, state, images


def test_early_exit_takes_both_paths(key: Tensor) -> None:
    model, params, state, images = early_exit_setup(key)
    assert_branches_covered(
        lambda x: model.apply(params, state, x)[0], images,
        decisions=lambda y: {"exit": y.exited},
    )


def test_each_path_gives_its_head_output(key: Tensor) -> None:
    model, params, state, images = early_exit_setup(key)
    # threshold 0: p > 0 always holds, so every sample runs the deep path
    deep_model = early_exit_cnn(num_classes=3, width=4, threshold=0.0)
    for x in images:
        y: ExitOutput = assert_pure(model.apply, params, state, x)[0]
        deep: ExitOutput = deep_model.apply(params, state, x)[0]
        exited = y.exited
        torch.testing.assert_close(y.logits[exited], y.exit_logits[exited])
        torch.testing.assert_close(y.logits[~exited], deep.logits[~exited])


def test_a_sample_does_not_depend_on_its_batch(key: Tensor) -> None:
    model, params, state, images = early_exit_setup(key)
    x = images[0]
    batched: Any = model.apply(params, state, x)[0].logits
    alone = torch.cat([model.apply(params, state, x[i : i + 1])[0].logits for i in range(len(x))])
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-6)
