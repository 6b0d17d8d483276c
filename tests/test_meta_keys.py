"""Task keys in meta-learning: every task and inner step gets its own key, reproducibly, and
key-free models and plain functions behave exactly as before keys existed."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from funcgraph import bind, nn, random
from funcgraph.errors import ConfigError, KeyMissingError, ShapeError
from funcgraph.meta import (
    STRATEGIES,
    MetaLearner,
    Task,
    evaluate,
    maml,
    mean_task_grads,
    protonet,
    reptile,
    task_evals,
)
from funcgraph.meta.learner import query_key, support_keys
from funcgraph.model import BoundApply, Model
from funcgraph.models import conv4
from funcgraph.params import Params

DT = torch.float64
WAYS, SHOTS, QUERIES, TASKS, FEATURES, HIDDEN = 3, 2, 2, 3, 5, 8


def random_tasks(seed: int, tasks: int, shape: tuple[int, ...]) -> Task:
    """Random inputs of ``shape`` with balanced labels: ``N*K`` support, ``N*Q`` query rows."""
    k = random.split(random.key(seed), 2)
    sx = random.normal(k[0], (tasks, WAYS * SHOTS, *shape), dtype=DT)
    qx = random.normal(k[1], (tasks, WAYS * QUERIES, *shape), dtype=DT)
    sy = torch.arange(WAYS).repeat_interleave(SHOTS).expand(tasks, -1).contiguous()
    qy = torch.arange(WAYS).repeat_interleave(QUERIES).expand(tasks, -1).contiguous()
    return Task(sx, sy, qx, qy)


def vector_tasks(seed: int = 0, tasks: int = TASKS) -> Task:
    return random_tasks(seed, tasks, (FEATURES,))


def image_tasks(seed: int = 0, tasks: int = TASKS) -> Task:
    return random_tasks(seed, tasks, (1, 8, 8))


def task_keys(seed: int, tasks: int = TASKS) -> Tensor:
    return random.split(random.key(seed), tasks)


def dropout_mlp(out: int = WAYS) -> Model:
    return nn.serial(nn.linear(FEATURES, HIDDEN, dtype=DT), nn.relu(), nn.dropout(0.3),
                     nn.linear(HIDDEN, out, dtype=DT))


def bound(model: Model) -> tuple[BoundApply, Params]:
    """``(bind(model, state, train=True), params)``."""
    params, state = model.init(random.key(1))
    return bind(model, state, train=True), params


def assert_grads_close(got: Params, want: Params, what: str, tol: float = 1e-12) -> None:
    assert set(got) == set(want), f"{what}: names differ: {sorted(got)} vs {sorted(want)}"
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=tol, atol=tol,
                                   msg=lambda m, n=n: f"{what}: {n}: {m}")


def assert_grads_equal(got: Params, want: Params, what: str) -> None:
    assert set(got) == set(want), f"{what}: names differ: {sorted(got)} vs {sorted(want)}"
    for n in want:
        assert torch.equal(got[n], want[n]), (
            f"{what}: {n} differs by {(got[n] - want[n]).abs().max().item():.3g}")


def max_difference(a: Params, b: Params) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in a)


# --- the task record ---------------------------------------------------------------------


def test_task_methods_carry_the_key() -> None:
    tasks = vector_tasks()
    keys = task_keys(3)
    keyed = tasks.with_keys(keys)
    assert keyed.key is not None and torch.equal(keyed.key, keys), "with_keys stores the keys"
    assert tasks.key is None, "with_keys returns a copy; the original keeps no key"
    picked = keyed.pick(1)
    assert picked.key is not None and torch.equal(picked.key, keys[1]), "pick takes task 1's key"
    sliced = keyed.pick(slice(1, 3))
    assert sliced.key is not None and torch.equal(sliced.key, keys[1:3]), "a slice slices keys"
    moved = keyed.to("cpu", torch.float32)
    assert moved.support_x.dtype == torch.float32, "to casts the inputs"
    assert moved.key is not None and moved.key.dtype == torch.int64, "to never casts keys"
    assert torch.equal(moved.key, keys), "to keeps the key values"
    assert Task.of(keyed).key is keyed.key, "Task.of keeps a key"
    assert tasks.pick(0).key is None and tasks.to(dtype=torch.float32).key is None, (
        "pick and to leave a missing key missing")


@pytest.mark.parametrize("bad", [random.split(random.key(0), TASKS + 1),
                                 random.key(0), torch.zeros(TASKS, 2)],
                         ids=["wrong-count", "one-key", "float"])
def test_with_keys_checks_shape_and_dtype(bad: Tensor) -> None:
    with pytest.raises(ShapeError, match="one per task"):
        vector_tasks().with_keys(bad)


def test_vmap_maps_tasks_with_and_without_keys() -> None:
    tasks = vector_tasks()
    keys = task_keys(4)

    def first_word(x: Tensor, task: Task) -> Tensor:
        return task.support_x.sum() * x + (0 if task.key is None else task.key[0])

    x = torch.tensor(1.0, dtype=DT)
    plain = torch.func.vmap(first_word, in_dims=(None, 0))(x, tasks)
    assert torch.equal(plain, tasks.support_x.sum((1, 2))), "a key-free batch maps its data"
    keyed = tasks.with_keys(keys)
    got = torch.func.vmap(first_word, in_dims=(None, 0))(x, keyed)
    assert torch.equal(got, tasks.support_x.sum((1, 2)) + keys[:, 0]), "each task sees its key"


def test_key_schedule_never_repeats_a_key() -> None:
    k = random.key(7)
    steps = support_keys(k, 6)
    words = {tuple(s.tolist()) for s in steps if s is not None}
    query = query_key(k)
    assert query is not None and len(words) == 6, "six distinct support-step keys"
    assert tuple(query.tolist()) not in words, "the query key is none of the support keys"
    assert support_keys(None, 3) == [None] * 3 and query_key(None) is None, (
        "a key-free task gets no keys")


def test_bind_uses_a_call_key_over_the_bound_one() -> None:
    model = dropout_mlp()
    params, state = model.init(random.key(1))
    x = vector_tasks().support_x[0]
    k0, k1 = random.key(10), random.key(11)
    f = bind(model, state, train=True, key=k0)
    want_bound, _ = model.apply(params, state, x, key=k0, train=True)
    want_call, _ = model.apply(params, state, x, key=k1, train=True)
    assert torch.equal(f(params, x), want_bound), "without a call key, the bound key is used"
    assert torch.equal(f(params, x, key=k1), want_call), "a call key replaces the bound key"


# --- MAML with dropout -------------------------------------------------------------------


def maml_grads(learner: MetaLearner, params: Params, tasks: Task, strategy: str) -> Params:
    grads, _, _ = mean_task_grads(learner.task_grad, params, tasks, strategy=strategy, workers=2)
    return grads


def test_dropout_needs_keys_in_meta_training() -> None:
    apply, params = bound(dropout_mlp())
    learner = maml(apply, inner_steps=1)
    with pytest.raises(KeyMissingError):
        maml_grads(learner, params, vector_tasks(), "loop")


@pytest.mark.parametrize("learn_lr", [False, True], ids=["maml", "metasgd"])
def test_strategies_agree_with_dropout_and_keys(learn_lr: bool) -> None:
    apply, params = bound(dropout_mlp())
    learner = maml(apply, inner_steps=2, inner_lr=0.3, learn_lr=learn_lr)
    meta = learner.init(params)
    tasks = vector_tasks().with_keys(task_keys(5))
    want = maml_grads(learner, meta, tasks, "loop")
    for strategy in STRATEGIES:
        assert_grads_close(maml_grads(learner, meta, tasks, strategy), want,
                           f"{strategy} vs loop")


def test_keys_decide_the_dropout_masks() -> None:
    apply, params = bound(dropout_mlp())
    learner = maml(apply, inner_steps=2, inner_lr=0.3)
    tasks = vector_tasks()
    first = maml_grads(learner, params, tasks.with_keys(task_keys(5)), "vmap")
    again = maml_grads(learner, params, tasks.with_keys(task_keys(5)), "vmap")
    other = maml_grads(learner, params, tasks.with_keys(task_keys(6)), "vmap")
    assert_grads_equal(again, first, "the same keys twice")
    assert max_difference(other, first) > 1e-6, "other keys draw other dropout masks"


@pytest.mark.parametrize("learn_lr", [False, True], ids=["maml", "metasgd"])
@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_remat_equals_unrolled_with_dropout(learn_lr: bool, strategy: str) -> None:
    apply, params = bound(dropout_mlp())
    kw = {"inner_steps": 2, "inner_lr": 0.3, "learn_lr": learn_lr}
    unrolled, remat = maml(apply, **kw), maml(apply, remat=True, **kw)
    meta = unrolled.init(params)
    tasks = vector_tasks().with_keys(task_keys(8))
    assert_grads_close(maml_grads(remat, meta, tasks, strategy),
                       maml_grads(unrolled, meta, tasks, strategy), "remat vs unrolled", 1e-10)


@pytest.mark.parametrize("mode", ["batch", "row"])
def test_stochastic_depth_under_vmap_matches_the_loop(mode: str) -> None:
    block = nn.stochastic_depth(nn.serial(nn.linear(HIDDEN, HIDDEN, dtype=DT), nn.relu()), 0.5,
                                mode=mode)
    model = nn.serial(nn.linear(FEATURES, HIDDEN, dtype=DT), block,
                      nn.linear(HIDDEN, WAYS, dtype=DT))
    apply, params = bound(model)
    learner = maml(apply, inner_steps=2, inner_lr=0.3)
    tasks = vector_tasks(tasks=4).with_keys(task_keys(9, 4))
    assert_grads_close(maml_grads(learner, params, tasks, "vmap"),
                       maml_grads(learner, params, tasks, "loop"), f"{mode}: vmap vs loop")


# --- key-free models and plain functions -------------------------------------------------


@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_key_free_model_ignores_keys_bit_for_bit(strategy: str, remat: bool) -> None:
    apply, params = bound(conv4(WAYS, hidden=4, image_size=8, dtype=DT))
    learner = maml(apply, inner_steps=2, inner_lr=0.3, remat=remat)
    tasks = image_tasks()
    assert_grads_equal(maml_grads(learner, params, tasks.with_keys(task_keys(2)), strategy),
                       maml_grads(learner, params, tasks, strategy), "with keys vs without")


def test_plain_function_runs_key_free_and_refuses_keys() -> None:
    model = conv4(WAYS, hidden=4, image_size=8, dtype=DT)
    params, state = model.init(random.key(1))
    bound_apply = bind(model, state, train=True)

    def plain(p: Params, x: Tensor) -> Tensor:
        return bound_apply(p, x)

    learner, reference = maml(plain, inner_steps=1), maml(bound_apply, inner_steps=1)
    assert not learner.uses_keys and reference.uses_keys, "uses_keys follows the signature"
    tasks = image_tasks()
    assert_grads_equal(maml_grads(learner, params, tasks, "loop"),
                       maml_grads(reference, params, tasks, "loop"), "plain vs bound")
    for build in (lambda f: maml(f), lambda f: reptile(f), lambda f: protonet(f, ways=WAYS)):
        keyed_learner = build(plain)
        with pytest.raises(ConfigError, match="takes no key= argument"):
            keyed_learner.task_eval(params, tasks.with_keys(task_keys(2)).pick(0))


# --- Reptile and prototypical networks ---------------------------------------------------


@pytest.mark.parametrize("algo", ["reptile", "protonet"])
def test_reptile_and_protonet_are_deterministic_given_keys(algo: str) -> None:
    apply, params = bound(dropout_mlp(out=4))
    learner = (reptile(apply, inner_steps=2, inner_lr=0.1) if algo == "reptile"
               else protonet(apply, ways=WAYS))
    tasks = vector_tasks()
    first = maml_grads(learner, params, tasks.with_keys(task_keys(5)), "loop")
    assert_grads_equal(maml_grads(learner, params, tasks.with_keys(task_keys(5)), "loop"),
                       first, f"{algo}: the same keys twice")
    # F.one_hot (the prototypes) has no vmap rule, so protonet runs on loops and threads only.
    for strategy in ("threads", "vmap") if algo == "reptile" else ("threads",):
        assert_grads_close(maml_grads(learner, params, tasks.with_keys(task_keys(5)), strategy),
                           first, f"{algo}: {strategy} vs loop")
    assert max_difference(maml_grads(learner, params, tasks.with_keys(task_keys(6)), "loop"),
                          first) > 1e-6, f"{algo}: other keys draw other masks"
    losses, _ = task_evals(learner.task_eval, params, tasks.with_keys(task_keys(5)))
    again, _ = task_evals(learner.task_eval, params, tasks.with_keys(task_keys(5)))
    assert torch.equal(losses, again), f"{algo}: evaluation is deterministic given keys"


# --- evaluation --------------------------------------------------------------------------


def sampler(key: Tensor, n: int) -> Task:
    return image_tasks(int(random.bits(key, ()).item()) % 1000, n)


def test_evaluate_of_a_key_free_model_is_unchanged_by_keys() -> None:
    apply, params = bound(conv4(WAYS, hidden=4, image_size=8, dtype=DT))
    learner = maml(apply, inner_steps=1, inner_lr=0.3)
    assert learner.uses_keys, "a bound model takes keys, so evaluate attaches them"
    key, episodes, batch = random.key(3), 7, 3
    got = evaluate(learner, params, sampler, key=key, episodes=episodes, batch=batch)
    # The same tasks without keys, scored directly.
    losses, metrics = [], []
    for i, n in enumerate((3, 3, 1)):
        loss, metric = task_evals(learner.task_eval, params, sampler(random.fold_in(key, i), n))
        losses.append(loss)
        metrics.append(metric)
    metric = torch.cat(metrics)
    assert got.mean == metric.mean().item(), "the mean metric is that of key-free tasks"
    assert got.loss == torch.cat(losses).mean().item(), "the mean loss is that of key-free tasks"
    assert got.episodes == episodes, "every episode is scored"


def test_evaluate_gives_a_dropout_model_keys() -> None:
    apply, params = bound(dropout_mlp())
    learner = maml(apply, inner_steps=1, inner_lr=0.3)

    def sample(key: Tensor, n: int) -> Task:
        return vector_tasks(int(random.bits(key, ()).item()) % 1000, n)

    a = evaluate(learner, params, sample, key=random.key(3), episodes=5, batch=2)
    b = evaluate(learner, params, sample, key=random.key(3), episodes=5, batch=2,
                 strategy="vmap")
    assert a.loss == pytest.approx(b.loss, rel=1e-12), "loop and vmap see the same keys"
    plain = maml(lambda p, x: apply(p, x), inner_steps=1)
    with pytest.raises(KeyMissingError):
        evaluate(plain, params, sample, key=random.key(3), episodes=2, batch=2)
