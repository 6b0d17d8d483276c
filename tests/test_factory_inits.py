"""Init specs: each initialiser's statistics against torch.nn.init (the reference), purity,
and per-tensor specs applied through configs."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from funcgraph import random
from funcgraph.errors import ConfigError
from funcgraph.factory import build, inits

SHAPE = (256, 128, 3)  # fan_in 384, fan_out 768: large enough for 1-2 % std estimates


def torch_reference(fn: Callable[..., torch.Tensor], **options: Any) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return fn(torch.empty(SHAPE), generator=gen, **options)


@pytest.mark.parametrize(
    ("name", "options", "reference", "ref_options"),
    [
        ("kaiming_normal", {}, torch.nn.init.kaiming_normal_, {}),
        ("kaiming_normal", {"mode": "fan_out", "nonlinearity": "relu"},
         torch.nn.init.kaiming_normal_, {"mode": "fan_out", "nonlinearity": "relu"}),
        ("kaiming_uniform", {"a": 0.2}, torch.nn.init.kaiming_uniform_, {"a": 0.2}),
        ("xavier_normal", {"gain": 2.0}, torch.nn.init.xavier_normal_, {"gain": 2.0}),
        ("xavier_uniform", {}, torch.nn.init.xavier_uniform_, {}),
        ("normal", {"mean": 0.5, "std": 0.02}, torch.nn.init.normal_, {"mean": 0.5, "std": 0.02}),
        ("uniform", {"a": -3.0, "b": 1.0}, torch.nn.init.uniform_, {"a": -3.0, "b": 1.0}),
        ("trunc_normal", {"std": 1.0, "a": -1.0, "b": 2.0}, torch.nn.init.trunc_normal_,
         {"std": 1.0, "a": -1.0, "b": 2.0}),
    ],
)
def test_statistics_match_torch_init(name: str, options: dict[str, Any],
                                     reference: Callable[..., torch.Tensor],
                                     ref_options: dict[str, Any]) -> None:
    ours = inits.INITIALIZERS[name](random.key(1), SHAPE, torch.float32, **options)
    ref = torch_reference(reference, **ref_options)
    assert ours.shape == SHAPE and ours.dtype == torch.float32
    std_scale = ref.std().item()
    assert abs(ours.mean().item() - ref.mean().item()) < 0.01 * std_scale + 1e-3 * abs(
        ref.mean().item()), f"{name}: mean {ours.mean().item()} vs torch {ref.mean().item()}"
    assert ours.std().item() == pytest.approx(std_scale, rel=0.02), f"{name}: std"
    q = torch.tensor([0.01, 0.25, 0.5, 0.75, 0.99])
    gap = (torch.quantile(ours.flatten(), q) - torch.quantile(ref.flatten(), q)).abs().max().item()
    assert gap < 0.04 * std_scale, f"{name}: quantiles differ from torch's by {gap}"


def test_kaiming_normal_std_formula() -> None:
    w = inits.kaiming_normal(random.key(0), (512, 256), torch.float32, nonlinearity="relu")
    assert w.std().item() == pytest.approx(math.sqrt(2.0 / 256), rel=0.02)


def test_uniform_families_stay_in_bounds() -> None:
    bound = 1.0 * math.sqrt(6.0 / (128 * 3 + 256 * 3))
    w = inits.xavier_uniform(random.key(2), SHAPE, torch.float32)
    assert w.abs().max().item() <= bound
    t = inits.trunc_normal(random.key(3), (10000,), torch.float32, mean=1.0, std=2.0, a=0.0, b=1.5)
    assert t.min().item() >= 0.0 and t.max().item() <= 1.5


@pytest.mark.parametrize("shape", [(8, 32), (32, 8), (6, 4, 3, 3)])
def test_orthogonal_rows_or_columns_are_orthonormal(shape: tuple[int, ...]) -> None:
    w = inits.orthogonal(random.key(4), shape, torch.float64, gain=2.0)
    flat = w.reshape(shape[0], -1)
    gram = flat @ flat.T if flat.shape[0] <= flat.shape[1] else flat.T @ flat
    torch.testing.assert_close(gram, 4.0 * torch.eye(gram.shape[0], dtype=torch.float64))


def test_constant_zeros_ones_exact() -> None:
    k = random.key(0)
    assert torch.equal(inits.constant(k, (2, 3), torch.float32, value=0.5), torch.full((2, 3), 0.5))
    assert torch.equal(inits.zeros(k, (4,), torch.float64), torch.zeros(4, dtype=torch.float64))
    assert torch.equal(inits.ones(k, (4,), torch.float32), torch.ones(4))


def test_pure_from_key() -> None:
    a = inits.kaiming_uniform(random.key(7), (16, 8), torch.float32)
    b = inits.kaiming_uniform(random.key(7), (16, 8), torch.float32)
    c = inits.kaiming_uniform(random.key(8), (16, 8), torch.float32)
    assert torch.equal(a, b), "same key must give the same tensor"
    assert not torch.equal(a, c), "different keys must give different tensors"


def _linear_config(init: dict[str, Any]) -> dict[str, Any]:
    return {"input_shape": [1, 64], "layers": [
        {"type": "linear", "params": {"out_features": 128}, "init": init},
        {"type": "linear", "params": {"out_features": 4}}]}


def test_config_spec_redraws_only_named_tensors() -> None:
    plain = build(_linear_config({})).model.init(random.key(0))[0]
    spec = {"weight": {"type": "kaiming_normal", "mode": "fan_out"}, "bias": "zeros"}
    params, _ = build(_linear_config(spec)).model.init(random.key(0))
    assert torch.equal(params["0.bias"], torch.zeros(128)), "bias spec is zeros"
    assert params["0.weight"].std().item() == pytest.approx(math.sqrt(2.0 / 128), rel=0.05)
    for name in ("1.weight", "1.bias"):
        assert torch.equal(params[name], plain[name]), f"{name} has no spec and must be unchanged"
    again, _ = build(_linear_config(spec)).model.init(random.key(0))
    assert all(torch.equal(again[n], params[n]) for n in params), "init must be pure in the key"


def test_top_level_glob_spec_and_constant() -> None:
    config = {**_linear_config({}), "init": {"*.bias": {"type": "constant", "value": 0.25}}}
    params, _ = build(config).model.init(random.key(3))
    assert torch.equal(params["0.bias"], torch.full((128,), 0.25))
    assert torch.equal(params["1.bias"], torch.full((4,), 0.25))


@pytest.mark.parametrize(
    ("init", "path"),
    [
        ({"bias": "kaiming_normal"}, "layers[0].init.bias"),
        ({"wieght": "zeros"}, "layers[0].init.wieght"),
        ({"weight": {"type": "normal", "sdt": 1.0}}, "layers[0].init.weight.sdt"),
        ({"weight": {"type": "kaiming_normal", "mode": "fan_middle"}},
         "layers[0].init.weight.mode"),
        ({"weight": {"type": "xavier"}}, "layers[0].init.weight.type"),
        ({"weight": {"type": "constant"}}, "layers[0].init.weight.value"),
        ({"weight": 3}, "layers[0].init.weight"),
        ("zeros", "layers[0].init"),
    ],
)
def test_bad_specs_name_their_path(init: Any, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        build(_linear_config(init))
    assert str(info.value).startswith(f"{path}:"), str(info.value)
