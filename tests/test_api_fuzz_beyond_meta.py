"""The hypothesis fuzzer beyond meta-learning: optimisers and schedules, data helpers, the
short path, testing helpers and export, given hostile argument values. Each call succeeds or
raises a funcgraph error (a testing helper may also fail its check with an AssertionError);
no raw TypeError, ValueError or RuntimeError from Python or torch reaches the caller."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_meta_api_fuzz import HOSTILE, PARAMS, apply, expect_funcgraph_error_only

from funcgraph import nn as fnn
from funcgraph import random
from funcgraph.data import ClassDataset, TaskSpec, sample_tasks, sinusoid_tasks
from funcgraph.errors import FuncgraphError
from funcgraph.export import export
from funcgraph.meta import MetaTrainer, maml, tasks
from funcgraph.testing import (
    assert_grad_matches_finite_differences,
    assert_pure,
    assert_vmap_matches_loop,
)
from funcgraph.train import adam, cosine_lr, sgd

SMALL = settings(max_examples=40, deadline=None)
DATASET = ClassDataset(torch.zeros(4, 3, 1, 4, 4), [f"c{i}" for i in range(4)], "fuzz")
MODEL = fnn.serial(fnn.linear(3, 2))


def funcgraph_or_assertion_error(call: Callable[[], Any]) -> None:
    try:
        call()
    except (FuncgraphError, AssertionError):
        pass


@SMALL
@given(lr=HOSTILE, betas=HOSTILE, eps=HOSTILE, weight_decay=HOSTILE, decoupled=HOSTILE,
       momentum=HOSTILE, nesterov=HOSTILE)
def test_optimisers_refuse_hostile_settings(lr: Any, betas: Any, eps: Any, weight_decay: Any,
                                            decoupled: Any, momentum: Any, nesterov: Any
                                            ) -> None:
    expect_funcgraph_error_only(lambda: adam(lr, betas=betas, eps=eps,
                                             weight_decay=weight_decay, decoupled=decoupled))
    expect_funcgraph_error_only(lambda: sgd(lr, momentum=momentum, weight_decay=weight_decay,
                                            nesterov=nesterov))


@SMALL
@given(params=st.one_of(HOSTILE, st.just(PARAMS)), grads=st.one_of(HOSTILE, st.just(PARAMS)),
       lr=HOSTILE, which=st.sampled_from(["adam", "sgd"]))
def test_an_optimiser_update_refuses_hostile_params_grads_and_rates(
        params: Any, grads: Any, lr: Any, which: str) -> None:
    opt = adam(1e-3) if which == "adam" else sgd(0.1, momentum=0.9)
    state = opt.init(PARAMS)
    expect_funcgraph_error_only(lambda: opt.update(params, grads, state, lr=lr))
    expect_funcgraph_error_only(lambda: opt.init(params))


@SMALL
@given(base=HOSTILE, step=HOSTILE, total=HOSTILE, floor=HOSTILE)
def test_the_cosine_schedule_refuses_hostile_arguments(base: Any, step: Any, total: Any,
                                                       floor: Any) -> None:
    expect_funcgraph_error_only(lambda: cosine_lr(base, step, total, min_lr=floor))


@SMALL
@given(text=HOSTILE, key=st.one_of(HOSTILE, st.just(random.key(0))), num=HOSTILE,
       shots=HOSTILE, queries=HOSTILE)
def test_data_helpers_refuse_hostile_arguments(text: Any, key: Any, num: Any, shots: Any,
                                               queries: Any) -> None:
    expect_funcgraph_error_only(lambda: TaskSpec.parse(text))
    expect_funcgraph_error_only(lambda: sinusoid_tasks(key, num, shots, queries))
    expect_funcgraph_error_only(lambda: sample_tasks(key, DATASET, TaskSpec(2, 1, 1), num))
    expect_funcgraph_error_only(lambda: ClassDataset(text, ["a"], "fuzz"))


@SMALL
@given(dataset=st.one_of(HOSTILE, st.just("sinusoid"), st.just(DATASET)), spec=HOSTILE,
       batch=HOSTILE, split=HOSTILE, seed=HOSTILE, count=HOSTILE)
def test_the_task_stream_refuses_hostile_arguments(dataset: Any, spec: Any, batch: Any,
                                                   split: Any, seed: Any, count: Any) -> None:
    def draw() -> None:
        stream = tasks(dataset, spec, batch=batch, split=split, seed=seed, count=count)
        next(iter(stream), None)

    expect_funcgraph_error_only(draw)


@SMALL
@given(learner=st.one_of(HOSTILE, st.just("maml")), optimizer=HOSTILE, strategy=HOSTILE,
       precision=HOSTILE, key=HOSTILE)
def test_the_trainer_refuses_hostile_arguments(learner: Any, optimizer: Any, strategy: Any,
                                               precision: Any, key: Any) -> None:
    def build() -> None:
        chosen = maml(MODEL) if learner == "maml" else learner
        trainer = MetaTrainer(chosen, optimizer, strategy=strategy, precision=precision)
        trainer.init(key)

    expect_funcgraph_error_only(build)


def loss(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return apply(p, x).square().sum()


@SMALL
@given(fn=st.one_of(HOSTILE, st.just(loss)),
       params=st.one_of(HOSTILE.filter(lambda v: not isinstance(v, torch.Tensor)),
                        st.just(PARAMS)),
       in_dims=HOSTILE, dtype=HOSTILE, step=HOSTILE, rtol=HOSTILE, atol=HOSTILE,
       max_entries=HOSTILE)
def test_testing_helpers_refuse_hostile_arguments(fn: Any, params: Any, in_dims: Any,
                                                  dtype: Any, step: Any, rtol: Any, atol: Any,
                                                  max_entries: Any) -> None:
    """The helpers' own arguments; what the user's function raises is the user's to see."""
    x, xs = torch.ones(2, 3), torch.ones(4, 2, 3)
    w = {"w": PARAMS["w"]}
    funcgraph_or_assertion_error(lambda: assert_pure(fn, w, x))
    funcgraph_or_assertion_error(lambda: assert_vmap_matches_loop(fn, w, xs, in_dims=in_dims,
                                                                  rtol=rtol, atol=atol))
    funcgraph_or_assertion_error(lambda: assert_grad_matches_finite_differences(
        fn, params if params is not PARAMS else w, x, dtype=dtype, step=step, rtol=rtol,
        atol=atol, max_entries=max_entries))


@SMALL
@given(model=st.one_of(HOSTILE, st.just(MODEL)), params=HOSTILE,
       inputs=st.one_of(HOSTILE, st.just(torch.zeros(2, 3))), dynamic=HOSTILE,
       path=HOSTILE)
def test_export_refuses_hostile_arguments(model: Any, params: Any, inputs: Any, dynamic: Any,
                                          path: Any) -> None:
    expect_funcgraph_error_only(lambda: export(model, params, {}, inputs, dynamic_batch=dynamic,
                                               path=path))
