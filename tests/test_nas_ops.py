"""DARTS ops and the mixed op: shapes, torch references, one-hot weights, partial channels."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from funcgraph import random
from funcgraph.errors import ShapeError
from funcgraph.nas import OPS, PRIMITIVES, channel_shuffle, make_op, mixed_op
from funcgraph.nas.mixed import search_op
from funcgraph.nas.ops import avg_pool_3x3, max_pool_3x3

C = 4


def _x(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return random.normal(random.key(seed), shape)


@pytest.mark.parametrize("name", PRIMITIVES)
@pytest.mark.parametrize("stride", [1, 2])
def test_every_op_keeps_shape_at_stride_1_and_halves_at_stride_2(name: str, stride: int) -> None:
    for affine in (True, False):
        op = make_op(name, C, stride, affine=affine)
        params, state = op.init(random.key(1))
        y, _ = op.apply(params, state, _x((2, C, 8, 8)), train=True)
        assert y.shape == (2, C, 8 // stride, 8 // stride), f"{name} stride {stride}: {y.shape}"


def test_search_ops_use_non_affine_batch_norm() -> None:
    for name in PRIMITIVES:
        params, _ = search_op(name, C, 1).init(random.key(0))
        assert all("weight" in n and params[n].dim() == 4 for n in params), (
            f"{name}: only conv weights expected in search mode, got {sorted(params)}"
        )


# --- torch references: the DARTS modules, named as in the original operations.py ---------

def _sep_conv_ref(k: int, stride: int, pad: int, affine: bool) -> nn.Module:
    class SepConv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.op = nn.Sequential(
                nn.ReLU(), nn.Conv2d(C, C, k, stride, pad, groups=C, bias=False),
                nn.Conv2d(C, C, 1, bias=False), nn.BatchNorm2d(C, affine=affine),
                nn.ReLU(), nn.Conv2d(C, C, k, 1, pad, groups=C, bias=False),
                nn.Conv2d(C, C, 1, bias=False), nn.BatchNorm2d(C, affine=affine))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.op(x)

    return SepConv()


def _dil_conv_ref(k: int, stride: int, pad: int, affine: bool) -> nn.Module:
    class DilConv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.op = nn.Sequential(
                nn.ReLU(), nn.Conv2d(C, C, k, stride, pad, dilation=2, groups=C, bias=False),
                nn.Conv2d(C, C, 1, bias=False), nn.BatchNorm2d(C, affine=affine))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.op(x)

    return DilConv()


class _FactorizedReduceRef(nn.Module):
    def __init__(self, affine: bool) -> None:
        super().__init__()
        self.conv_1 = nn.Conv2d(C, C // 2, 1, stride=2, bias=False)
        self.conv_2 = nn.Conv2d(C, C // 2, 1, stride=2, bias=False)
        self.bn = nn.BatchNorm2d(C, affine=affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(x)
        return self.bn(torch.cat([self.conv_1(x), self.conv_2(x[:, :, 1:, 1:])], dim=1))


REFERENCES = {
    ("sep_conv_3x3", 1): lambda a: _sep_conv_ref(3, 1, 1, a),
    ("sep_conv_5x5", 2): lambda a: _sep_conv_ref(5, 2, 2, a),
    ("dil_conv_3x3", 2): lambda a: _dil_conv_ref(3, 2, 2, a),
    ("dil_conv_5x5", 1): lambda a: _dil_conv_ref(5, 1, 4, a),
    ("skip_connect", 2): _FactorizedReduceRef,
}


@pytest.mark.parametrize("name,stride", sorted(REFERENCES))
@pytest.mark.parametrize("affine", [True, False])
def test_ops_equal_the_darts_torch_modules(name: str, stride: int, affine: bool) -> None:
    op = make_op(name, C, stride, affine=affine)
    params, state = op.init(random.key(2))
    ref = REFERENCES[(name, stride)](affine)
    ref.load_state_dict({**params, **state}, strict=True)  # same names, same shapes
    x = _x((3, C, 8, 8), 3)
    y, new_state = op.apply(params, state, x, train=True)
    ref.train()
    torch.testing.assert_close(y, ref(x), msg=f"{name}: output differs from the torch module")
    for n, t in ref.state_dict().items():
        if "running" in n:
            torch.testing.assert_close(new_state[n], t, msg=f"{name}: running stat {n}")


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("size", [8, 7])
def test_pools_equal_torch_kernels(stride: int, size: int) -> None:
    x = _x((2, 3, size, size), 4)
    got_max, _ = max_pool_3x3(stride).apply({}, {}, x)
    got_avg, _ = avg_pool_3x3(stride).apply({}, {}, x)
    torch.testing.assert_close(got_max, F.max_pool2d(x, 3, stride, 1))
    torch.testing.assert_close(got_avg, F.avg_pool2d(x, 3, stride, 1, count_include_pad=False))


def test_factorized_reduce_rejects_odd_sizes() -> None:
    op = make_op("skip_connect", C, 2)
    params, state = op.init(random.key(0))
    with pytest.raises(ShapeError, match="divisible by 4"):
        op.apply(params, state, _x((2, C, 7, 7)), train=True)


def test_unknown_op_names_the_choices() -> None:
    with pytest.raises(ValueError, match="sep_conv_3x3"):
        make_op("conv_7x7", C, 1)


# --- mixed op ----------------------------------------------------------------------------

@given(st.integers(0, len(PRIMITIVES) - 1), st.sampled_from([1, 2]))
def test_one_hot_alpha_mixed_op_equals_the_single_op(k: int, stride: int) -> None:
    mixed = mixed_op(C, stride)
    params, state = mixed.init(random.key(5))
    logits = torch.zeros(len(PRIMITIVES))
    logits[k] = 40.0  # softmax is one-hot to float32 precision
    weights = torch.softmax(logits, -1)
    assert float(weights.sum()) == pytest.approx(1.0, abs=1e-6), "weights must sum to one"
    x = _x((2, C, 8, 8), k)
    y, _ = mixed.apply(params, state, (x, weights), train=True)
    single = search_op(PRIMITIVES[k], C, stride)
    prefix = f"ops.{k}."
    own = {n[len(prefix):]: t for n, t in params.items() if n.startswith(prefix)}
    own_state = {n[len(prefix):]: t for n, t in state.items() if n.startswith(prefix)}
    expected, _ = single.apply(own, own_state, x, train=True)
    torch.testing.assert_close(y, expected, msg=f"one-hot on {PRIMITIVES[k]}")


def test_mixed_op_is_the_weighted_sum_of_its_ops() -> None:
    mixed = mixed_op(C, 1)
    params, state = mixed.init(random.key(6))
    x = _x((2, C, 8, 8), 7)
    weights = torch.softmax(_x((len(PRIMITIVES),), 8), -1)
    y, _ = mixed.apply(params, state, (x, weights), train=True)
    expected = torch.zeros_like(x)
    for k, name in enumerate(PRIMITIVES):
        p = {n.split(".", 2)[2]: t for n, t in params.items() if n.startswith(f"ops.{k}.")}
        s = {n.split(".", 2)[2]: t for n, t in state.items() if n.startswith(f"ops.{k}.")}
        out, _ = search_op(name, C, 1).apply(p, s, x, train=True)
        expected = expected + weights[k] * out
    torch.testing.assert_close(y, expected)


@pytest.mark.parametrize("stride", [1, 2])
def test_partial_channels_runs_ops_on_a_quarter_and_shuffles(stride: int) -> None:
    c, k = 8, 4
    mixed = mixed_op(c, stride, partial_channels=k)
    params, state = mixed.init(random.key(9))
    assert params["ops.4.op.1.weight"].shape == (c // k, 1, 3, 3), "ops are built on C/k channels"
    x = _x((2, c, 8, 8), 10)
    weights = torch.softmax(_x((len(PRIMITIVES),), 11), -1)
    y, _ = mixed.apply(params, state, (x, weights), train=True)
    assert y.shape == (2, c, 8 // stride, 8 // stride)
    plain = mixed_op(c // k, stride)  # the same ops as a plain mixed op on the active part
    active, _ = plain.apply(params, state, (x[:, : c // k], weights), train=True)
    rest = x[:, c // k:] if stride == 1 else F.max_pool2d(x[:, c // k:], 2, 2)
    torch.testing.assert_close(y, channel_shuffle(torch.cat([active, rest], 1), k))


def test_channel_shuffle_interleaves_groups() -> None:
    x = torch.arange(8.0).reshape(1, 8, 1, 1)
    assert channel_shuffle(x, 4).flatten().tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


def test_mixed_op_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="partial_channels"):
        mixed_op(6, 1, partial_channels=4)
    mixed = mixed_op(C, 1)
    params, state = mixed.init(random.key(0))
    with pytest.raises(ShapeError, match="mixed_op"):
        mixed.apply(params, state, (_x((2, C + 1, 8, 8)), torch.ones(8) / 8))
    with pytest.raises(ShapeError, match="weights"):
        mixed.apply(params, state, (_x((2, C, 8, 8)), torch.ones(5) / 5))


def test_ops_table_covers_the_search_space() -> None:
    assert set(OPS) == set(PRIMITIVES) and len(PRIMITIVES) == 8
