"""``from_module`` rewrites a module's CNN chains onto funcgraph's layers and stays the module.

The references: the module's own forward (a deep copy run the ordinary way, float64) for
outputs, returned state and first-order gradients (``check_matches_module``); and the same
module kept on the exact ``functional_call`` path (``fuse=False``) for the second-order MAML
meta-gradient, under the loop, vmap and threads strategies. Modules the rewrite cannot prove
or write exactly keep that path and say why in ``meta["not_rewritten"]``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st
from test_nn_layers import check_matches_module  # tests/ is on sys.path under pytest
from torch import Tensor, nn
from torch.func import grad, vmap

import funcgraph as fg
from funcgraph.meta import Task, maml, mean_task_grads
from funcgraph.models.conv4 import conv4_module

DT = torch.float64
Params = dict[str, Tensor]


class _Blocks(nn.Module):
    """Children that are Sequential blocks, called in turn by a custom forward."""

    def __init__(self) -> None:
        super().__init__()
        self.block1 = nn.Sequential(nn.Conv2d(1, 18, 3, padding=1), nn.BatchNorm2d(18),
                                    nn.ReLU(), nn.MaxPool2d(2))
        self.block2 = nn.Sequential(nn.Conv2d(18, 6, 3, stride=2, bias=False),
                                    nn.BatchNorm2d(6, affine=False, momentum=0.3, eps=1e-3))
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.block2(self.block1(x)))
        return self.head(x.mean((2, 3)))


class _ViewByBatchSize(nn.Module):
    """A custom forward that flattens with ``view(x.size(0), -1)`` (a view of channels-last
    activations fails: the rewrite runs it as ``reshape``) and ``reshape(x.shape[0], -1)``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(1, 18, 3), nn.BatchNorm2d(18)
        self.head = nn.Linear(18 * 3 * 3, 3)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.norm(self.conv(x))), 2)
        x = x.view(x.size(0), -1)
        return self.head(x.reshape(x.shape[0], -1))


CHAINS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "conv4 twin": (lambda: conv4_module(3, hidden=18, variant="pool", image_size=16),
                   (1, 16, 16)),
    "nested sequential": (lambda: nn.Sequential(
        nn.Conv2d(2, 18, 3, padding=1), nn.BatchNorm2d(18), nn.ReLU(), nn.MaxPool2d(2),
        nn.Sequential(nn.Sequential(nn.Conv2d(18, 5, 3, padding=1, dilation=2),
                                    nn.BatchNorm2d(5, track_running_stats=False)),
                      nn.ReLU(inplace=True)),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(5, 3)), (2, 8, 8)),
    "sequential blocks": (_Blocks, (1, 8, 8)),
    "groups and string padding": (lambda: nn.Sequential(
        nn.Conv2d(4, 6, 3, groups=2, padding="same"), nn.BatchNorm2d(6), nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True), nn.Flatten(),
        nn.Linear(6 * 3 * 3, 4), nn.BatchNorm1d(4, eps=1e-2, momentum=0.5), nn.Tanh(),
        nn.Linear(4, 2)), (4, 5, 5)),
    "view by batch size": (_ViewByBatchSize, (1, 8, 8)),
    "fully convolutional": (lambda: nn.Sequential(
        nn.Conv2d(1, 18, 3), nn.BatchNorm2d(18), nn.ReLU(), nn.Conv2d(18, 2, 1)), (1, 6, 6)),
}


def _build(name: str) -> tuple[nn.Module, Tensor]:
    torch.manual_seed(0)
    build, shape = CHAINS[name]
    module = build().to(DT)
    with torch.no_grad():  # random affine params and running statistics: every term matters
        for n, t in [*module.named_parameters(), *module.named_buffers()]:
            if n.endswith("running_var"):
                t.uniform_(0.5, 1.5)
            elif t.is_floating_point():
                t.normal_(0, 0.5)
    return module, torch.randn(6, *shape, dtype=DT)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("name", list(CHAINS))
def test_rewritten_chain_equals_the_module(name: str, train: bool) -> None:
    """Outputs, gradients wrt params and input, returned state; two calls, so the second
    starts from the running statistics the first returned (as the module's buffers)."""
    module, x = _build(name)
    model = fg.from_module(module)
    assert model.meta["rewritten"] and model.meta["not_rewritten"] is None, model.meta
    reference = copy.deepcopy(module)
    for _ in range(2):
        check_matches_module(model, reference, x, train=train)


def test_an_image_output_comes_back_in_the_module_layout() -> None:
    """Inside, activations are channels-last; a 4-D output is returned contiguous, as the
    module's own forward returns it."""
    module, x = _build("fully convolutional")
    params, state = fg.from_module(module, init="copy").init(fg.random.key(0))
    y, _ = fg.from_module(module).apply(params, state, x, train=True)
    assert y.shape == module(x).shape and y.is_contiguous(), (y.shape, y.stride())


def test_the_conv4_twin_runs_as_conv4_does() -> None:
    lines = fg.from_module(conv4_module(5, variant="pool")).meta["rewritten"]
    assert lines[0] == ("block1.conv (Conv2d) > block1.norm (BatchNorm2d) > relu > max_pool2d: "
                        "conv_batch_norm (batch statistics from the patches), "
                        "ReLU after max-pool"), lines
    assert lines[1].endswith(": conv_batch_norm, ReLU after max-pool"), lines
    assert lines[-2:] == ("head (Linear): linear", "input: channels-last outside transforms")


def test_running_statistics_under_vmap_equal_the_loop() -> None:
    """grad and the returned running statistics under vmap over tasks (one shared state, as
    bind gives MAML) equal a loop over the tasks."""
    module, _ = _build("nested sequential")
    model = fg.from_module(module, init="copy")
    params, state = model.init(fg.random.key(0))
    xs = torch.randn(3, 4, 2, 8, 8, dtype=DT)

    def loss(p: Params, x: Tensor) -> tuple[Tensor, Params]:
        y, new_state = model.apply(p, state, x, train=True)
        return y.square().sum(), new_state

    grads, states = vmap(grad(loss, has_aux=True), in_dims=(None, 0))(params, xs)
    for i in range(3):
        want, want_state = grad(loss, has_aux=True)(params, xs[i])
        for n in want:
            torch.testing.assert_close(grads[n][i], want[n], rtol=1e-10, atol=1e-12, msg=n)
        for n in want_state:
            torch.testing.assert_close(states[n][i], want_state[n], rtol=0, atol=1e-12, msg=n)


def _tasks(shape: tuple[int, ...], ways: int, num: int = 3) -> Task:
    k = fg.random.split(fg.random.key(7), 2)
    sx = fg.random.normal(k[0], (num, 2 * ways, *shape), dtype=DT)
    qx = fg.random.normal(k[1], (num, 2 * ways, *shape), dtype=DT)
    y = torch.arange(ways).repeat(2).expand(num, -1).contiguous()
    return Task(sx, y, qx, y)


@pytest.mark.parametrize("strategy", ["loop", "vmap", "threads"])
@pytest.mark.parametrize("name", ["conv4 twin", "sequential blocks"])
def test_maml_meta_gradient_of_the_rewrite_equals_the_exact_path(name: str,
                                                                  strategy: str) -> None:
    """Second order, two inner steps: maml(module) (rewritten) against maml on the same
    module through functional_call (fuse=False), float64."""
    module, _ = _build(name)
    fused = maml(module, inner_lr=0.4, inner_steps=2)
    exact = maml(fg.from_module(module, fuse=False), inner_lr=0.4, inner_steps=2)
    assert fused.model is not None and fused.model.meta["rewritten"], "maml(module) not rewritten"
    assert exact.model is not None and exact.model.meta["not_rewritten"] == "fuse=False"
    params, _ = fused.model.init(fg.random.key(0))
    tasks = _tasks(CHAINS[name][1], 3)
    got, got_loss, _ = mean_task_grads(fused.task_grad, params, tasks, strategy=strategy)
    want, want_loss, _ = mean_task_grads(exact.task_grad, params, tasks, strategy=strategy)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-12, atol=1e-12)
    assert set(got) == set(want)
    for n in want:
        err = float((got[n] - want[n]).abs().max())
        assert torch.allclose(got[n], want[n], rtol=1e-9, atol=1e-11), (
            f"{strategy} {n}: the rewrite's meta-gradient differs by {err:.2e}")
    # the second-order term matters here: first-order MAML gives another meta-gradient
    first = maml(module, inner_lr=0.4, inner_steps=2, first_order=True)
    fo, _, _ = mean_task_grads(first.task_grad, params, tasks, strategy=strategy)
    assert max(float((fo[n] - want[n]).abs().max()) for n in want) > 1e-4, "vacuous check"


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(2, 2, 3, padding=1), nn.BatchNorm2d(2)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.norm(self.conv(x))


class _SizeReadEarly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm, self.head = nn.Conv2d(2, 2, 3), nn.BatchNorm2d(2), nn.Linear(18, 3)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv(x)
        batch = x.size(0)  # a size of one op's output, read by a later op
        return self.head(self.norm(x).view(batch, -1))


class _TensorBranch(nn.Sequential):
    def forward(self, x: Tensor) -> Tensor:
        x = super().forward(x)
        return x if x.sum() > 0 else -x


class _ModeBranch(nn.Sequential):
    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(super().forward(x), 0.5, self.training)


class _MyConv(nn.Conv2d):
    pass


def _hooked() -> nn.Module:
    module = nn.Sequential(nn.Conv2d(2, 2, 3), nn.BatchNorm2d(2))
    module[1].register_forward_hook(lambda m, args, out: out * 2)
    return module


def _conv_bn(**conv: Any) -> Callable[..., nn.Module]:
    return lambda **norm: nn.Sequential(nn.Conv2d(2, 2, 3, **conv), nn.BatchNorm2d(2, **norm))


KEPT: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "skip connection": (_Residual, "used more than once"),
    "size read by a later op": (_SizeReadEarly, "used more than once"),
    "branch on a tensor": (lambda: _TensorBranch(nn.Conv2d(2, 2, 3), nn.BatchNorm2d(2)),
                           "does not trace with torch.fx"),
    "branch on the mode": (lambda: _ModeBranch(nn.Conv2d(2, 2, 3), nn.BatchNorm2d(2)),
                           "differs between training and evaluation"),
    "cumulative average": (lambda: _conv_bn()(momentum=None), "momentum=None"),
    "reflect padding": (lambda: _conv_bn(padding=1, padding_mode="reflect")(),
                        "padding_mode='reflect'"),
    "forward hook": (_hooked, "has hooks"),
    "own Conv2d subclass": (lambda: nn.Sequential(_MyConv(2, 2, 3), nn.BatchNorm2d(2)),
                            "get_attr"),
    "nothing to rewrite": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(50, 3), nn.ReLU()),
                           "nothing to rewrite"),
}


@pytest.mark.parametrize("name", list(KEPT))
def test_what_is_not_recognised_keeps_the_exact_path(name: str) -> None:
    build, reason = KEPT[name]
    torch.manual_seed(0)
    module = build().to(DT)
    model = fg.from_module(module)
    assert model.meta["rewritten"] == (), model.meta
    assert reason in model.meta["not_rewritten"], model.meta["not_rewritten"]
    x = torch.randn(4, 2, 5, 5, dtype=DT)
    params, state = fg.from_module(module, init="copy").init(fg.random.key(0))
    reference = copy.deepcopy(module).train()
    torch.manual_seed(1)  # the same dropout mask for both
    y, _ = model.apply(params, state, x, train=True)
    torch.manual_seed(1)
    torch.testing.assert_close(y, reference(x), rtol=0, atol=0)


def test_fuse_false_keeps_the_exact_path_and_refuses_a_non_bool() -> None:
    module, _ = _build("nested sequential")
    assert fg.from_module(module, fuse=False).meta["not_rewritten"] == "fuse=False"
    with pytest.raises(fg.errors.ConfigError, match="from_module: fuse must be True or False"):
        fg.from_module(module, fuse=1)  # type: ignore[arg-type]


@st.composite
def _chains(draw: st.DrawFn) -> tuple[nn.Module, Tensor, bool]:
    """A random Conv2d -> BatchNorm2d [-> ReLU] [-> MaxPool2d] -> Flatten -> Linear chain."""
    cin = draw(st.sampled_from([1, 2]))
    cout = draw(st.sampled_from([2, 4, 18]))  # 18 >= 2 * 1 * 3 * 3: a 3x3 one-channel conv fuses
    layers: list[nn.Module] = [nn.Conv2d(
        cin, cout, draw(st.sampled_from([1, 2, 3])), stride=draw(st.sampled_from([1, 2])),
        padding=draw(st.sampled_from([0, 1])), dilation=draw(st.sampled_from([1, 2])),
        bias=draw(st.booleans())),
        nn.BatchNorm2d(cout, eps=draw(st.sampled_from([1e-5, 1e-2])),
                       momentum=draw(st.sampled_from([0.0, 0.1, 1.0])),
                       affine=draw(st.booleans()), track_running_stats=draw(st.booleans()))]
    if draw(st.booleans()):
        layers.append(nn.ReLU())
    if draw(st.booleans()):
        layers.append(nn.MaxPool2d(2, stride=draw(st.sampled_from([None, 1])),
                                   padding=draw(st.sampled_from([0, 1])),
                                   ceil_mode=draw(st.booleans())))
    body = nn.Sequential(*layers).to(DT)
    x = torch.randn(3, cin, 7, 7, dtype=DT)
    try:
        features = body(x).flatten(1).shape[1]
    except RuntimeError:  # the image is too small for this chain
        assume(False)
    return (nn.Sequential(*layers, nn.Flatten(), nn.Linear(features, 2)).to(DT), x,
            draw(st.booleans()))


@given(_chains())
def test_random_chains_equal_the_module(case: tuple[nn.Module, Tensor, bool]) -> None:
    module, x, train = case
    model = fg.from_module(module)
    assert model.meta["rewritten"], model.meta["not_rewritten"]
    reference = copy.deepcopy(module)
    for _ in range(2):
        check_matches_module(model, reference, x, train=train)
