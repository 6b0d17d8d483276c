"""MAML++: each piece against a hand-unrolled reference, all pieces off against MAML bit for
bit, the schedules of the meta-step, and the strategies and keys as for MAML."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_meta_keys import (  # tests/ is on sys.path under pytest
    DT,
    assert_grads_close,
    assert_grads_equal,
    bound,
    dropout_mlp,
    image_tasks,
    max_difference,
    task_keys,
    vector_tasks,
)
from torch import Tensor

from funcgraph import bind, random
from funcgraph.errors import ConfigError
from funcgraph.meta import (
    STEP_BN_PREFIX,
    STEP_LR_PREFIX,
    STRATEGIES,
    BoundApply,
    MetaLearner,
    Task,
    maml,
    mamlpp,
    mamlpp_loss,
    mean_task_grads,
    model_params,
    msl_weights,
    objective,
    step_params,
    step_running_stats,
    with_step_running_stats,
)
from funcgraph.models import conv4
from funcgraph.params import Params

WAYS = 3
OFF: dict[str, Any] = {"lslr": False, "multi_step_loss": False, "per_step_bn": False}
"""Every MAML++ piece switched off (derivative-order annealing is off by default)."""


def tiny_conv4() -> tuple[BoundApply, Params]:
    model = conv4(WAYS, hidden=18, image_size=8, dtype=DT)  # 18: the first block fuses
    params, state = model.init(random.key(1))
    return bind(model, state), params


def grads_of(learner: MetaLearner, meta: Params, tasks: Task, strategy: str = "loop"
             ) -> tuple[Params, Tensor, Tensor]:
    return mean_task_grads(learner.task_grad, meta, tasks, strategy=strategy, workers=2)


def perturbed(meta: Params, seed: int = 5) -> Params:
    """``meta`` with each learned rate and batch-norm row scaled by its own ``1 + U(0, 0.2)``,
    so that a mix-up of steps or rows would change the gradient."""
    return {n: p * (1 + 0.2 * random.uniform(random.fold_in(random.key(seed), i), p.shape,
                                             dtype=DT))
            if n.startswith((STEP_LR_PREFIX, STEP_BN_PREFIX)) else p
            for i, (n, p) in enumerate(meta.items())}


def reference_grad(apply: BoundApply, meta: Params, tasks: Task, *, steps: int,
                   weights: tuple[float, ...], first_order: bool) -> dict[str, Tensor]:
    """Hand-unrolled MAML++: per-step rates and batch-norm rows, the weighted query loss after
    every step, ``torch.autograd.grad(create_graph=True)`` in a loop over tasks."""
    leaves = {n: p.detach().clone().requires_grad_() for n, p in meta.items()}
    start = {n: p for n, p in leaves.items() if not n.startswith((STEP_LR_PREFIX,
                                                                   STEP_BN_PREFIX))}
    rows = {n[len(STEP_BN_PREFIX):]: p for n, p in leaves.items() if n.startswith(STEP_BN_PREFIX)}
    total = torch.zeros((), dtype=DT)
    for t in range(tasks.num_tasks):
        fast = dict(start)
        for i in range(steps):
            norms = {n: r[i] for n, r in rows.items()}
            loss = F.cross_entropy(apply({**fast, **norms}, tasks.support_x[t]),
                                   tasks.support_y[t])
            grads = torch.autograd.grad(loss, list(fast.values()), create_graph=not first_order)
            fast = {n: p - leaves[STEP_LR_PREFIX + n][i] * g
                    for (n, p), g in zip(fast.items(), grads, strict=True)}
            query = F.cross_entropy(apply({**fast, **norms}, tasks.query_x[t]), tasks.query_y[t])
            total = total + weights[i] * query
    grads = torch.autograd.grad(total / tasks.num_tasks, list(leaves.values()))
    return dict(zip(leaves, grads, strict=True))


# --- the multi-step loss schedule ---------------------------------------------------------


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_msl_weights_sum_to_one_and_anneal_towards_the_last_step(steps: int) -> None:
    anneal = 10
    schedule = [msl_weights(steps, t, anneal) for t in range(anneal + 3)]
    assert schedule[0] == (1 / steps,) * steps, f"meta-step 0 is uniform: {schedule[0]}"
    for t, w in enumerate(schedule):
        assert len(w) == steps, f"one weight per inner step at meta-step {t}: {w}"
        assert math.isclose(sum(w), 1.0, abs_tol=1e-12), f"weights sum to 1 at {t}: {w}"
    for t in range(1, anneal):
        before, now = schedule[t - 1], schedule[t]
        assert all(a >= b for a, b in zip(before[:-1], now[:-1], strict=True)), (
            f"earlier steps' weights never rise: {before} -> {now} at {t}")
        assert now[-1] >= before[-1], f"the last step's weight never falls: {before} -> {now}"
        assert all(w >= 0.03 / steps - 1e-15 for w in now[:-1]), (
            f"earlier weights stay at or above the floor 0.03/steps while annealing: {now}")
    for t in (anneal, anneal + 2):
        assert schedule[t] == (0.0,) * (steps - 1) + (1.0,), (
            f"after {anneal} meta-steps only the last step counts: {schedule[t]}")


def test_msl_weights_follow_the_papers_linear_decay() -> None:
    got = msl_weights(5, 4, 10)
    # 1/5 - 4/(5*10) = 0.12 for each earlier step; the last gets 1/5 + 4*4/(5*10) = 0.52.
    want = (0.12,) * 4 + (0.52,)
    assert all(math.isclose(g, w, abs_tol=1e-12) for g, w in zip(got, want, strict=True)), (
        f"msl_weights(5, 4, 10) = {got}, the paper's schedule gives {want}")
    # At 99 of 100 meta-steps the decay (0.198) would pass 1/5 - 0.03/5: the floor holds.
    floor = msl_weights(5, 99, 100)
    assert floor[:-1] == (0.03 / 5,) * 4, f"late in annealing the floor holds: {floor}"


# --- against MAML and the reference -------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("steps", [1, 3])
def test_every_piece_off_is_maml_bit_for_bit(strategy: str, steps: int) -> None:
    apply, params = tiny_conv4()
    tasks = image_tasks(1)
    plain = maml(apply, inner_steps=steps, inner_lr=0.3)
    plus = mamlpp(apply, inner_steps=steps, inner_lr=0.3, **OFF)
    meta = plus.init(params)
    assert list(meta) == list(params), "with every piece off the meta-params are the model's"
    want = grads_of(plain, params, tasks, strategy)
    got = grads_of(plus.at_step(7), meta, tasks, strategy)
    assert_grads_equal(got[0], want[0], f"mamlpp off vs maml ({strategy})")
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), (
        f"loss and accuracy equal MAML's: {got[1:]} vs {want[1:]}")
    task = tasks.pick(0)
    assert all(torch.equal(a, b) for a, b in zip(plus.task_eval(meta, task),
                                                  plain.task_eval(params, task), strict=True)), (
        "evaluation equals MAML's")


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_all_pieces_equal_the_unrolled_reference(strategy: str) -> None:
    apply, params = tiny_conv4()
    tasks = image_tasks(2)
    learner = mamlpp(apply, inner_steps=3, inner_lr=0.2, msl_anneal_steps=10)
    meta = perturbed(learner.init(params))
    got, _, _ = grads_of(learner.at_step(4), meta, tasks, strategy)
    want = reference_grad(apply, meta, tasks, steps=3, weights=msl_weights(3, 4, 10),
                          first_order=False)
    assert_grads_close(got, want, f"mamlpp {strategy}", 1e-9)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategies_agree_with_every_piece_on(strategy: str) -> None:
    apply, params = tiny_conv4()
    tasks = image_tasks(3)
    learner = mamlpp(apply, inner_steps=2, inner_lr=0.2, msl_anneal_steps=10).at_step(3)
    meta = perturbed(learner.init(params))
    want, want_loss, want_acc = grads_of(learner, meta, tasks, "loop")
    got, loss, acc = grads_of(learner, meta, tasks, strategy)
    assert_grads_close(got, want, f"{strategy} vs loop", 1e-10)
    torch.testing.assert_close(loss, want_loss, msg=f"{strategy} reports the loop's loss")
    torch.testing.assert_close(acc, want_acc, msg=f"{strategy} reports the loop's accuracy")


# --- the pieces ---------------------------------------------------------------------------


def test_lslr_learns_one_rate_per_tensor_and_step() -> None:
    apply, params = tiny_conv4()
    learner = mamlpp(apply, inner_steps=3, inner_lr=0.2, multi_step_loss=False,
                     per_step_bn=False)
    meta = learner.init(params)
    rates = {n[len(STEP_LR_PREFIX):]: p for n, p in meta.items() if n.startswith(STEP_LR_PREFIX)}
    assert list(rates) == list(params), "one rate vector per parameter tensor"
    assert all(torch.equal(r, torch.full((3,), 0.2, dtype=DT)) for r in rates.values()), (
        "each rate vector holds inner_lr for each of the 3 steps")
    grads, _, _ = grads_of(learner, perturbed(meta), image_tasks(4))
    # A conv bias before batch norm cancels: its gradient, and its rates', is exactly zero.
    live = [n for n in rates if not n.endswith("conv.bias")]
    for n in live:
        g = grads[STEP_LR_PREFIX + n]
        assert g.shape == (3,) and bool((g != 0).all()), f"every step's rate of {n} learns: {g}"
        assert len(set(g.tolist())) == 3, f"the steps' rates of {n} get their own gradients: {g}"


def test_per_step_bn_replaces_the_norm_params_by_per_step_rows() -> None:
    apply, params = tiny_conv4()
    learner = mamlpp(apply, inner_steps=3, lslr=False, multi_step_loss=False)
    meta = learner.init(params)
    norms = [n for n in params if n.endswith(("norm.weight", "norm.bias"))]
    assert len(norms) == 8, f"conv4 has four norms of weight and bias: {norms}"
    assert sorted(n[len(STEP_BN_PREFIX):] for n in meta if n.startswith(STEP_BN_PREFIX)) == (
        sorted(norms)), "each norm param gets per-step rows"
    assert not set(norms) & set(meta), "the single copies are gone from the meta-params"
    for n in norms:
        rows = meta[STEP_BN_PREFIX + n]
        assert rows.shape == (3, *params[n].shape), f"{n}: one row per step, got {rows.shape}"
        assert all(torch.equal(r, params[n]) for r in rows), f"{n}: rows start as the param"
    assert set(model_params(meta)) == set(params) - set(norms), (
        "model_params drops the per-step rows")
    edited = perturbed(meta)
    at = step_params(edited, 1)
    assert list(at) == list(model_params(edited)) + norms, "step_params is the complete model"
    assert all(torch.equal(at[n], edited[STEP_BN_PREFIX + n][1]) for n in norms), (
        "step_params takes row 1 at step 1")
    assert all(torch.equal(step_params(edited, 9)[n], edited[STEP_BN_PREFIX + n][2])
               for n in norms), "steps past the last reuse the last row"
    grads, _, _ = grads_of(learner, edited, image_tasks(5))
    for n in norms:
        g = grads[STEP_BN_PREFIX + n]
        assert all(bool(row.abs().sum() > 0) for row in g), f"{n}: every step's row learns"


def test_per_step_bn_is_automatic_and_checked() -> None:
    apply, params = bound(dropout_mlp())
    meta = mamlpp(apply, inner_steps=2).init(params)
    assert not any(n.startswith(STEP_BN_PREFIX) for n in meta), (
        "a model without norm params gets no per-step rows by default")
    with pytest.raises(ConfigError, match=r"per_step_bn=True but no param name ends in"):
        mamlpp(apply, inner_steps=2, per_step_bn=True).init(params)
    custom = mamlpp(apply, inner_steps=2, bn_suffixes=["3.bias"]).init(params)
    assert [n for n in custom if n.startswith(STEP_BN_PREFIX)] == [STEP_BN_PREFIX + "3.bias"], (
        f"bn_suffixes chooses the per-step params: {list(custom)}")


def test_derivative_order_switches_at_first_order_until() -> None:
    apply, params = tiny_conv4()
    tasks = image_tasks(6)
    learner = mamlpp(apply, inner_steps=2, inner_lr=0.3, first_order_until=2, **OFF)
    first = grads_of(maml(apply, inner_steps=2, inner_lr=0.3, first_order=True), params, tasks)
    second = grads_of(maml(apply, inner_steps=2, inner_lr=0.3), params, tasks)
    for step, want, order in ((0, first, "first"), (1, first, "first"), (2, second, "second"),
                              (50, second, "second")):
        got = grads_of(learner.at_step(step), params, tasks)
        assert_grads_equal(got[0], want[0], f"meta-step {step} is {order} order")
    assert max_difference(first[0], second[0]) > 1e-6, "the orders differ for this model"


def test_evaluation_past_the_trained_steps_reuses_the_last_rate_and_row() -> None:
    apply, params = tiny_conv4()
    short = mamlpp(apply, inner_steps=2, inner_lr=0.2, eval_steps=4)
    meta = perturbed(short.init(params))
    # The same learner trained for 4 steps, with steps 2 and 3 set to step 1's rate and row.
    long = mamlpp(apply, inner_steps=4, inner_lr=0.2, eval_steps=4)
    extended = {n: torch.cat([p, p[-1:], p[-1:]])
                if n.startswith((STEP_LR_PREFIX, STEP_BN_PREFIX)) else p for n, p in meta.items()}
    task = image_tasks(7).pick(0)
    got, want = short.task_eval(meta, task), long.task_eval(extended, task)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), (
        f"4 eval steps after 2 trained reuse step 1's rate and rows: {got} vs {want}")


# --- keys and the meta-step ---------------------------------------------------------------


def test_strategies_agree_with_dropout_and_keys() -> None:
    apply, params = bound(dropout_mlp())
    learner = mamlpp(apply, inner_steps=2, inner_lr=0.3, msl_anneal_steps=4).at_step(1)
    meta = learner.init(params)
    tasks = vector_tasks().with_keys(task_keys(5))
    want = grads_of(learner, meta, tasks, "loop")[0]
    for strategy in STRATEGIES:
        assert_grads_close(grads_of(learner, meta, tasks, strategy)[0], want,
                           f"{strategy} vs loop")
    again = grads_of(learner, meta, vector_tasks().with_keys(task_keys(5)), "vmap")[0]
    other = grads_of(learner, meta, vector_tasks().with_keys(task_keys(6)), "vmap")[0]
    assert_grads_close(again, want, "the same keys give the same gradient")
    assert max_difference(other, want) > 1e-6, "other keys draw other dropout masks"


def test_at_step_is_the_identity_for_step_free_learners_and_checks_the_step() -> None:
    apply, _ = tiny_conv4()
    plain = maml(apply)
    assert plain.at_step(10) is plain, "a learner without a schedule is its own every step"
    plus = mamlpp(apply, inner_steps=2)
    assert plus.at_step(3).schedule is plus.schedule, "a scheduled learner keeps its schedule"
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match=r"step must be an int >= 0"):
            plus.at_step(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"inner_steps": 0}, r"inner_steps must be an int >= 1, got 0"),
    ({"eval_steps": -1}, r"eval_steps must be an int >= 0, got -1"),
    ({"msl_anneal_steps": 0}, r"msl_anneal_steps must be an int >= 1, got 0"),
    ({"first_order_until": -2}, r"first_order_until must be an int >= 0, got -2"),
    ({"lslr": "yes"}, r"mamlpp: lslr must be True or False, got 'yes'"),
    ({"per_step_bn": 1}, r"per_step_bn must be None .*, got 1"),
    ({"bn_suffixes": "norm.weight"}, r"bn_suffixes must be a sequence"),
    ({"bn_suffixes": []}, r"bn_suffixes must be a non-empty sequence"),
    ({"kind": "ranking"}, r"kind must be one of"),
])
def test_bad_arguments_are_config_errors_naming_them(kwargs: dict[str, Any],
                                                     message: str) -> None:
    apply, _ = tiny_conv4()
    with pytest.raises(ConfigError, match=message):
        mamlpp(apply, **kwargs)


def test_multi_step_loss_weights_must_match_the_inner_steps() -> None:
    apply, params = tiny_conv4()
    for steps, weights in ((3, (0.5, 0.5)), (0, (1.0,))):
        with pytest.raises(ConfigError, match=r"weights must have one entry per inner step"):
            mamlpp_loss(apply, params, image_tasks(8).pick(0),
                        objective=objective("classification"), steps=steps, inner_lr=0.1,
                        first_order=True, weights=weights)


# --- per-step running statistics (BNRS) ----------------------------------------------------

def stats_twin() -> Any:
    """``tiny_conv4``'s model with running statistics: the same params, plus state."""
    return conv4(WAYS, hidden=18, image_size=8, dtype=DT, running_stats=True)


def test_step_running_stats_follow_batch_norms_update_at_each_step() -> None:
    """Row k after one task is batch norm's momentum-0.1 update from (0, 1) by the support
    set's statistics under the params after k inner updates; checked on the first block
    (convolution then batch norm) against F.conv2d and a hand-taken inner step."""
    apply, params = tiny_conv4()
    learner = mamlpp(apply, inner_steps=1, inner_lr=0.3, eval_steps=1)
    meta = perturbed(learner.init(params))
    task = image_tasks(3).pick(0)
    rows = step_running_stats(stats_twin(), meta, Task(*(t[None] for t in task)), steps=1,
                              inner_lr=0.3, objective=objective("classification"))
    assert len(rows) == 2

    fast = {n: p.detach().requires_grad_() for n, p in step_params(meta, 0).items()}
    loss = F.cross_entropy(apply(fast, task.support_x), task.support_y)
    names = [n for n in fast if not n.endswith(("norm.weight", "norm.bias"))]
    grads = dict(zip(names, torch.autograd.grad(loss, [fast[n] for n in names]), strict=True))
    adapted = {n: (fast[n] - meta[STEP_LR_PREFIX + n][0] * grads[n]).detach() for n in names}
    for k, weights in enumerate((fast, adapted)):
        z = F.conv2d(task.support_x, weights["block1.conv.weight"],
                     weights["block1.conv.bias"], stride=2, padding=1)
        mean, var = z.mean((0, 2, 3)), z.var((0, 2, 3), unbiased=True)
        torch.testing.assert_close(rows[k]["block1.norm.running_mean"], 0.1 * mean,
                                   msg=f"row {k}: running mean")
        torch.testing.assert_close(rows[k]["block1.norm.running_var"], 0.9 + 0.1 * var,
                                   msg=f"row {k}: running variance")
    assert not torch.equal(rows[0]["block4.norm.running_mean"],
                           rows[1]["block4.norm.running_mean"]), "the steps' rows differ"


def test_running_stats_score_each_query_on_its_own() -> None:
    """With per-step running statistics a task's query loss is the mean of its queries'
    losses scored one at a time; with batch statistics (transductive) it is not."""
    apply, params = tiny_conv4()
    learner = mamlpp(apply, inner_steps=2, inner_lr=0.3, eval_steps=2)
    meta = perturbed(learner.init(params))
    twin = stats_twin()
    rows = step_running_stats(twin, meta, image_tasks(1, tasks=8), steps=2, inner_lr=0.3,
                              objective=objective("classification"))
    scored = with_step_running_stats(learner, twin, rows)
    task = image_tasks(9).pick(0)
    queries = task.query_x.shape[0]
    one_by_one = [Task(task.support_x, task.support_y, task.query_x[i:i + 1],
                       task.query_y[i:i + 1]) for i in range(queries)]

    def gap(lrn: MetaLearner) -> float:
        whole = lrn.task_eval(meta, task)[0]
        single = torch.stack([lrn.task_eval(meta, t)[0] for t in one_by_one]).mean()
        return float((whole - single).abs())

    assert gap(scored) < 1e-12, "running statistics: each query on its own"
    garbage = [{n: v * 7 + 3 for n, v in row.items()} for row in rows[:-1]] + [rows[-1]]
    with_garbage = with_step_running_stats(learner, twin, garbage)
    assert all(torch.equal(a, b) for a, b in zip(
        scored.task_eval(meta, task), with_garbage.task_eval(meta, task), strict=True)), (
        "the support passes use the support set's statistics, not the rows of their steps")
    assert gap(learner) > 1e-6, "batch statistics couple the queries (the test can fail)"
    assert scored.task_eval is not learner.task_eval and scored.settings == learner.settings, (
        "only the evaluation changes")


def test_running_stats_are_refused_where_they_do_not_apply() -> None:
    apply, params = tiny_conv4()
    twin = stats_twin()
    learner = mamlpp(apply, inner_steps=1, eval_steps=3)
    rows = step_running_stats(twin, learner.init(params), image_tasks(1, tasks=2), steps=1,
                              inner_lr=0.3, objective=objective("classification"))
    with pytest.raises(ConfigError, match="evaluates with 3 inner steps, so it needs 4 rows"):
        with_step_running_stats(learner, twin, rows)
    with pytest.raises(ConfigError, match="belong to MAML\\+\\+"):
        with_step_running_stats(maml(apply), twin, rows)
    with pytest.raises(ConfigError, match="keeps no running statistics"):
        step_running_stats(conv4(WAYS, hidden=18, image_size=8, dtype=DT), params,
                            image_tasks(1, tasks=2), steps=1, inner_lr=0.3,
                            objective=objective("classification"))
