"""``from_module(m)`` equals ``m``: outputs, gradients, buffers as state, tied weights.

The reference is a deep copy of the module run the ordinary way; the converted Model must
match it and leave the original module (params, buffers, train/eval mode) untouched.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from test_nn_layers import check_matches_module  # tests/ is on sys.path under pytest
from torch import Tensor, nn
from torch.func import grad, vmap

import funcgraph as fg

Params = dict[str, Tensor]


class _TiedLM(nn.Module):
    """Embedding whose weight is also the output projection (weight tying, as in GPT-2)."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab)
        self.head.weight = self.embed.weight

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(torch.tanh(self.mix(self.embed(tokens))))


def _conv_bn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 2))


MODULES = {
    "mlp": (lambda: nn.Sequential(nn.Linear(3, 5), nn.GELU(), nn.Linear(5, 2)),
            lambda: torch.randn(4, 3, dtype=torch.float64)),
    "conv_bn": (_conv_bn, lambda: torch.randn(4, 2, 5, 5, dtype=torch.float64)),
    "bn1d_no_affine": (lambda: nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, affine=False)),
                       lambda: torch.randn(6, 3, dtype=torch.float64)),
    "tied_lm": (lambda: _TiedLM(7, 4), lambda: torch.randint(0, 7, (3, 5))),
}


def _snapshot(module: nn.Module) -> Params:
    return {n: t.detach().clone() for n, t in module.state_dict(keep_vars=True).items()}


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_from_module_equals_module(name: str, train: bool) -> None:
    torch.manual_seed(0)
    build, make_x = MODULES[name]
    module = build().double()
    module.eval()
    before = _snapshot(module)
    model = fg.from_module(module)
    reference = copy.deepcopy(module)
    # Two calls: the second starts from the reference's buffers after the first one.
    for _ in range(2):
        check_matches_module(model, reference, make_x(), train=train)
    after = _snapshot(module)
    assert before.keys() == after.keys()
    for n in before:
        assert torch.equal(before[n], after[n]), f"from_module's apply mutated module {n!r}"
    assert not module.training, "apply must restore the module's train/eval mode"


def test_batch_norm_buffers_become_returned_state() -> None:
    torch.manual_seed(0)
    module = _conv_bn().double()
    model = fg.from_module(module, init="copy")
    params, state = model.init(fg.random.key(0))
    assert set(state) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    passed = {n: t.clone() for n, t in state.items()}
    x = torch.randn(4, 2, 5, 5, dtype=torch.float64)
    _, new_state = model.apply(params, state, x, train=True)
    copy_ = copy.deepcopy(module).train()
    copy_(x)
    for n, b in copy_.named_buffers():
        torch.testing.assert_close(new_state[n], b, rtol=0, atol=1e-12, msg=n)
        assert torch.equal(state[n], passed[n]), f"apply mutated the passed state {n!r}"
    assert int(new_state["1.num_batches_tracked"]) == 1
    _, eval_state = model.apply(params, new_state, x, train=False)
    for n in state:
        assert torch.equal(eval_state[n], new_state[n]), "eval mode must not change the state"


def test_tied_weights_appear_once_and_stay_tied() -> None:
    torch.manual_seed(0)
    module = _TiedLM(7, 4).double()
    model = fg.from_module(module, init="copy")
    params, state = model.init(fg.random.key(0))
    assert "head.weight" not in params and "embed.weight" in params
    tokens = torch.randint(0, 7, (2, 3))
    f = fg.bind(model, state)

    # Changing the one tied tensor changes both uses: compare with the module after the
    # same change to its shared weight.
    changed = dict(params, **{"embed.weight": params["embed.weight"] * 2 + 1})
    reference = copy.deepcopy(module)
    with torch.no_grad():
        reference.embed.weight.mul_(2).add_(1)
    assert reference.head.weight is reference.embed.weight
    torch.testing.assert_close(f(changed, tokens), reference(tokens), rtol=0, atol=1e-12)

    # The gradient of the tied tensor is the sum over both uses, as autograd on the module.
    g = grad(lambda p: f(p, tokens).square().sum())(params)
    reference = copy.deepcopy(module)
    reference(tokens).square().sum().backward()
    for n, p in reference.named_parameters():
        assert p.grad is not None
        torch.testing.assert_close(g[n], p.grad, rtol=1e-10, atol=1e-12, msg=n)


@pytest.mark.parametrize("train", [False, True])
def test_from_module_under_grad_and_vmap_equals_loop(train: bool) -> None:
    """vmap over tasks (params, state, x); in training each task carries its own buffers,
    since the module updates them in place (torch refuses shared buffers under vmap)."""
    torch.manual_seed(0)
    module = _conv_bn().double()
    model = fg.from_module(module)
    _, state = model.init(fg.random.key(0))
    tasks = [{n: p.detach() + 0.1 * torch.randn_like(p) for n, p in module.named_parameters()}
             for _ in range(3)]
    xs = torch.randn(3, 4, 2, 5, 5, dtype=torch.float64)

    def loss(p: Params, s: Params, x: Tensor) -> tuple[Tensor, Params]:
        y, new_state = model.apply(p, s, x, train=train)
        return y.square().sum(), new_state

    states = fg.params.stack([state] * 3)
    grads, new_states = vmap(grad(loss, has_aux=True))(fg.params.stack([*tasks]), states, xs)
    for i, p in enumerate(tasks):
        want, want_state = grad(loss, has_aux=True)(p, state, xs[i])
        for n in p:
            torch.testing.assert_close(grads[n][i], want[n], rtol=1e-10, atol=1e-12, msg=n)
        for n in state:
            torch.testing.assert_close(new_states[n][i], want_state[n], rtol=0, atol=1e-12, msg=n)


# --- Own modules with batch norm meta-train under every strategy --------------------------

class _OwnNet(nn.Module):
    """A user's module: conv (or linear) -> BatchNorm with running statistics -> ReLU -> head."""

    def __init__(self, dims: int, **norm: Any) -> None:
        super().__init__()
        if dims == 1:
            self.body: nn.Module = nn.Linear(6, 3)
            self.norm: nn.Module = nn.BatchNorm1d(3, **norm)
        elif dims == 2:
            self.body, self.norm = nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3, **norm)
        else:
            self.body, self.norm = nn.Conv3d(1, 3, 2), nn.BatchNorm3d(3, **norm)
        self.head = nn.Linear(3, 4)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.norm(self.body(x)))
        return self.head(h.flatten(2).mean(-1) if h.dim() > 2 else h)


INPUTS = {1: (6,), 2: (1, 5, 5), 3: (1, 3, 3, 3)}
INNER_LR, INNER_STEPS, NUM_TASKS, SHOTS = 0.4, 2, 3, 8


def _tasks(dims: int) -> fg.meta.Task:
    k = fg.random.split(fg.random.key(7), 4)
    shape = (NUM_TASKS, SHOTS, *INPUTS[dims])
    return fg.meta.Task(fg.random.normal(k[0], shape, dtype=torch.float64),
                        fg.random.randint(k[1], (NUM_TASKS, SHOTS), 0, 4),
                        fg.random.normal(k[2], shape, dtype=torch.float64),
                        fg.random.randint(k[3], (NUM_TASKS, SHOTS), 0, 4))


def _autograd_reference(module: nn.Module, params: Params, tasks: fg.meta.Task) -> Params:
    """Hand-written second-order MAML on the module itself: plain autograd with
    ``create_graph=True`` through the inner steps, torch's native batch norm, a loop."""
    net = copy.deepcopy(module).train()
    leaves = {n: p.detach().clone().requires_grad_() for n, p in params.items()}
    total = torch.zeros((), dtype=torch.float64)
    for t in range(NUM_TASKS):
        fast = dict(leaves)
        for _ in range(INNER_STEPS):
            logits = torch.func.functional_call(net, fast, (tasks.support_x[t],))
            loss = torch.nn.functional.cross_entropy(logits, tasks.support_y[t])
            grads = torch.autograd.grad(loss, list(fast.values()), create_graph=True)
            fast = {n: p - INNER_LR * g for (n, p), g in zip(fast.items(), grads, strict=True)}
        logits = torch.func.functional_call(net, fast, (tasks.query_x[t],))
        total = total + torch.nn.functional.cross_entropy(logits, tasks.query_y[t])
    grads = torch.autograd.grad(total / NUM_TASKS, list(leaves.values()))
    return dict(zip(leaves, grads, strict=True))


NORMS: dict[str, tuple[int, dict[str, Any]]] = {
    "1d": (1, {}), "2d": (2, {}), "3d": (3, {}),
    "2d cumulative average": (2, {"momentum": None}),
    "2d without running statistics": (2, {"track_running_stats": False}),
    "1d without affine": (1, {"affine": False}),
}


@pytest.mark.parametrize("norm", sorted(NORMS))
def test_own_module_with_batch_norm_meta_gradients_equal_autograd(norm: str) -> None:
    """vmap == threads == loop == a plain autograd MAML on the nn.Module, float64. Before
    from_module made batch norm transform-safe, vmap died in torch ("running_mean ... were
    not batched"); torch's native kernel under vmap is ~1e-2 off (tests/test_vmap_batch_norm)."""
    dims, options = NORMS[norm]
    module = _OwnNet(dims, **options).double()
    model = fg.from_module(module)
    params, state = model.init(fg.random.key(0))
    assert ("norm.running_mean" in state) == options.get("track_running_stats", True)
    tasks = _tasks(dims)
    learner = fg.meta.maml(fg.bind(model, state, train=True), inner_lr=INNER_LR,
                           inner_steps=INNER_STEPS)
    want = _autograd_reference(module, params, tasks)
    got = {s: fg.meta.mean_task_grads(learner.task_grad, params, tasks, strategy=s)[0]
           for s in ("loop", "threads", "vmap")}
    for strategy, grads in got.items():
        assert set(grads) == set(want)
        for n in want:
            torch.testing.assert_close(grads[n], want[n], rtol=1e-10, atol=1e-10,
                                       msg=lambda m, s=strategy, n=n: f"{s} {n}: {m}")
    assert any(float(g.abs().max()) > 1e-3 for g in want.values()), "a vacuous gradient"


def test_running_statistics_under_vmap_with_shared_state_equal_the_loop() -> None:
    """One state for every member (what bind gives MAML): training under vmap returns each
    member's running statistics; evaluation with them is the same under vmap and a loop."""
    module = _OwnNet(2).double()
    model = fg.from_module(module)
    params, state = model.init(fg.random.key(0))
    xs = fg.random.normal(fg.random.key(3), (3, 4, 1, 5, 5), dtype=torch.float64)

    def train_step(x: Tensor) -> tuple[Tensor, Params]:
        return model.apply(params, state, x, train=True)

    ys, states = vmap(train_step)(xs)
    for i in range(3):
        y, s = train_step(xs[i])
        torch.testing.assert_close(ys[i], y, rtol=0, atol=1e-12)
        for n in s:
            torch.testing.assert_close(states[n][i], s[n], rtol=0, atol=1e-12, msg=n)
    moved = states["norm.running_mean"][0]
    assert not torch.equal(moved, state["norm.running_mean"]), "running mean did not move"
    evals = vmap(lambda x: model.apply(params, {**state, "norm.running_mean": moved}, x)[0])(xs)
    for i in range(3):
        want, _ = model.apply(params, {**state, "norm.running_mean": moved}, xs[i])
        torch.testing.assert_close(evals[i], want, rtol=0, atol=1e-12)


def test_batch_norm_of_one_value_per_channel_is_a_shape_error() -> None:
    model = fg.from_module(_OwnNet(1).double())
    params, state = model.init(fg.random.key(0))
    one = torch.zeros(1, 6, dtype=torch.float64)
    with pytest.raises(fg.errors.ShapeError, match="^from_module: batch norm in training needs "
                                                   r"more than one value per channel, got input "
                                                   r"\(1, 3\)"):
        grad(lambda p: model.apply(p, state, one, train=True)[0].sum())(params)


def test_threads_run_their_own_copy_of_a_module_without_batch_norm() -> None:
    """functional_call swaps tensors into the module for the call: concurrent calls on one
    module would read each other's params, so other threads run a copy."""
    module = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4)).double()
    model = fg.from_module(module)
    params, state = model.init(fg.random.key(0))
    learner = fg.meta.maml(fg.bind(model, state), inner_lr=INNER_LR, inner_steps=INNER_STEPS)
    tasks = _tasks(1)
    loop, _, _ = fg.meta.mean_task_grads(learner.task_grad, params, tasks, strategy="loop")
    for _ in range(3):
        threads, _, _ = fg.meta.mean_task_grads(learner.task_grad, params, tasks,
                                                strategy="threads", workers=3)
        for n in loop:
            torch.testing.assert_close(threads[n], loop[n], rtol=1e-12, atol=1e-12, msg=n)
