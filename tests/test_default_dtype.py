"""Inits follow ``torch.get_default_dtype()``, as torch's own layers do.

With ``torch.set_default_dtype(torch.float64)``, every layer of ``funcgraph.nn`` and every
reference model initialises float64 params and floating state and runs on a float64 input
(torch refuses mixed dtypes: "addmv input tensors must have the same dtype"). An explicit
``dtype=`` still wins.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from funcgraph import Model, from_module, nn, random
from funcgraph.models import conv4, early_exit_cnn, mlp, resnet, resnet12, rnn_classifier


def _image(c: int = 2, side: int = 8) -> Callable[[], Tensor]:
    return lambda: random.normal(random.key(1), (2, c, side, side))


def _tokens() -> tuple[Tensor, Tensor]:
    tokens = random.randint(random.key(1), (2, 5), 1, 11)
    return tokens, torch.ones(2, 5, dtype=torch.bool)


CASES: dict[str, tuple[Callable[[], Model], Callable[[], object]]] = {
    "linear": (lambda: nn.linear(4, 2), lambda: random.normal(random.key(1), (3, 4))),
    "conv1d": (lambda: nn.conv1d(2, 3, 3), lambda: random.normal(random.key(1), (2, 2, 7))),
    "conv2d": (lambda: nn.conv2d(2, 3, 3), _image()),
    "batch_norm": (lambda: nn.batch_norm(2), _image()),
    "layer_norm": (lambda: nn.layer_norm(8), _image()),
    "group_norm": (lambda: nn.group_norm(1, 2), _image()),
    "conv_batch_norm": (lambda: nn.conv_batch_norm(2, 3, 3), _image()),
    "embedding": (lambda: nn.embedding(11, 4), lambda: _tokens()[0]),
    "lstm": (lambda: nn.lstm(3, 4), lambda: (random.normal(random.key(1), (2, 5, 3)), None)),
    "gru": (lambda: nn.gru(3, 4), lambda: (random.normal(random.key(1), (2, 5, 3)), None)),
    "stochastic_depth": (lambda: nn.stochastic_depth(nn.linear(4, 4), 0.5),
                         lambda: random.normal(random.key(1), (3, 4))),
    "serial_residual_parallel": (
        lambda: nn.serial(nn.residual(nn.linear(4, 4)),
                          nn.parallel(nn.linear(4, 2), nn.linear(4, 3))),
        lambda: random.normal(random.key(1), (3, 4))),
    "mlp": (lambda: mlp(4, 2, hidden=(5,)), lambda: random.normal(random.key(1), (3, 4))),
    "conv4": (lambda: conv4(3, hidden=4, image_size=28), _image(1, 28)),
    "resnet": (lambda: resnet(8, num_classes=3, width=4), _image(3, 8)),
    "resnet12": (lambda: resnet12(3, widths=(2, 2, 2, 2)), _image(3, 16)),
    "early_exit_cnn": (lambda: early_exit_cnn(num_classes=3, width=4), _image(1, 28)),
    "rnn_classifier": (lambda: rnn_classifier(embed_dim=4, hidden_size=5), _tokens),
    "from_module": (lambda: from_module(torch.nn.Sequential(torch.nn.Linear(4, 2))),
                    lambda: random.normal(random.key(1), (3, 4))),
}


def _floating(tensors: dict[str, Tensor]) -> dict[str, torch.dtype]:
    return {n: t.dtype for n, t in tensors.items() if t.is_floating_point()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_init_follows_the_default_dtype(name: str, float64_default: None) -> None:
    build, make_x = CASES[name]
    model = build()
    params, state = model.init(random.key(0))
    floats = {**_floating(params), **_floating(state)}
    assert floats, f"{name} has no floating params to check"
    wrong = {n: d for n, d in floats.items() if d != torch.float64}
    assert not wrong, f"{name}: params/state not float64 under a float64 default: {wrong}"
    y, _ = model.apply(params, state, make_x(), key=random.key(2), train=True)
    outputs = [t for t in torch.utils._pytree.tree_leaves(y) if t.is_floating_point()]
    assert outputs and all(t.dtype == torch.float64 for t in outputs), (
        f"{name}: outputs {[t.dtype for t in outputs]}")


def test_the_default_is_read_when_init_runs_and_dtype_wins(float64_default: None) -> None:
    layer = nn.linear(4, 2)
    assert layer.init(random.key(0))[0]["weight"].dtype == torch.float64
    torch.set_default_dtype(torch.float32)
    assert layer.init(random.key(0))[0]["weight"].dtype == torch.float32, (
        "a layer built under float64 must init in the default dtype of the init call")
    explicit = nn.linear(4, 2, dtype=torch.float64)
    assert explicit.init(random.key(0))[0]["weight"].dtype == torch.float64


def test_float32_default_values_are_unchanged() -> None:
    """The float32 default draws the very numbers an explicit float32 does."""
    implicit, _ = nn.conv2d(2, 3, 3).init(random.key(4))
    explicit, _ = nn.conv2d(2, 3, 3, dtype=torch.float32).init(random.key(4))
    for n in explicit:
        assert torch.equal(implicit[n], explicit[n]), n
