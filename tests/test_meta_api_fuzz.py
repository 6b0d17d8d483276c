"""A hypothesis fuzzer of the meta-learning API: every public constructor and entry point,
hostile argument values. Construction either succeeds or raises a funcgraph error; no raw
TypeError, ValueError or RuntimeError from Python or torch reaches the caller."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from funcgraph import random
from funcgraph.errors import ConfigError, FuncgraphError
from funcgraph.meta import (
    InnerLoop,
    Task,
    adapt,
    anil,
    evaluate,
    fomaml,
    imaml,
    maml,
    mamlpp,
    mean_task_grads,
    meta_step,
    metasgd,
    protonet,
    reptile,
)
from funcgraph.train import adam, check_diverged

HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(-10**9, 10**9),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
    st.lists(st.integers(-2, 2), max_size=3), st.just(object()), st.just(torch.zeros(2)),
    st.just(-1), st.just(0), st.just(0.0), st.just(float("nan")), st.just(float("inf")),
)
"""Values a user may pass by mistake: wrong types, NaN, infinities, zero and negatives."""


def apply(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return x @ params["w"]


PARAMS = {"w": torch.zeros(3, 2), "head.b": torch.zeros(2)}


def tasks(num: int = 2) -> Task:
    g = torch.Generator().manual_seed(0)
    return Task(torch.randn(num, 4, 3, generator=g), torch.randint(0, 2, (num, 4), generator=g),
                torch.randn(num, 4, 3, generator=g), torch.randint(0, 2, (num, 4), generator=g))


CONSTRUCTORS: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "maml": (maml, ("kind", "inner_steps", "inner_lr", "eval_steps", "first_order", "learn_lr",
                    "adapt_prefix", "remat", "name")),
    "fomaml": (fomaml, ("inner_steps", "inner_lr", "eval_steps")),
    "metasgd": (metasgd, ("inner_steps", "inner_lr", "remat")),
    "anil": (anil, ("head", "inner_steps", "inner_lr")),
    "mamlpp": (mamlpp, ("kind", "inner_steps", "inner_lr", "eval_steps", "lslr",
                        "multi_step_loss", "msl_anneal_steps", "meta_steps",
                        "first_order_until", "per_step_bn", "bn_suffixes", "name")),
    "imaml": (imaml, ("kind", "inner_steps", "inner_lr", "lam", "cg_steps", "cg_tol",
                      "eval_steps", "name")),
    "reptile": (reptile, ("kind", "inner_steps", "inner_lr", "eval_steps", "inner_optimizer",
                          "ways")),
    "protonet": (protonet, ("ways",)),
}


def expect_funcgraph_error_only(call: Callable[[], Any]) -> None:
    try:
        call()
    except FuncgraphError:
        pass


@pytest.mark.parametrize("name", sorted(CONSTRUCTORS))
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_constructors_refuse_hostile_arguments(name: str, data: st.DataObject) -> None:
    build, arguments = CONSTRUCTORS[name]
    chosen = data.draw(st.lists(st.sampled_from(arguments), min_size=1, max_size=3,
                                unique=True))
    kwargs = {a: data.draw(HOSTILE, label=a) for a in chosen}
    if name == "protonet":
        kwargs.setdefault("ways", 2)
    expect_funcgraph_error_only(lambda: build(apply, **kwargs))


@settings(max_examples=50, deadline=None)
@given(steps=HOSTILE, lr=HOSTILE, first_order=HOSTILE, prefix=HOSTILE)
def test_inner_loop_refuses_hostile_settings(steps: Any, lr: Any, first_order: Any,
                                             prefix: Any) -> None:
    expect_funcgraph_error_only(lambda: InnerLoop(steps, lr, first_order, prefix))


@settings(max_examples=50, deadline=None)
@given(params=st.one_of(HOSTILE, st.just(PARAMS)), inner=st.one_of(HOSTILE, st.just(InnerLoop())),
       minibatches=HOSTILE, loss=st.one_of(HOSTILE, st.just(torch.nn.functional.mse_loss)))
def test_adapt_refuses_hostile_arguments(params: Any, inner: Any, minibatches: Any,
                                         loss: Any) -> None:
    x, y = torch.zeros(4, 3), torch.zeros(4, 2)
    expect_funcgraph_error_only(lambda: adapt(apply, params, x, y, loss=loss, inner=inner,
                                              minibatches=minibatches))


@settings(max_examples=50, deadline=None)
@given(strategy=HOSTILE, chunk_size=HOSTILE, workers=HOSTILE,
       batch=st.one_of(HOSTILE, st.just(tasks())))
def test_mean_task_grads_refuses_hostile_arguments(strategy: Any, chunk_size: Any, workers: Any,
                                                   batch: Any) -> None:
    learner = maml(apply)
    expect_funcgraph_error_only(lambda: mean_task_grads(
        learner.task_grad, PARAMS, batch, strategy=strategy, chunk_size=chunk_size,
        workers=workers))


@settings(max_examples=50, deadline=None)
@given(episodes=HOSTILE, batch=HOSTILE, strategy=HOSTILE, key=HOSTILE, dtype=HOSTILE)
def test_evaluate_refuses_hostile_arguments(episodes: Any, batch: Any, strategy: Any, key: Any,
                                            dtype: Any) -> None:
    learner = maml(apply)
    expect_funcgraph_error_only(lambda: evaluate(
        learner, PARAMS, lambda k, n: tasks(n), key=key, episodes=episodes, batch=batch,
        strategy=strategy, dtype=dtype))


@settings(max_examples=50, deadline=None)
@given(step=HOSTILE, lr=HOSTILE, strategy=HOSTILE, reduce=HOSTILE,
       learner=st.one_of(HOSTILE, st.just("maml")), optimizer=st.one_of(HOSTILE, st.just("adam")))
def test_meta_step_refuses_hostile_arguments(step: Any, lr: Any, strategy: Any, reduce: Any,
                                             learner: Any, optimizer: Any) -> None:
    learner = maml(apply) if learner == "maml" else learner
    optimizer = adam(1e-3) if optimizer == "adam" else optimizer
    opt_state = adam(1e-3).init(PARAMS)
    expect_funcgraph_error_only(lambda: meta_step(
        learner, optimizer, PARAMS, opt_state, tasks(), step=step, lr=lr, strategy=strategy,
        reduce=reduce))


@settings(max_examples=50, deadline=None)
@given(loss=HOSTILE, step=HOSTILE, bound=HOSTILE)
def test_check_diverged_refuses_hostile_arguments(loss: Any, step: Any, bound: Any) -> None:
    expect_funcgraph_error_only(lambda: check_diverged(loss, step=step, bound=bound))


@pytest.mark.parametrize(("call", "message"), [
    (lambda: maml(apply, inner_lr=float("nan")), r"maml: inner_lr must be a finite number > 0, "
                                                 r"got nan"),
    (lambda: maml(apply, inner_lr=-1), r"maml: inner_lr must be a finite number > 0, got -1"),
    (lambda: reptile(apply, inner_lr=0), r"reptile: inner_lr must be a finite number > 0, got 0"),
    (lambda: mamlpp(apply, inner_lr=math.inf), r"mamlpp: inner_lr must be a finite number > 0"),
    (lambda: fomaml(apply, inner_steps=-1), r"fomaml: inner_steps must be an int >= 0, got -1"),
    (lambda: protonet(apply, ways=1), r"protonet: ways must be an int >= 2, got 1"),
    (lambda: maml(3), r"maml: apply must be a function f\(params, x\)"),
    (lambda: maml(apply, kind=[1]), r"objective: kind must be one of"),
    (lambda: InnerLoop(lr=float("nan")), r"InnerLoop: lr must be a finite number > 0, got nan"),
    (lambda: adapt(apply, PARAMS, torch.zeros(1), torch.zeros(1),
                   loss=torch.nn.functional.mse_loss, inner=1),
     r"adapt: inner must be an InnerLoop"),
    (lambda: mean_task_grads(maml(apply).task_grad, PARAMS, tasks(), strategy="fast"),
     r"mean_task_grads: strategy must be one of \['auto', 'loop', 'threads', 'vmap'\]"),
    (lambda: evaluate(maml(apply), PARAMS, lambda k, n: tasks(n), key=random.key(0),
                      episodes=0), r"evaluate: episodes must be an int >= 1, got 0"),
    (lambda: meta_step(maml(apply), "adam", PARAMS, {}, tasks()),
     r"meta_step: optimizer must be a funcgraph.train Optimizer"),
])
def test_construction_errors_name_function_argument_form_and_value(
        call: Callable[[], Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        call()
