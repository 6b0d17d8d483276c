"""``from_module(m)`` equals ``m``: outputs, gradients, buffers as state, tied weights.

The reference is a deep copy of the module run the ordinary way; the converted Model must
match it and leave the original module (params, buffers, train/eval mode) untouched.
"""

from __future__ import annotations

import copy

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
    model = fg.from_module(module)
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
    model = fg.from_module(module)
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
