"""Reptile, prototypical networks, evaluation CI and strategies against direct computations."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from test_meta_keys import image_tasks  # 3 ways, 2 shots, 2 queries; tests/ is on sys.path

from funcgraph import bind, random
from funcgraph.errors import ConfigError
from funcgraph.meta import (
    CPU_VMAP_MAX_EXAMPLES,
    DEFAULT_STRATEGY,
    InnerLoop,
    Task,
    adapt,
    confidence_interval,
    evaluate,
    maml,
    mean_task_grads,
    protonet,
    prototypes,
    reptile,
    resolve_strategy,
    squared_distances,
    task_evals,
)
from funcgraph.models import conv4, mlp
from funcgraph.train import adam, sgd

DT = torch.float64


def sine_tasks(seed: int, tasks: int, shots: int) -> Task:
    k = random.split(random.key(seed), 3)
    amp = random.uniform(k[0], (tasks, 1, 1), dtype=DT, low=0.1, high=5.0)
    x = random.uniform(k[1], (tasks, 2 * shots, 1), dtype=DT, low=-5.0, high=5.0)
    y = amp * torch.sin(x)
    return Task(x[:, :shots], y[:, :shots], x[:, shots:], y[:, shots:])


def test_reptile_update_equals_its_formula() -> None:
    model = conv4(3, hidden=4, image_size=8, dtype=DT)
    theta, state = model.init(random.key(0))
    apply = bind(model, state)
    tasks = image_tasks(1, tasks=2)
    steps, lr, eps = 3, 0.1, 0.5
    learner = reptile(apply, inner_steps=steps, inner_lr=lr)
    pseudo, _, _ = mean_task_grads(learner.task_grad, theta, tasks, strategy="loop")
    new_theta, _ = sgd(eps).update(theta, pseudo, {})
    # Direct: W_t = k SGD steps on all of task t's examples; theta + eps * mean(W_t - theta).
    adapted = []
    for t in range(tasks.num_tasks):
        x = torch.cat([tasks.support_x[t], tasks.query_x[t]])
        y = torch.cat([tasks.support_y[t], tasks.query_y[t]])
        w = {n: p.detach().clone().requires_grad_() for n, p in theta.items()}
        for _ in range(steps):
            grads = torch.autograd.grad(F.cross_entropy(apply(w, x), y), list(w.values()))
            w = {n: (p - lr * g).detach().requires_grad_()
                 for (n, p), g in zip(w.items(), grads, strict=True)}
        adapted.append(w)
    for n, p in theta.items():
        want = p + eps * torch.stack([w[n].detach() - p for w in adapted]).mean(0)
        torch.testing.assert_close(new_theta[n], want, rtol=1e-10, atol=1e-12,
                                   msg=lambda m, n=n: f"reptile update of {n}: {m}")


def test_reptile_minibatches_fit_one_example_of_every_class_per_step() -> None:
    """With ``ways``, inner step i fits the i-th example of every class (support examples
    first, then queries; cycling after the last), against a hand loop; vmap agrees."""
    model = conv4(3, hidden=4, image_size=8, dtype=DT)
    theta, state = model.init(random.key(0))
    apply = bind(model, state)
    tasks = image_tasks(5, tasks=2)  # 3 ways, 2 shots and 2 queries: 4 examples per class
    steps, lr = 5, 0.1
    learner = reptile(apply, inner_steps=steps, inner_lr=lr, ways=3)
    pseudo, _, _ = mean_task_grads(learner.task_grad, theta, tasks, strategy="loop")
    want: dict[str, list[torch.Tensor]] = {n: [] for n in theta}
    for t in range(tasks.num_tasks):
        by_class = [torch.cat([tasks.support_x[t][tasks.support_y[t] == c],
                               tasks.query_x[t][tasks.query_y[t] == c]]) for c in range(3)]
        w = {n: p.detach().clone().requires_grad_() for n, p in theta.items()}
        for i in range(steps):
            x = torch.stack([examples[i % 4] for examples in by_class])
            loss = F.cross_entropy(apply(w, x), torch.arange(3))
            grads = torch.autograd.grad(loss, list(w.values()))
            w = {n: (p - lr * g).detach().requires_grad_()
                 for (n, p), g in zip(w.items(), grads, strict=True)}
        for n, p in theta.items():
            want[n].append(p - w[n].detach())
    for n in theta:
        torch.testing.assert_close(pseudo[n], torch.stack(want[n]).mean(0), rtol=1e-10,
                                   atol=1e-12, msg=lambda m, n=n: f"minibatch reptile {n}: {m}")
    batched, _, _ = mean_task_grads(learner.task_grad, theta, tasks, strategy="vmap")
    for n in theta:
        torch.testing.assert_close(batched[n], pseudo[n], rtol=1e-9, atol=1e-11,
                                   msg=lambda m, n=n: f"vmap vs loop, {n}: {m}")


def test_reptile_adam_inner_loop_equals_torch_optim_adam() -> None:
    """The paper's inner loop: Adam with beta1 = 0 from a fresh state, on all of a task's
    examples, against torch.optim.Adam stepping a copy of the params."""
    model = conv4(3, hidden=4, image_size=8, dtype=DT)
    theta, state = model.init(random.key(0))
    apply = bind(model, state)
    tasks = image_tasks(3, tasks=2)
    steps, lr = 4, 1e-2
    learner = reptile(apply, inner_steps=steps, inner_lr=lr, inner_optimizer="adam")
    pseudo, _, _ = mean_task_grads(learner.task_grad, theta, tasks, strategy="loop")
    adapted = []
    for t in range(tasks.num_tasks):
        x = torch.cat([tasks.support_x[t], tasks.query_x[t]])
        y = torch.cat([tasks.support_y[t], tasks.query_y[t]])
        w = {n: p.detach().clone().requires_grad_() for n, p in theta.items()}
        opt = torch.optim.Adam(list(w.values()), lr=lr, betas=(0.0, 0.999))
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(apply(w, x), y).backward()
            opt.step()
        adapted.append(w)
    # atol: a conv bias before batch norm has a gradient of rounding noise (~1e-17), which
    # Adam scales to about lr * |g| / eps ~ 1e-11; the real updates are ~lr * steps = 4e-2.
    for n, p in theta.items():
        want = torch.stack([p - w[n].detach() for w in adapted]).mean(0)
        torch.testing.assert_close(pseudo[n], want, rtol=1e-9, atol=1e-9,
                                   msg=lambda m, n=n: f"reptile adam pseudo-gradient {n}: {m}")
    for strategy in ("threads", "vmap"):  # tasks are independent: every strategy agrees
        other, _, _ = mean_task_grads(learner.task_grad, theta, tasks, strategy=strategy)
        for n in theta:
            torch.testing.assert_close(other[n], pseudo[n], rtol=1e-9, atol=1e-9,
                                       msg=lambda m, n=n, s=strategy: f"{s} vs loop, {n}: {m}")


def test_reptile_rejects_an_unknown_inner_optimizer() -> None:
    model = conv4(3, hidden=4, image_size=8, dtype=DT)
    _, state = model.init(random.key(0))
    with pytest.raises(ConfigError, match="inner_optimizer must be one of"):
        reptile(bind(model, state), inner_optimizer="rmsprop")


def test_adapt_refuses_a_differentiated_optimizer_inner_loop() -> None:
    """An optimiser's steps are not differentiated through: second order is refused, not
    silently dropped."""
    model = conv4(3, hidden=4, image_size=8, dtype=DT)
    theta, state = model.init(random.key(0))
    task = image_tasks(3, tasks=1).pick(0)
    with pytest.raises(ConfigError, match="first order only"):
        adapt(bind(model, state), theta, task.support_x, task.support_y, loss=F.cross_entropy,
              inner=InnerLoop(1, 0.1), optimizer=adam(0.1))


def test_protonet_distances_loss_and_gradients_match_direct_computation() -> None:
    model = conv4(None, hidden=4, image_size=8, dtype=DT)
    params, state = model.init(random.key(2))
    embed = bind(model, state)
    task = image_tasks(3, tasks=1).pick(0)
    learner = protonet(embed, ways=3)
    grads, loss, acc = learner.task_grad(params, task)

    leaves = {n: p.detach().clone().requires_grad_() for n, p in params.items()}
    s, q = embed(leaves, task.support_x), embed(leaves, task.query_x)
    protos = torch.stack([s[task.support_y == c].mean(0) for c in range(3)])
    dist = torch.cdist(q, protos) ** 2
    torch.testing.assert_close(prototypes(s, task.support_y, 3), protos)
    torch.testing.assert_close(squared_distances(q, protos), dist)
    want_loss = F.cross_entropy(-dist, task.query_y)
    torch.testing.assert_close(loss, want_loss.detach())
    torch.testing.assert_close(acc, (dist.argmin(1) == task.query_y).to(DT).mean())
    want = torch.autograd.grad(want_loss, list(leaves.values()))
    for (n, _), g in zip(leaves.items(), want, strict=True):
        torch.testing.assert_close(grads[n], g, msg=lambda m, n=n: f"protonet grad {n}: {m}")


def test_protonet_vmap_equals_the_loop() -> None:
    """Prototypes come from a label comparison, not F.one_hot, so ProtoNet maps over tasks."""
    from funcgraph.meta import mean_task_grads

    model = conv4(None, hidden=4, image_size=8, dtype=DT)
    params, state = model.init(random.key(2))
    learner = protonet(bind(model, state), ways=3)
    tasks = image_tasks(4, tasks=3)
    looped = mean_task_grads(learner.task_grad, params, tasks, strategy="loop")
    mapped = mean_task_grads(learner.task_grad, params, tasks, strategy="vmap")
    for n, g in looped[0].items():
        torch.testing.assert_close(mapped[0][n], g, rtol=1e-10, atol=1e-12,
                                   msg=lambda m, n=n: f"protonet vmap grad {n}: {m}")
    torch.testing.assert_close(mapped[1], looped[1], msg="protonet vmap loss")


def test_confidence_interval_formula() -> None:
    values = torch.tensor([0.6, 0.8, 1.0, 0.4, 0.7])
    mean, half = confidence_interval(values)
    v = values.double()
    assert math.isclose(mean, v.mean().item(), rel_tol=1e-12)
    assert math.isclose(half, 1.96 * v.std().item() / math.sqrt(5), rel_tol=1e-12)


def test_evaluate_is_deterministic_and_independent_of_batching() -> None:
    model = mlp(hidden=(8,), dtype=DT)
    params, _ = model.init(random.key(0))
    learner = maml(bind(model, {}), kind="regression", inner_steps=2, inner_lr=0.01)

    def sample(key: torch.Tensor, n: int) -> Task:
        return sine_tasks(int(random.bits(key, (1,)).item()), n, 5)

    a = evaluate(learner, params, sample, key=random.key(1), episodes=12, batch=4)
    b = evaluate(learner, params, sample, key=random.key(1), episodes=12, batch=4)
    assert a == b, f"same key, same result: {a} vs {b}"
    assert a.metric_name == "mse" and a.episodes == 12 and a.ci95 > 0, f"unexpected {a}"

    # The same 12 tasks evaluated in batches of 12, 5 (a short last batch), 4 and 1, looped
    # and vmapped: a sampler that serves batch i the pool's rows [i * batch, i * batch + n)
    # (evaluate draws batch i with fold_in(key, i), so the sampler can tell which batch it is).
    key = random.key(1)
    pool = sine_tasks(7, 12, 5)
    index = {tuple(random.fold_in(key, i).tolist()): i for i in range(12)}

    def pooled(batch: int):  # type: ignore[no-untyped-def]
        def sample(batch_key: torch.Tensor, n: int) -> Task:
            start = index[tuple(batch_key.tolist())] * batch
            return Task(*(t[start:start + n] for t in pool))
        return sample

    whole = evaluate(learner, params, pooled(12), key=key, episodes=12, batch=12)
    assert whole.episodes == 12 and whole.ci95 > 0, f"unexpected {whole}"
    for batch in (5, 4, 1):
        looped = evaluate(learner, params, pooled(batch), key=key, episodes=12, batch=batch)
        assert looped == whole, f"batch={batch}: {looped} != batch=12: {whole}"
    for batch in (12, 5):
        mapped = evaluate(learner, params, pooled(batch), key=key, episodes=12, batch=batch,
                          strategy="vmap")
        for field in ("mean", "ci95", "loss"):
            assert math.isclose(getattr(mapped, field), getattr(whole, field),
                                rel_tol=1e-12), (
                f"vmap batch={batch} {field}: {getattr(mapped, field)} vs loop "
                f"{getattr(whole, field)}")


def test_auto_strategy_is_the_measured_default_and_measure_picks_the_faster() -> None:
    assert resolve_strategy("auto", "cpu") == DEFAULT_STRATEGY["cpu"]
    big = CPU_VMAP_MAX_EXAMPLES + 1
    assert resolve_strategy("auto", "cpu", examples_per_task=big) == "loop"
    assert resolve_strategy("auto", "cuda", examples_per_task=big) == "vmap"
    delays = {"loop": 0.02, "threads": 0.02, "vmap": 0.0}
    import time

    assert resolve_strategy("measure", "cpu", probe=lambda s: time.sleep(delays[s])) == "vmap"


@given(tasks=st.integers(1, 4), shots=st.integers(1, 5), steps=st.integers(0, 2),
       first_order=st.booleans())
def test_vmap_equals_loop_for_any_task_shape(tasks: int, shots: int, steps: int,
                                             first_order: bool) -> None:
    model = mlp(hidden=(6, 6), dtype=DT)
    params, _ = model.init(random.key(tasks))
    learner = maml(bind(model, {}), kind="regression", inner_steps=steps, inner_lr=0.05,
                   first_order=first_order)
    batch = sine_tasks(shots, tasks, shots)
    gl, ll, _ = mean_task_grads(learner.task_grad, params, batch, strategy="loop")
    gv, lv, _ = mean_task_grads(learner.task_grad, params, batch, strategy="vmap")
    torch.testing.assert_close(ll, lv)
    for n in params:
        torch.testing.assert_close(gl[n], gv[n], rtol=1e-10, atol=1e-12)
    el, _ = task_evals(learner.task_eval, params, batch, strategy="loop")
    ev, _ = task_evals(learner.task_eval, params, batch, strategy="vmap")
    torch.testing.assert_close(el, ev)
