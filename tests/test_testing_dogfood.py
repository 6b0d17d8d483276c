"""funcgraph.testing applied to funcgraph's own models: the helpers must pass on the real
library (pure, vmappable, correct gradients, equal to torch.nn), not only on toy functions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import funcgraph as fg
from funcgraph import random
from funcgraph.meta import InnerLoop, adapt
from funcgraph.models import conv4, early_exit_cnn, mlp, resnet
from funcgraph.testing import (
    assert_grad_matches_finite_differences,
    assert_matches_module,
    assert_pure,
    assert_vmap_matches_loop,
)
from funcgraph.testing.plugin import KeyStream


@pytest.mark.parametrize(
    "model, module, shape, train",
    [
        (fg.nn.conv2d(2, 3, 3, padding=1, stride=2), torch.nn.Conv2d(2, 3, 3, 2, 1), (2, 2, 5, 5),
         False),
        (fg.nn.batch_norm(3), torch.nn.BatchNorm2d(3), (4, 3, 2, 2), True),
        (fg.nn.group_norm(2, 4), torch.nn.GroupNorm(2, 4), (2, 4, 3), False),
        (fg.nn.layer_norm(5), torch.nn.LayerNorm(5), (3, 5), False),
    ],
    ids=["conv2d", "batch_norm", "group_norm", "layer_norm"],
)
def test_layers_match_their_torch_modules(
    model: fg.Model, module: torch.nn.Module, shape: tuple[int, ...], train: bool, key: Tensor
) -> None:
    assert_matches_module(model, module, random.normal(key, shape), train=train)


def test_keyed_models_are_pure_in_training(keys: KeyStream) -> None:
    sd = resnet(8, num_classes=3, in_channels=1, width=4)
    p, s = sd.init(keys())
    assert_pure(sd.apply, p, s, random.normal(keys(), (2, 1, 8, 8)), key=keys(), train=True)
    ee = early_exit_cnn(num_classes=3, width=4)
    p, s = ee.init(keys())
    assert_pure(ee.apply, p, s, random.normal(keys(), (3, 1, 8, 8)), key=keys(), train=True)


def test_conv4_vmapped_over_tasks_equals_a_loop(key: Tensor) -> None:
    model = conv4(3, hidden=4, image_size=8)
    params, state = model.init(key)
    tasks = random.normal(random.fold_in(key, 1), (3, 4, 1, 8, 8))  # (T, B, C, H, W)
    assert_vmap_matches_loop(fg.bind(model, state), params, tasks, in_dims=(None, 0))


def test_second_order_maml_gradient_matches_finite_differences(key: Tensor) -> None:
    model = mlp(1, 1, hidden=(4,))
    params, state = model.init(key)
    f = fg.bind(model, state)
    x = random.normal(random.fold_in(key, 1), (6, 1))
    y = torch.sin(x)

    def query_loss(p: fg.Params, x: Tensor, y: Tensor) -> Tensor:
        fast = adapt(f, p, x[:3], y[:3], loss=F.mse_loss, inner=InnerLoop(2, 0.1))
        return F.mse_loss(f(fast, x[3:]), y[3:])

    assert_grad_matches_finite_differences(query_loss, params, x, y, max_entries=4)
