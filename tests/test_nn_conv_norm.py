"""The fused convolution + batch norm against the unfused pair it replaces.

The reference is ``serial({"conv": conv2d, "norm": batch_norm})`` with the same params: the
fused layer must give its outputs, running statistics, gradients and second-order gradients
(what MAML differentiates), in and out of ``vmap``, in float64.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from funcgraph import nn, random
from funcgraph.errors import ShapeError
from funcgraph.model import Model
from funcgraph.params import Params

DT = torch.float64


def pair(in_channels: int, out_channels: int, **kw: object) -> tuple[Model, Model]:
    """``(fused, unfused reference)`` with the same hyperparameters."""
    conv_kw = {k: kw.pop(k) for k in ("stride", "padding") if k in kw}
    fused = nn.conv_batch_norm(in_channels, out_channels, 3, dtype=DT, **conv_kw, **kw)  # type: ignore[arg-type]
    unfused = nn.serial({
        "conv": nn.conv2d(in_channels, out_channels, 3, dtype=DT, **conv_kw),  # type: ignore[arg-type]
        "norm": nn.batch_norm(out_channels, dtype=DT, **kw),  # type: ignore[arg-type]
    })
    return fused, unfused


def random_params(model: Model, seed: int) -> tuple[Params, Params]:
    """Params and state moved off their defaults (ones, zeros), so every term matters."""
    params, state = model.init(random.key(seed))
    noise = random.split(random.key(seed + 1), len(params))
    params = {n: p + 0.5 * random.normal(k, p.shape, dtype=DT)
              for (n, p), k in zip(params.items(), noise, strict=True)}
    if "norm.running_var" in state:
        state = {**state, "norm.running_mean": state["norm.running_mean"] + 0.3,
                 "norm.running_var": state["norm.running_var"] * 2.0}
    return params, state


def second_order(model: Model, params: Params, state: Params, x: Tensor,
                 train: bool) -> Params:
    """The gradient of a gradient's squared norm: MAML's kind of second-order quantity."""

    def inner_norm(p: Params) -> Tensor:
        g = torch.func.grad(lambda q: model.apply(q, state, x, train=train)[0].sin().sum())(p)
        return sum((v**2).sum() for v in g.values())  # type: ignore[return-value]

    return torch.func.grad(inner_norm)(params)


def assert_close(got: Tensor, want: Tensor, what: str) -> None:
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=lambda m: f"{what}: {m}")


@given(batch=st.integers(2, 4), size=st.integers(3, 9), in_channels=st.sampled_from([1, 3]),
       stride=st.integers(1, 2), padding=st.integers(0, 1),
       running=st.sampled_from([(False, False), (True, True), (True, False)]),
       seed=st.integers(0, 2**16))
def test_fused_equals_conv_then_batch_norm(batch: int, size: int, in_channels: int,
                                           stride: int, padding: int,
                                           running: tuple[bool, bool], seed: int) -> None:
    track, train = running
    out_channels = 2 * 9 * in_channels  # the narrowest patches that fuse
    fused, unfused = pair(in_channels, out_channels, stride=stride, padding=padding,
                          track_running_stats=track)
    assert fused.meta["fused"], "this width should take the fused path"
    params, state = random_params(fused, seed)
    x = random.uniform(random.key(seed + 2), (batch, in_channels, size, size), dtype=DT) * 3
    y, new_state = fused.apply(params, state, x, train=train)
    y_ref, state_ref = unfused.apply(params, state, x, train=train)
    assert_close(y, y_ref, "output")
    assert set(new_state) == set(state_ref), "same state names"
    for n in state_ref:
        assert_close(new_state[n].to(DT), state_ref[n].to(DT), f"state {n}")
    got = second_order(fused, params, state, x, train)
    want = second_order(unfused, params, state, x, train)
    batch_stats = train or not track  # the conv bias then cancels: rounding noise in the pair
    for n in want:
        if not (batch_stats and n == "conv.bias"):
            assert_close(got[n], want[n], f"second order {n}")
    if batch_stats:
        assert got["conv.bias"].abs().max() <= 1e-9 * want["conv.weight"].abs().max()
        assert want["conv.bias"].abs().max() <= 1e-9 * want["conv.weight"].abs().max()


def test_fused_first_order_gradients_equal_the_pair_and_the_bias_gets_exactly_zero() -> None:
    fused, unfused = pair(1, 32, padding=1, track_running_stats=False)
    params, state = random_params(fused, 3)
    x = random.uniform(random.key(4), (5, 1, 8, 8), dtype=DT)

    def grads(model: Model) -> Params:
        return torch.func.grad(lambda p: model.apply(p, state, x)[0].square().sum())(params)

    got, want = grads(fused), grads(unfused)
    for n in ("conv.weight", "norm.weight", "norm.bias"):
        assert_close(got[n], want[n], n)
    assert torch.equal(got["conv.bias"], torch.zeros(32, dtype=DT)), (
        "the conv bias cancels in the normalisation: its gradient is exactly zero")


def test_fused_under_vmap_equals_a_loop_at_second_order() -> None:
    fused, _ = pair(1, 20, padding=1, track_running_stats=False)
    params, state = random_params(fused, 5)
    xs = random.normal(random.key(6), (3, 4, 1, 6, 6), dtype=DT)

    def per_task(x: Tensor) -> Params:
        return second_order(fused, params, state, x, False)

    batched = torch.func.vmap(per_task)(xs)
    for t in range(xs.shape[0]):
        looped = per_task(xs[t])
        for n in looped:
            assert_close(batched[n][t], looped[n], f"task {t} {n}")


def test_patch_moments_are_the_statistics_of_any_convolution() -> None:
    x = random.uniform(random.key(7), (3, 2, 7, 9), dtype=DT)
    w = random.normal(random.key(8), (5, 2, 3, 3), dtype=DT)
    mean, cov, count = nn.patch_moments(x, (3, 3), stride=(2, 1), padding=(1, 0))
    z = F.conv2d(x, w, stride=(2, 1), padding=(1, 0))  # (3, 5, 4, 7)
    assert count == 3 * 4 * 7
    flat = w.reshape(5, -1)
    assert_close(flat @ mean, z.mean(dim=(0, 2, 3)), "mean")
    assert_close(((flat @ cov) * flat).sum(1), z.var(dim=(0, 2, 3), unbiased=False), "variance")


def test_wide_patches_and_running_statistics_in_evaluation_take_the_unfused_pair() -> None:
    wide, wide_ref = pair(8, 16, padding=1)
    assert not wide.meta["fused"], "72-value patches are wider than half of 16 outputs"
    params, state = random_params(wide, 9)
    x = random.normal(random.key(10), (2, 8, 5, 5), dtype=DT)
    assert_close(wide.apply(params, state, x, train=True)[0],
                 wide_ref.apply(params, state, x, train=True)[0], "wide")
    fused, unfused = pair(1, 18, padding=1)
    params, state = random_params(fused, 11)
    x = random.normal(random.key(12), (2, 1, 5, 5), dtype=DT)
    assert_close(fused.apply(params, state, x)[0], unfused.apply(params, state, x)[0],
                 "evaluation with running statistics")


@pytest.mark.parametrize("track", [True, False])
def test_fused_rejects_what_the_pair_rejects(track: bool) -> None:
    fused, _ = pair(1, 18, track_running_stats=track)
    params, state = fused.init(random.key(0))
    with pytest.raises(ShapeError, match="more than one value per channel"):
        fused.apply(params, state, torch.ones(1, 1, 3, 3, dtype=DT), train=True)
    with pytest.raises(ShapeError, match=r"conv_batch_norm: expected input \(B, 1, H, W\), "
                                         r"got \(2, 2, 5, 5\)"):
        fused.apply(params, state, torch.ones(2, 2, 5, 5, dtype=DT), train=True)
