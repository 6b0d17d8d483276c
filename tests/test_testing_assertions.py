"""funcgraph.testing assertions: each passes on a correct function and fails, with a message
naming what broke, on a deliberately broken one."""

from __future__ import annotations

import random as py_random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

import funcgraph as fg
from funcgraph import random
from funcgraph.models import early_exit_cnn
from funcgraph.testing import (
    assert_branches_covered,
    assert_grad_matches_finite_differences,
    assert_matches_module,
    assert_pure,
    assert_vmap_matches_loop,
    record_branches,
)


def mlp() -> fg.Model:
    return fg.nn.serial(fg.nn.linear(3, 4), fg.nn.tanh(), fg.nn.linear(4, 2))


def torch_mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


# assert_pure


def test_assert_pure_accepts_a_keyed_model_and_returns_the_output() -> None:
    model = fg.nn.serial(fg.nn.linear(3, 3), fg.nn.dropout(0.5))
    params, state = model.init(random.key(0))
    x = torch.ones(2, 3)
    y, _ = assert_pure(model.apply, params, state, x, key=random.key(1), train=True)
    assert torch.equal(y, model.apply(params, state, x, key=random.key(1), train=True)[0]), (
        "assert_pure must return the model's own output")


def test_assert_pure_names_the_mutated_argument() -> None:
    def scale_in_place(params: dict[str, Tensor], x: Tensor) -> Tensor:
        params["w"].mul_(2)
        return x * params["w"]

    with pytest.raises(AssertionError, match=r"mutated args\[0\]\['w'\] in place"):
        assert_pure(scale_in_place, {"w": torch.ones(2)}, torch.ones(2))


def test_assert_pure_catches_an_in_place_write_of_the_same_values() -> None:
    def rewrite(x: Tensor) -> Tensor:
        x.copy_(x.clone())  # values unchanged, but an in-place op on the argument
        return x + 1

    with pytest.raises(AssertionError, match=r"in-place op, values unchanged"):
        assert_pure(rewrite, torch.ones(3))


@pytest.mark.parametrize(
    "draw, source",
    [
        (lambda x: x + torch.randn(x.shape), "torch"),
        (lambda x: x + py_random.random(), "random"),
        (lambda x: x + float(np.random.rand()), "numpy"),
    ],
)
def test_assert_pure_names_the_global_generator_used(
    draw: Callable[[Tensor], Tensor], source: str
) -> None:
    with pytest.raises(AssertionError, match=rf"global random generator \({source}\)"):
        assert_pure(draw, torch.ones(2))


def test_assert_pure_catches_hidden_state() -> None:
    calls = [0]

    def counting(x: Tensor) -> Tensor:
        calls[0] += 1
        return x * calls[0]

    with pytest.raises(AssertionError, match="two calls with the same arguments differ"):
        assert_pure(counting, torch.ones(2))


# assert_vmap_matches_loop


def test_vmap_matches_loop_on_a_model_batched_over_inputs_and_params() -> None:
    model = mlp()
    f = fg.bind(model, {})
    params = fg.params.stack([model.init(random.key(i))[0] for i in range(3)])
    xs = random.normal(random.key(9), (3, 5, 3))
    out = assert_vmap_matches_loop(f, params, xs)
    assert out.shape == (3, 5, 2)
    assert_vmap_matches_loop(f, fg.params.unstack(params)[0], xs, in_dims=(None, 0))


def test_vmap_matches_loop_reports_the_differing_batch_element() -> None:
    calls = [0]

    def hidden_counter(x: Tensor) -> Tensor:
        calls[0] += 1
        return x * calls[0]

    with pytest.raises(AssertionError, match=r"vmap vs loop: output: .* worst at \[2, 0\]"):
        assert_vmap_matches_loop(hidden_counter, torch.ones(3, 2))


def test_vmap_matches_loop_explains_python_control_flow_on_tensors() -> None:
    def python_if(x: Tensor) -> Tensor:
        return x * 2 if x.sum() > 0 else x / 2

    with pytest.raises(AssertionError, match=r"failed under vmap(.|\n)*funcgraph.cond"):
        assert_vmap_matches_loop(python_if, torch.ones(3, 2))


def test_vmap_matches_loop_rejects_unequal_batch_sizes() -> None:
    with pytest.raises(AssertionError, match="failed under vmap"):
        assert_vmap_matches_loop(torch.add, torch.ones(3), torch.ones(4))


# assert_grad_matches_finite_differences


def test_finite_differences_agree_with_autograd_for_a_model_loss() -> None:
    model = mlp()
    params, state = model.init(random.key(0))
    x, y = random.normal(random.key(1), (4, 3)), torch.tensor([0, 1, 1, 0])

    def loss(p: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        return torch.nn.functional.cross_entropy(fg.bind(model, state)(p, x), y)

    grads = assert_grad_matches_finite_differences(loss, params, x, y)
    assert isinstance(grads, dict) and set(grads) == set(params)
    assert all(g.dtype == torch.float64 for g in grads.values())


def test_finite_differences_accept_a_single_tensor() -> None:
    g = assert_grad_matches_finite_differences(lambda w: (w**3).sum(), torch.tensor([1.0, -2.0]))
    assert isinstance(g, Tensor)
    torch.testing.assert_close(g, torch.tensor([3.0, 12.0], dtype=torch.float64))


class _WrongBackward(torch.autograd.Function):
    """``3 x`` whose backward claims ``2``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return 3 * x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return 2 * grad


def test_finite_differences_name_the_entry_with_a_wrong_gradient() -> None:
    params = {"w": torch.ones(2, 2), "b": torch.zeros(2)}

    def loss(p: dict[str, Tensor]) -> Tensor:
        return (_WrongBackward.apply(p["w"]).sum(0) * p["b"].exp()).sum()

    with pytest.raises(
        AssertionError, match=r"d fn / d params\['w'\]\[0, 0\]: autograd 2, central difference 3"
    ):
        assert_grad_matches_finite_differences(loss, params)


def test_finite_differences_catch_a_detach_on_the_path() -> None:
    broken = r"d fn / d params\[0\]: autograd 2, central difference 4"
    with pytest.raises(AssertionError, match=broken):
        assert_grad_matches_finite_differences(
            lambda w: (w * w.detach()).sum(), torch.tensor([2.0, 1.0])
        )


def test_finite_differences_need_a_scalar() -> None:
    with pytest.raises(ValueError, match="must return a scalar"):
        assert_grad_matches_finite_differences(lambda w: w * 2, torch.ones(3))


# assert_matches_module


def test_matches_module_for_an_mlp_and_for_batch_norm_state() -> None:
    assert_matches_module(mlp(), torch_mlp(), torch.randn(5, 3))
    assert_matches_module(fg.nn.batch_norm(3), torch.nn.BatchNorm1d(3), torch.randn(6, 3),
                          train=True)


def test_matches_module_leaves_the_module_untouched() -> None:
    module = torch_mlp()
    before = {n: t.clone() for n, t in module.state_dict().items()}
    assert_matches_module(mlp(), module, torch.randn(2, 3))
    changed = [n for n, t in module.state_dict().items() if not torch.equal(before[n], t)]
    assert not changed, f"the module's state changed: {changed}"


def test_matches_module_reports_missing_and_extra_names() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    with pytest.raises(AssertionError, match=r"missing \['1.bias', '1.weight'\], extra \['2"):
        assert_matches_module(mlp(), module, torch.randn(2, 3))


def test_matches_module_reports_an_output_mismatch() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with pytest.raises(AssertionError, match=r"output: \d+ of 10 elements differ"):
        assert_matches_module(mlp(), module, torch.randn(5, 3))


def test_matches_module_reports_a_wrong_running_statistic() -> None:
    module = torch.nn.BatchNorm1d(3, momentum=0.5)
    with pytest.raises(AssertionError, match=r"state\['running_mean'\] after a training call"):
        assert_matches_module(fg.nn.batch_norm(3), module, torch.randn(6, 3) + 1, train=True)


def test_matches_module_reports_a_wrong_gradient() -> None:
    def forward(params: dict[str, Tensor], x: Tensor) -> Tensor:
        w = params["weight"]
        # same value as F.linear, but the gradient to the weight is cut
        return x @ (w - w + w.detach()).T + params["bias"]

    broken = fg.stateless("linear", lambda k: fg.nn.linear(3, 2).init(k)[0], forward)
    with pytest.raises(AssertionError, match=r"gradient of params\['weight'\]"):
        assert_matches_module(broken, torch.nn.Linear(3, 2), torch.randn(4, 3))


# assert_branches_covered


def double_or_halve(x: Tensor) -> Tensor:
    return x * 2 if x.sum() > 0 else x / 2


def test_branches_covered_when_both_ways_are_taken() -> None:
    inputs = [torch.ones(3), -torch.ones(3), torch.tensor([2.0, -1.0, 0.0])]
    record = assert_branches_covered(double_or_halve, inputs)
    ((site, outcomes),) = record.taken.items()
    assert "double_or_halve" in site and __file__ in site
    assert outcomes == {True: [0, 2], False: [1]}


def test_branches_covered_names_the_branch_never_taken() -> None:
    with pytest.raises(AssertionError, match=r"only True was taken over 2 inputs; the False"):
        assert_branches_covered(double_or_halve, [torch.ones(3), torch.ones(2)])


def test_branches_covered_fails_without_any_decision() -> None:
    with pytest.raises(AssertionError, match="no data-dependent decision"):
        assert_branches_covered(torch.relu, [torch.ones(2), -torch.ones(2)])


def test_record_branches_files_each_site_separately() -> None:
    def two_decisions(x: Tensor) -> Tensor:
        y = x + 1 if x.max() > 1 else x
        return y.neg() if y.min() < 0 else y

    with record_branches() as record:
        two_decisions(torch.tensor([2.0, -3.0]))
    assert sorted(o for per_site in record.taken.values() for o in per_site) == [True, True]
    assert len(record.taken) == 2


def test_branches_covered_files_a_funcgraph_cond_under_its_caller() -> None:
    def f(x: Tensor) -> Tensor:
        return fg.cond(x.sum() > 0, lambda v: v * 2, lambda v: v / 2, x)

    record = assert_branches_covered(f, [torch.ones(2), -torch.ones(2)])
    ((site, _),) = record.taken.items()
    assert site.startswith(__file__) and site.endswith(" in f")


def early_exit_outputs(threshold: float | None) -> tuple[Callable[[Tensor], Any], list[Tensor]]:
    """The early-exit CNN on 4 batches; ``threshold=None`` puts it at the median continue
    probability, so some samples exit and others continue."""
    images = [random.normal(random.key(i), (2, 1, 8, 8)) for i in range(4)]
    model = early_exit_cnn(num_classes=3, width=4)
    params, state = model.init(random.key(0))
    if threshold is None:
        probs = torch.cat([model.apply(params, state, x)[0].continue_prob for x in images])
        threshold = float(probs.median())
    model = early_exit_cnn(num_classes=3, width=4, threshold=threshold)
    return (lambda x: model.apply(params, state, x)[0]), images


def test_branches_covered_takes_per_sample_decisions_of_an_early_exit_model() -> None:
    run, images = early_exit_outputs(threshold=None)
    record = assert_branches_covered(run, images, decisions=lambda y: {"exit": y.exited})
    assert set(record.taken["exit"]) == {True, False}


def test_branches_covered_reports_an_exit_that_is_never_skipped() -> None:
    run, images = early_exit_outputs(threshold=1.0)  # p > 1 never holds: every sample exits
    with pytest.raises(AssertionError, match=r"exit: only True was taken over 4 inputs"):
        assert_branches_covered(run, images, decisions=lambda y: {"exit": y.exited})


def test_assert_pure_catches_assignment_into_the_callers_dict() -> None:
    def reassign(params: dict[str, Tensor]) -> Tensor:
        params["w"] = params["w"] * 2
        return params["w"]

    def add_entry(params: dict[str, Tensor]) -> Tensor:
        params["cache"] = params["w"].sum()
        return params["w"]

    with pytest.raises(AssertionError, match=r"replaced args\[0\]\['w'\] with another tensor"):
        assert_pure(reassign, {"w": torch.ones(2)})
    with pytest.raises(AssertionError, match=r"added \[\"args\[0\]\['cache'\]\"\]"):
        assert_pure(add_entry, {"w": torch.ones(2)})


def test_branches_covered_can_leave_out_a_validation_check() -> None:
    def checked(x: Tensor) -> Tensor:
        if torch.isnan(x).any():  # validation: never taken on good inputs
            raise ValueError("nan")
        return double_or_halve(x)

    inputs = [torch.ones(2), -torch.ones(2)]
    with pytest.raises(AssertionError, match="in checked: only False was taken"):
        assert_branches_covered(checked, inputs)
    assert_branches_covered(checked, inputs, sites=lambda site: "in checked" not in site)
