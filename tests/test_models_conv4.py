"""conv4 and the MLP against equivalent torch.nn modules (names, outputs, gradients)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from funcgraph import bind, random
from funcgraph.errors import ConfigError
from funcgraph.models import conv4, mlp
from funcgraph.models.conv4 import conv4_module
from funcgraph.runs import resolve_model


@pytest.mark.parametrize("variant,size", [("strided", 28), ("pool", 28), ("pool", 32)])
def test_conv4_matches_torch_module(variant: str, size: int) -> None:
    model = conv4(5, hidden=8, variant=variant, image_size=size, dtype=torch.float64)
    params, state = model.init(random.key(0))
    assert state == {}, "transductive batch norm keeps no running statistics"
    ref = conv4_module(5, hidden=8, variant=variant, image_size=size).double()
    assert list(params) == list(ref.state_dict()), "param names follow the nn.Module's"
    ref.load_state_dict(params)
    x = random.uniform(random.key(1), (6, 1, size, size), dtype=torch.float64)
    y = bind(model, state)(params, x)
    torch.testing.assert_close(y, ref(x), msg="forward equals the torch.nn reference")
    g = torch.func.grad(lambda p: bind(model, state)(p, x).square().sum())(params)
    ref(x).square().sum().backward()
    for n, p in ref.named_parameters():
        torch.testing.assert_close(g[n], p.grad, msg=f"gradient of {n}")


def test_conv4_uses_batch_statistics_in_eval_mode_too() -> None:
    model = conv4(3, hidden=4, image_size=8)
    params, state = model.init(random.key(0))
    x = random.uniform(random.key(1), (4, 1, 8, 8))
    train, _ = model.apply(params, state, x, train=True)
    evaluation, _ = model.apply(params, state, x, train=False)
    torch.testing.assert_close(train, evaluation)


def test_conv4_without_head_is_an_embedding() -> None:
    model = conv4(None, hidden=16)
    params, state = model.init(random.key(0))
    assert not any(n.startswith("head.") for n in params)
    assert bind(model, state)(params, torch.rand(3, 1, 28, 28)).shape == (3, 16)


@pytest.mark.parametrize("bad", [{"variant": "avg"}, {"ways": 0}])
def test_conv4_rejects_bad_hyperparameters(bad: dict) -> None:
    kw = {"ways": 5, **bad}
    with pytest.raises(ConfigError, match="conv4"):
        conv4(kw.pop("ways"), **kw)


def test_mlp_matches_sequential() -> None:
    model = mlp(1, 1, hidden=(40, 40))
    params, _ = model.init(random.key(0))
    layers = nn.ModuleList([nn.Linear(1, 40), nn.Linear(40, 40), nn.Linear(40, 1)])
    assert list(params) == [f"layers.{n}" for n in layers.state_dict()]
    layers.load_state_dict({n.removeprefix("layers."): p for n, p in params.items()})
    x = torch.linspace(-5, 5, 11).unsqueeze(1)
    want = layers[2](torch.relu(layers[1](torch.relu(layers[0](x)))))
    torch.testing.assert_close(bind(model, {})(params, x), want)


def test_resolve_model_rebuilds_from_a_run_config() -> None:
    model = resolve_model({"name": "conv4", "ways": 5, "in_channels": 1, "hidden": 8,
                           "variant": "pool"})
    assert model.meta["variant"] == "pool", "the recorded hyperparameters reach conv4"
    with pytest.raises(ConfigError, match="nope"):
        resolve_model({"name": "nope"})
    with pytest.raises(ConfigError, match="did you mean 'hidden'"):
        resolve_model({"name": "mlp", "in_features": 1, "out_features": 1, "hiddn": 3})
