"""``from_module(m).init(key)`` draws from the key as the module's own ``reset_parameters``.

Same key, same params; different keys, different params; ``init(key(s))`` equals the module
built after ``torch.manual_seed(s)``; torch's global generator is left as it was; parameters
no reset covers keep the module's values; ``init="copy"`` keeps them all.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import funcgraph as fg
from funcgraph.errors import ArgumentTypeError, ConfigError, KeyTypeError


def _net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(27, 4))


class _Scaled(nn.Module):
    """A raw parameter on the top module, which no reset_parameters covers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.scale = nn.Parameter(torch.full((2,), 3.0))

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x) * self.scale


def _equal(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_same_key_same_params_and_different_keys_differ() -> None:
    model = fg.from_module(_net())
    keys = fg.random.split(fg.random.key(0), 5)
    inits = [model.init(k)[0] for k in keys]
    assert _equal(inits[0], model.init(keys[0])[0]), "the same key gave different params"
    for i in range(len(inits)):
        for j in range(i):
            for n in inits[i]:
                if n.endswith("weight") and n != "1.weight":  # BatchNorm's weight is ones
                    assert not torch.equal(inits[i][n], inits[j][n]), (
                        f"keys {j} and {i} gave the same {n}")


@pytest.mark.parametrize("seed", [0, 1, 2**40 + 3])
def test_init_equals_the_module_built_after_manual_seed(seed: int) -> None:
    """reset_parameters run children first reproduce the constructors' draws, including
    nn.MultiheadAttention's private reset."""

    def build() -> nn.Module:
        return nn.ModuleDict({"net": _net(), "attn": nn.MultiheadAttention(4, 2)})

    model = fg.from_module(build())
    params, state = model.init(fg.random.key(seed))
    torch.manual_seed(seed)
    reference = build()
    want = {n: p.detach() for n, p in reference.named_parameters()}
    assert _equal(params, want), "init(key(s)) != the module built after manual_seed(s)"
    assert _equal(state, {n: b for n, b in reference.named_buffers()})


def test_init_leaves_torch_global_generator_unchanged() -> None:
    model = fg.from_module(_net())
    torch.manual_seed(123)
    before = torch.get_rng_state()
    model.init(fg.random.key(5))
    assert torch.equal(torch.get_rng_state(), before), "init changed torch's global generator"


def test_uncovered_parameters_keep_the_module_values() -> None:
    module = _Scaled()
    with torch.no_grad():
        module.scale.copy_(torch.tensor([2.0, -1.0]))
    model = fg.from_module(module)
    a, _ = model.init(fg.random.key(0))
    b, _ = model.init(fg.random.key(1))
    assert torch.equal(a["scale"], module.scale.detach()) and torch.equal(b["scale"], a["scale"])
    assert not torch.equal(a["fc.weight"], b["fc.weight"]), "covered params follow the key"


def test_init_never_changes_the_module() -> None:
    module = _net()
    before = {n: t.detach().clone() for n, t in module.state_dict().items()}
    fg.from_module(module).init(fg.random.key(9))
    assert _equal(before, {n: t.detach() for n, t in module.state_dict().items()})


def test_copy_init_keeps_the_module_values_for_every_key() -> None:
    module = _net()
    model = fg.from_module(module, init="copy")
    want = {n: p.detach() for n, p in module.named_parameters()}
    for seed in (0, 1):
        params, _ = model.init(fg.random.key(seed))
        assert _equal(params, want)


def test_init_keeps_dtype_and_tied_weights() -> None:
    module = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5)).double()
    module[1].weight = module[0].weight
    params, _ = fg.from_module(module).init(fg.random.key(0))
    assert set(params) == {"0.weight", "1.bias"} and params["0.weight"].dtype == torch.float64


def test_bad_arguments_are_funcgraph_errors() -> None:
    with pytest.raises(ArgumentTypeError, match="^from_module: module must be a torch.nn.Module, "
                                                "got function"):
        fg.from_module(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^from_module: init must be one of \('reset', "
                                          r"'copy'\), got 'random'"):
        fg.from_module(_net(), init="random")
    with pytest.raises(KeyTypeError, match="^Model.init of 'Sequential': key must be a funcgraph "
                                           "key.*got int 3.*funcgraph.random.key"):
        fg.from_module(_net()).init(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cannot run under vmap over keys"):
        torch.func.vmap(fg.from_module(_net()).init)(fg.random.split(fg.random.key(0), 2))
