"""Mistakes that once passed without a word are refused where the object is built: an
optimiser or schedule with an impossible argument, a learner given something that is no
model, and a batch-norm model bound for evaluation under a learner."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from funcgraph import Model, bind, from_module, nn, random
from funcgraph.errors import ConfigError
from funcgraph.meta import imaml, maml, mamlpp, protonet, reptile
from funcgraph.nas import BilevelConfig
from funcgraph.train import adam, cosine_lr, sgd

LEARNERS = [maml, mamlpp, imaml, reptile, lambda apply: protonet(apply, ways=5)]
NAMES = ["maml", "mamlpp", "imaml", "reptile", "protonet"]


@pytest.mark.parametrize(("build", "message"), [
    (lambda: adam(-1e-3), "adam: lr must be a finite number >= 0.0, got -0.001"),
    (lambda: adam(1e-3, decoupled=True, eps=0.0), "adamw: eps must be a finite number > 0"),
    (lambda: adam(betas=(0.9, 1.0)), "adam: betas[1] must be in [0, 1)"),
    (lambda: adam(betas=0.9), "adam: betas must be a pair"),  # type: ignore[arg-type]
    (lambda: sgd(math.nan), "sgd: lr must be a finite number >= 0.0, got nan"),
    (lambda: sgd(0.1, momentum=-0.5), "sgd: momentum must be a finite number >= 0"),
    (lambda: sgd(0.1, nesterov=True), "sgd: nesterov needs momentum > 0"),
    (lambda: sgd(0.1, momentum=1.0), "sgd: momentum must be in [0, 1)"),
    (lambda: cosine_lr(0.1, 1, 10, min_lr=0.5), "cosine_lr: min_lr (0.5) must not exceed"),
    (lambda: BilevelConfig(w_lr=0.0005), "BilevelConfig: w_lr_min (0.001) must not exceed"),
    (lambda: BilevelConfig(w_momentum=1.2), "sgd: momentum must be in [0, 1)"),
    (lambda: cosine_lr(0.1, -1, 10), "cosine_lr: step must be"),
    (lambda: cosine_lr(0.1, 1, 0), "cosine_lr: total_steps must be"),
])
def test_optimisers_and_schedules_check_their_arguments_when_built(build, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        build()


@given(lr=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5),
                    st.booleans(), st.text(max_size=3)))
def test_any_learning_rate_is_a_step_or_a_clear_refusal(lr: object) -> None:
    for make in (adam, sgd):
        try:
            opt = make(lr)  # type: ignore[arg-type]
        except ConfigError:
            continue
        assert isinstance(lr, int | float) and not isinstance(lr, bool)
        assert math.isfinite(lr) and lr >= 0
        p = {"w": torch.ones(2)}
        new, _ = opt.update(p, {"w": torch.ones(2)}, opt.init(p))
        assert not bool((new["w"] > p["w"]).any()), "a rate >= 0 never steps uphill"


def bn_model() -> tuple[nn.Model, dict, dict]:
    model = nn.serial(nn.conv2d(1, 2, 3), nn.batch_norm(2), nn.flatten(), nn.linear(2 * 4 * 4, 5))
    params, state = model.init(random.key(0))
    return model, params, state


@pytest.mark.parametrize("learner", LEARNERS, ids=NAMES)
def test_a_learner_binds_a_model_or_module_for_training_itself(learner) -> None:
    """A Model or an nn.Module is no longer a mistake: the learner binds it with
    ``train=True`` (tests/test_short_path.py checks it equals the bound function)."""
    model, _, _ = bn_model()
    assert learner(model).model is model
    converted = learner(torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2)))
    assert isinstance(converted.model, Model)
    with pytest.raises(ConfigError, match="apply must be a function f.*a funcgraph Model or a "
                                          "torch.nn.Module, got 3"):
        learner(3)


@pytest.mark.parametrize("learner", LEARNERS, ids=NAMES)
def test_batch_norm_bound_for_evaluation_is_refused_under_a_learner(learner) -> None:
    model, _, state = bn_model()
    assert "0.running_mean" not in state and "1.running_mean" in state
    with pytest.raises(ConfigError, match=r"bound for evaluation \(train=False\)"):
        learner(bind(model, state))
    learner(bind(model, state, train=True))  # the fix is accepted
    learner(bind(model, {}))  # no running statistics: batch statistics either way


def test_a_converted_module_with_batch_norm_bound_for_evaluation_is_refused() -> None:
    module = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2))
    model = from_module(module)
    _, state = model.init(random.key(0))
    with pytest.raises(ConfigError, match="bound for evaluation"):
        maml(bind(model, state))


def test_the_finite_difference_helper_works_as_its_docstring_shows_on_batch_norm() -> None:
    """The docstring's example, on a model with batch norm and running statistics, in
    float64 (the state passed as an argument is cast with the params)."""
    import torch.nn.functional as F

    from funcgraph.testing import assert_grad_matches_finite_differences

    model, params, state = bn_model()
    x, y = random.normal(random.key(1), (4, 1, 6, 6)), torch.tensor([0, 1, 2, 3])
    loss = lambda p, s, x, y: F.cross_entropy(bind(model, s)(p, x), y)  # noqa: E731
    grads = assert_grad_matches_finite_differences(loss, params, state, x, y)
    assert set(grads) == set(params) and all(g.dtype == torch.float64 for g in grads.values())
