"""MAML family: meta-gradients of every strategy against a hand-unrolled autograd reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_meta_keys import DT, WAYS, image_tasks  # tests/ is on sys.path under pytest
from torch import Tensor
from torch.func import functional_call

from funcgraph import bind, random
from funcgraph.debug import count_calls
from funcgraph.errors import ConfigError
from funcgraph.meta import (
    LR_PREFIX,
    STRATEGIES,
    BoundApply,
    MetaLearner,
    Task,
    anil,
    fomaml,
    maml,
    mean_task_grads,
    metasgd,
    task_evals,
)
from funcgraph.models import conv4
from funcgraph.models.conv4 import conv4_module
from funcgraph.params import Params


def tiny_model() -> tuple[BoundApply, Params]:
    model = conv4(WAYS, hidden=18, image_size=8, dtype=DT)  # 18: the first block fuses
    params, state = model.init(random.key(1))
    return bind(model, state), params


def reference_meta_grad(
    apply: BoundApply,
    meta_params: Params,
    tasks: Task,
    *,
    steps: int,
    lr: float,
    first_order: bool,
    only: str | None = None,
) -> dict[str, Tensor]:
    """Hand-unrolled MAML: torch.autograd.grad(create_graph=True) in a Python loop over tasks."""
    leaves = {n: p.detach().clone().requires_grad_() for n, p in meta_params.items()}
    params = {n: p for n, p in leaves.items() if not n.startswith(LR_PREFIX)}
    total = torch.zeros((), dtype=DT)
    for t in range(tasks.num_tasks):
        fast = dict(params)
        for _ in range(steps):
            names = [n for n in fast if only is None or n.startswith(only + ".")]
            loss = F.cross_entropy(apply(fast, tasks.support_x[t]), tasks.support_y[t])
            grads = torch.autograd.grad(loss, [fast[n] for n in names],
                                        create_graph=not first_order)
            for n, g in zip(names, grads, strict=True):
                rate = leaves.get(LR_PREFIX + n, lr)
                fast[n] = fast[n] - rate * g
        total = total + F.cross_entropy(apply(fast, tasks.query_x[t]), tasks.query_y[t])
    grads = torch.autograd.grad(total / tasks.num_tasks, list(leaves.values()))
    return dict(zip(leaves, grads, strict=True))


def assert_grads_close(got: Params, want: Params, what: str) -> None:
    assert set(got) == set(want), f"{what}: names differ"
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-9, atol=1e-11,
                                   msg=lambda m, n=n: f"{what}: {n}: {m}")


def two_step_grads(make: Callable[..., MetaLearner], seed: int, strategy: str, remat: bool,
                   **reference: Any) -> tuple[Params, dict[str, Tensor]]:
    """The meta-gradient of ``make(apply, inner_steps=2, inner_lr=0.3, remat=remat)`` on
    ``image_tasks(seed)``, and the unrolled reference's (``reference``: its ``first_order`` and
    ``only``) at the same steps and rate."""
    apply, params = tiny_model()
    tasks = image_tasks(seed)
    got, _, _ = mean_task_grads(make(apply, inner_steps=2, inner_lr=0.3, remat=remat).task_grad,
                                params, tasks, strategy=strategy)
    return got, reference_meta_grad(apply, params, tasks, steps=2, lr=0.3, **reference)


@pytest.mark.parametrize("remat", [False, True], ids=["graph", "remat"])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("steps", [1, 3])
def test_maml_second_order_equals_unrolled_reference(strategy: str, steps: int,
                                                     remat: bool) -> None:
    apply, params = tiny_model()
    tasks = image_tasks()
    learner = maml(apply, inner_steps=steps, inner_lr=0.3, remat=remat)
    got, _, _ = mean_task_grads(learner.task_grad, learner.init(params), tasks, strategy=strategy)
    want = reference_meta_grad(apply, params, tasks, steps=steps, lr=0.3, first_order=False)
    assert_grads_close(got, want, f"maml {strategy} steps={steps}")


@pytest.mark.parametrize("remat", [False, True], ids=["graph", "remat"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fomaml_is_maml_without_second_order_term(strategy: str, remat: bool) -> None:
    got, want = two_step_grads(fomaml, 2, strategy, remat, first_order=True)
    assert_grads_close(got, want, f"fomaml {strategy}")
    apply, params = tiny_model()
    second, _, _ = mean_task_grads(maml(apply, inner_steps=2, inner_lr=0.3).task_grad, params,
                                   image_tasks(2), strategy=strategy)
    gap = max((second[n] - got[n]).abs().max().item() for n in got)
    assert gap > 1e-6, "the second-order term should matter for this model"


@pytest.mark.parametrize("remat", [False, True], ids=["graph", "remat"])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("steps", [1, 2])
def test_metasgd_rates_get_reference_gradients(strategy: str, steps: int, remat: bool) -> None:
    apply, params = tiny_model()
    tasks = image_tasks(3)
    learner = metasgd(apply, inner_lr=0.2, inner_steps=steps, remat=remat)
    meta = learner.init(params)
    rates = [n for n in meta if n.startswith(LR_PREFIX)]
    assert len(rates) == len(params), "one learned rate tensor per parameter"
    # Perturb the rates so each differs (the gradient must use the per-entry rate).
    meta = {n: p * (1 + 0.1 * random.uniform(random.fold_in(random.key(5), i), p.shape,
                                             dtype=DT))
            if n.startswith(LR_PREFIX) else p for i, (n, p) in enumerate(meta.items())}
    got, _, _ = mean_task_grads(learner.task_grad, meta, tasks, strategy=strategy)
    want = reference_meta_grad(apply, meta, tasks, steps=steps, lr=0.2, first_order=False)
    assert_grads_close(got, want, f"metasgd {strategy}")
    # A conv bias before batch norm cancels (its gradient is zero, exactly in a fused block).
    live = [n for n in rates if not n.endswith("conv.bias")]
    assert all(got[n].abs().sum() > 0 for n in live), "every other learned rate gets a gradient"


@pytest.mark.parametrize("remat", [False, True], ids=["graph", "remat"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_anil_adapts_only_the_head(strategy: str, remat: bool) -> None:
    got, want = two_step_grads(anil, 4, strategy, remat, first_order=False, only="head")
    assert_grads_close(got, want, f"anil {strategy}")


def test_vmap_and_loop_report_the_same_loss_and_accuracy() -> None:
    apply, params = tiny_model()
    tasks = image_tasks(6)
    learner = maml(apply, inner_steps=1, inner_lr=0.3)
    _, loss_l, acc_l = mean_task_grads(learner.task_grad, params, tasks, strategy="loop")
    _, loss_v, acc_v = mean_task_grads(learner.task_grad, params, tasks, strategy="vmap",
                                       chunk_size=2)
    torch.testing.assert_close(loss_l, loss_v)
    torch.testing.assert_close(acc_l, acc_v)



def test_threads_equal_the_loop_deterministically_and_keep_the_callers_thread_count() -> None:
    apply, params = tiny_model()
    tasks = image_tasks(6, tasks=5)
    learner = maml(apply, inner_steps=2, inner_lr=0.3)
    before = torch.get_num_threads()
    looped, loop_loss, _ = mean_task_grads(learner.task_grad, params, tasks, strategy="loop")
    runs = [mean_task_grads(learner.task_grad, params, tasks, strategy="threads", workers=3)
            for _ in range(2)]
    assert torch.get_num_threads() == before, "the caller's intra-op thread count is restored"
    assert_grads_close(runs[0][0], looped, "threads")
    torch.testing.assert_close(runs[0][1], loop_loss)
    assert all(torch.equal(runs[0][0][n], runs[1][0][n]) for n in params), (
        "threaded results are summed in task order: identical from run to run")
    loop_evals = task_evals(learner.task_eval, params, tasks, strategy="loop")
    thread_evals = task_evals(learner.task_eval, params, tasks, strategy="threads", workers=2)
    for a, b in zip(loop_evals, thread_evals, strict=True):
        torch.testing.assert_close(a, b)


def test_a_task_failing_on_a_worker_thread_raises_in_the_caller() -> None:
    apply, params = tiny_model()
    learner = maml(apply)

    def task_grad(meta_params: Params, task: Task) -> tuple[Params, Tensor, Tensor]:
        if bool((task.support_x == tasks.support_x[2]).all()):
            raise ValueError("task 2 is broken")
        return learner.task_grad(meta_params, task)

    tasks = image_tasks(7, tasks=4)
    before = torch.get_num_threads()
    with pytest.raises(ValueError, match="task 2 is broken"):
        mean_task_grads(task_grad, params, tasks, strategy="threads", workers=2)
    assert torch.get_num_threads() == before
    with pytest.raises(ConfigError, match="mean_task_grads: workers must be an int >= 1, got 0"):
        mean_task_grads(task_grad, params, tasks, strategy="threads", workers=0)


def test_compiled_second_order_task_gradient_equals_the_reference() -> None:
    """``torch.compile(fullgraph=True)`` of one task's second-order meta-gradient traces
    without a graph break (``in_transform`` is compile-aware) and gives the reference's.
    Dynamo and AOTAutograd trace it (``aot_eager``); inductor's code for such a graph is
    tests/test_meta_compile_modules.py's ``slow`` test."""
    from funcgraph.meta.learner import objective
    from funcgraph.meta.maml_family import InnerLoop, task_loss

    apply, params = tiny_model()
    tasks = image_tasks(8, tasks=1)
    inner = InnerLoop(steps=1, lr=0.3)

    def loss(p: Params, task: Task) -> tuple[Tensor, Tensor]:
        return task_loss(apply, p, task, objective=objective("classification"), inner=inner)

    compiled = torch.compile(torch.func.grad(loss, has_aux=True), backend="aot_eager",
                             fullgraph=True, dynamic=False)
    got, _ = compiled(params, tasks.pick(0))
    want = reference_meta_grad(apply, params, tasks, steps=1, lr=0.3, first_order=False)
    assert_grads_close(got, want, "compiled maml")


# --- against the torch.nn twin at the real width --------------------------------------------

WIDE = 64  # the MAML paper's width: the first block's 9-wide patches take the covariance path


def module_meta_grad(params: Params, tasks: Task, *, steps: int, lr: float) -> dict[str, Tensor]:
    """Second-order MAML on ``conv4_module`` (``torch.nn.Conv2d``/``BatchNorm2d``, native
    kernels, no funcgraph code in the forward): ``torch.autograd.grad(create_graph=True)``
    in a Python loop over tasks, the fast weights substituted with ``functional_call``."""
    net = conv4_module(WAYS, hidden=WIDE, image_size=8).double()
    net.load_state_dict(params)
    leaves = {n: p.detach().clone().requires_grad_() for n, p in params.items()}
    total = torch.zeros((), dtype=DT)
    for t in range(tasks.num_tasks):
        fast = dict(leaves)
        for _ in range(steps):
            loss = F.cross_entropy(functional_call(net, fast, (tasks.support_x[t],)),
                                   tasks.support_y[t])
            grads = torch.autograd.grad(loss, list(fast.values()), create_graph=True)
            fast = {n: p - lr * g for (n, p), g in zip(fast.items(), grads, strict=True)}
        total = total + F.cross_entropy(functional_call(net, fast, (tasks.query_x[t],)),
                                        tasks.query_y[t])
    grads = torch.autograd.grad(total / tasks.num_tasks, list(leaves.values()))
    return dict(zip(leaves, grads, strict=True))


@pytest.fixture(scope="module")
def wide_case() -> tuple[BoundApply, Params, Task, dict[str, Tensor]]:
    model = conv4(WAYS, hidden=WIDE, image_size=8, dtype=DT)
    assert model.meta["hidden"] == WIDE
    params, state = model.init(random.key(11))
    tasks = image_tasks(12, tasks=2)
    want = module_meta_grad(params, tasks, steps=2, lr=0.3)
    return bind(model, state), params, tasks, want


def test_the_wide_first_block_takes_the_patch_covariance_path(wide_case: tuple) -> None:
    apply, params, tasks, _ = wide_case
    with count_calls(F.unfold) as seen:
        apply(params, tasks.support_x[0])
    assert seen.count == 1, (
        f"conv4 at hidden={WIDE}: the first block (only) should take the patch-moment path, "
        f"F.unfold ran {seen.count} times")


@pytest.mark.parametrize("remat", [False, True], ids=["graph", "remat"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_maml_equals_the_torch_nn_twin_at_width_64(wide_case: tuple, strategy: str,
                                                   remat: bool) -> None:
    apply, params, tasks, want = wide_case
    learner = maml(apply, inner_steps=2, inner_lr=0.3, remat=remat)
    got, _, _ = mean_task_grads(learner.task_grad, params, tasks, strategy=strategy)
    assert_grads_close(got, want, f"maml {strategy} remat={remat} vs torch.nn conv4")
