"""Every shipped reference config builds the model its code builds: the same param names, the
same params from the same key (where the config names the model's constructor), and the same
outputs for the same params."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

from funcgraph import random
from funcgraph.factory import check_model, load_model, shipped_configs
from funcgraph.model import Model


def _code(module: str, attr: str) -> Callable[..., Model]:
    return getattr(importlib.import_module(module), attr)


def _images(channels: int, size: int) -> torch.Tensor:
    return random.normal(random.key(9), (3, channels, size, size))


def _tokens() -> tuple[torch.Tensor, torch.Tensor]:
    tokens = random.randint(random.key(9), (3, 6), 1, 11)
    mask = torch.arange(6) < torch.tensor([[6], [3], [1]])
    return tokens * mask, mask


DARTS_V2 = {  # Liu et al. 2019, written out again here so the shipped config is checked
    "normal": [["sep_conv_3x3", 0], ["sep_conv_3x3", 1], ["sep_conv_3x3", 0], ["sep_conv_3x3", 1],
               ["sep_conv_3x3", 1], ["skip_connect", 0], ["skip_connect", 0], ["dil_conv_3x3", 2]],
    "normal_concat": [2, 3, 4, 5],
    "reduce": [["max_pool_3x3", 0], ["max_pool_3x3", 1], ["skip_connect", 2], ["max_pool_3x3", 1],
               ["max_pool_3x3", 0], ["skip_connect", 2], ["skip_connect", 2], ["max_pool_3x3", 1]],
    "reduce_concat": [2, 3, 4, 5],
}

def _darts_v2(**kwargs: Any) -> Model:
    from funcgraph import nas
    return nas.network_from_genotype(nas.Genotype.from_dict(DARTS_V2), **kwargs)


# (config, overrides, the model built in code, an input, same init from the same key)
Case = tuple[str, dict[str, str], Callable[[], Model], Callable[[], Any], bool]
CASES: list[Case] = [
    ("conv4", {"hidden": "8", "image_size": "12"},
     lambda: _code("funcgraph.models.conv4", "conv4")(5, hidden=8, image_size=12),
     lambda: _images(1, 12), True),
    ("conv4", {"variant": "pool", "hidden": "4", "image_size": "16", "ways": "3"},
     lambda: _code("funcgraph.models.conv4", "conv4")(3, hidden=4, image_size=16,
                                                      variant="pool"),
     lambda: _images(1, 16), True),
    ("conv4_layers", {"hidden": "8", "image_size": "12"},
     lambda: _code("funcgraph.models.conv4", "conv4")(5, hidden=8, image_size=12),
     lambda: _images(1, 12), False),
    ("mlp", {"hidden": "[7, 5]"}, lambda: _code("funcgraph.models.mlp", "mlp")(hidden=(7, 5)),
     lambda: random.normal(random.key(9), (4, 1)), True),
    ("mlp_layers", {}, lambda: _code("funcgraph.models.mlp", "mlp")(),
     lambda: random.normal(random.key(9), (4, 1)), False),
    ("resnet", {"depth": "8", "width": "4", "image_size": "8"},
     lambda: _code("funcgraph.models.resnet", "resnet")(8, width=4),
     lambda: _images(3, 8), True),
    ("early_exit_cnn", {"width": "4", "image_size": "8"},
     lambda: _code("funcgraph.models.early_exit", "early_exit_cnn")(width=4),
     lambda: _images(1, 8), True),
    ("darts_search", {"C": "2", "layers": "3", "image_size": "8", "num_classes": "3"},
     lambda: _code("funcgraph.nas", "search_network")(2, 3, 3),
     lambda: _images(1, 8), True),
    ("darts_network", {"C": "2", "layers": "3", "image_size": "8", "num_classes": "3"},
     lambda: _darts_v2(C=2, layers=3, num_classes=3), lambda: _images(1, 8), True),
    ("rnn_classifier", {"hidden_size": "8", "embed_dim": "4", "seq_len": "6"},
     lambda: _code("funcgraph.models.rnn", "rnn_classifier")(hidden_size=8, embed_dim=4),
     _tokens, True),
]


def _assert_same(a: Any, b: Any, what: str) -> None:
    if isinstance(a, tuple):
        assert type(a) is type(b) and len(a) == len(b), what
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            _assert_same(u, v, f"{what}[{i}]")
    else:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=what)


@pytest.mark.parametrize(("name", "overrides", "code", "make_input", "same_init"),
                         CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_shipped_config_equals_code_model(name: str, overrides: dict[str, str],
                                          code: Callable[[], Model],
                                          make_input: Callable[[], Any], same_init: bool) -> None:
    reference = code()
    model = load_model(name, overrides)
    p_ref, s_ref = reference.init(random.key(3))
    p_cfg, s_cfg = model.init(random.key(3))
    assert list(p_cfg) == list(p_ref), f"{name}: param names differ"
    assert list(s_cfg) == list(s_ref), f"{name}: state names differ"
    if same_init:
        for n in p_ref:
            assert torch.equal(p_cfg[n], p_ref[n]), f"{name}: {n} differs for the same key"
    x = make_input()
    for train in (False, True):
        key = random.key(4) if train else None
        y_ref, _ = reference.apply(p_ref, s_ref, x, key=key, train=train)
        y_cfg, _ = model.apply(p_ref, s_ref, x, key=key, train=train)
        _assert_same(y_cfg, y_ref, f"{name} (train={train})")


@pytest.mark.parametrize("name", sorted(shipped_configs()))
def test_every_shipped_config_checks_with_defaults(name: str) -> None:
    built = check_model(name)
    assert built.total_params > 0 and built.output_shape is not None
    assert built.model.meta["config"]["name"] == name


def test_every_shipped_config_has_an_equality_case() -> None:
    covered = {c[0] for c in CASES}
    missing = set(shipped_configs()) - covered
    assert not missing, f"shipped configs without a code-equality test: {sorted(missing)}"


def test_reference_modules_register_lazily() -> None:
    for module in ("funcgraph.models.conv4", "funcgraph.nn.recurrent"):
        importlib.import_module(module)  # present in this tree; the names must resolve
    assert check_model("conv4", {"ways": "2", "hidden": "4"}).output_shape == (1, 2)
