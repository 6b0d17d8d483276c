"""Device resolution and placement plans: equal outputs and gradients to the single-device run,
activations moved between stages, clear errors for bad devices and plans."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import funcgraph
from funcgraph import nn as fnn
from funcgraph import random
from funcgraph.errors import ConfigError, DeviceError
from funcgraph.placement import (
    PlacementPlan,
    check_plan,
    parse_plan,
    place,
    placed,
    resolve_device,
)

CPU, META = torch.device("cpu"), torch.device("meta")


@pytest.mark.parametrize("spec", ["cpu", "CPU", " cpu ", CPU])
def test_cpu_spellings(spec: str | torch.device) -> None:
    assert resolve_device(spec) == CPU


def test_auto_prefers_cuda_then_mps_then_cpu() -> None:
    if torch.cuda.is_available():
        expected = torch.device("cuda", torch.cuda.current_device())
    elif torch.backends.mps.is_available():
        expected = torch.device("mps")
    else:
        expected = CPU
    assert resolve_device("auto") == expected


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "cpu:0", "cuda:-1", "", "cuda:0:1", "tpu"])
def test_malformed_device_strings(spec: str) -> None:
    with pytest.raises(DeviceError, match="expected auto, cpu, cuda, cuda:N or mps"):
        resolve_device(spec)


@given(st.text(max_size=8))
def test_any_string_resolves_or_raises_device_error(spec: str) -> None:
    try:
        device = resolve_device(spec)
    except DeviceError as e:
        assert "device" in str(e)
    else:
        assert isinstance(device, torch.device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:3"])
def test_absent_cuda_is_a_device_error(spec: str) -> None:
    with pytest.raises(DeviceError, match="CUDA is not available"):
        resolve_device(spec)


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="needs a machine without MPS")
def test_absent_mps_is_a_device_error() -> None:
    with pytest.raises(DeviceError, match="mps"):
        resolve_device("mps")


@pytest.mark.parametrize(("plan", "message"), [
    ("", "expected PREFIX=DEVICE"),
    ("layer1", "entry 1 'layer1': expected PREFIX=DEVICE"),
    ("layer1=cpu,=cpu", "entry 2"),
    ("layer1=", "entry 1"),
    ("a=cpu,a=cpu", "given twice"),
    ("a=tpu", "entry 1 'a=tpu': device: expected"),
])
def test_bad_plans(plan: str, message: str) -> None:
    with pytest.raises(DeviceError, match=message):
        parse_plan(plan)


def net() -> funcgraph.Model:
    """stem -> layer1 (conv, bn, relu) -> layer2 (residual conv) -> pool -> fc."""
    return fnn.serial({
        "stem": fnn.conv2d(1, 4, 3, padding=1),
        "layer1": fnn.serial({"conv": fnn.conv2d(4, 4, 3, padding=1), "bn": fnn.batch_norm(4),
                              "act": fnn.relu()}),
        "layer2": fnn.residual(fnn.conv2d(4, 4, 3, padding=1)),
        "pool": fnn.adaptive_avg_pool2d(1), "flat": fnn.flatten(), "fc": fnn.linear(4, 3),
    })


def test_plan_validation_names_unknown_prefixes_and_unplaced_params() -> None:
    params, _ = net().init(random.key(0))
    with pytest.raises(DeviceError, match=r"'layer3' matches no parameter.*'layer1', 'layer2'"):
        check_plan("layer1=cpu,layer3=cpu,*=cpu", params)
    with pytest.raises(DeviceError, match="no plan entry matches 'stem.weight'"):
        place(params, "layer1=cpu,layer2=cpu")
    assert check_plan("layer1=cpu,*=cpu", params).device_of("stem.weight") == CPU
    _, state = net().init(random.key(0))
    with pytest.raises(DeviceError, match="'stem' matches no parameter"):
        place(state, "stem=cpu,*=cpu")
    assert set(place(state, "stem=cpu,*=cpu", partial=True)) == set(state)


def test_longest_prefix_wins_and_default_catches_the_rest() -> None:
    plan = PlacementPlan((("layer1", CPU), ("layer1.bn", META)), default=CPU)
    assert plan.device_of("layer1.bn.weight") == META
    assert plan.device_of("layer1.bnx.weight") == CPU, "prefixes match whole name components"
    assert plan.device_of("layer1.conv.weight") == CPU
    assert plan.devices() == [CPU, META]


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_multi_stage_cpu_plan_equals_single_device(micro_batches: int) -> None:
    model = net()
    params, state = model.init(random.key(0))
    state = {n: t + 0.5 if t.is_floating_point() else t for n, t in state.items()}
    x = random.normal(random.key(1), (6, 1, 5, 5))
    plan = "stem=cpu,layer1=cpu,layer2=cpu,*=cpu"
    f = funcgraph.bind(model, state)
    g = placed(f, plan, micro_batches=micro_batches)
    placed_params = place(params, plan)
    torch.testing.assert_close(g(placed_params, x), f(params, x))

    def loss(run: object, p: dict[str, torch.Tensor]) -> torch.Tensor:
        return run(p, x).square().sum()  # type: ignore[operator]

    grads = torch.func.grad(lambda p: loss(g, p))(placed_params)
    ref = torch.func.grad(lambda p: loss(f, p))(params)
    assert set(grads) == set(ref)
    for n in ref:
        torch.testing.assert_close(grads[n], ref[n], msg=f"gradient of {n}")


def test_activations_follow_params_across_devices() -> None:
    """CPU stand-in for two GPUs: layer2 and fc on the meta device. The activation must move
    from cpu to meta at layer2 (a mixed-device op fails without the move)."""
    model = net()
    params, state = model.init(random.key(0))
    plan = PlacementPlan((("stem", CPU), ("layer1", CPU), ("layer2", META)), default=META)
    p, s = place(params, plan), place(state, plan, partial=True)
    x = random.normal(random.key(1), (4, 1, 5, 5))
    f = funcgraph.bind(model, s)
    with pytest.raises(RuntimeError):
        f(p, x)
    for micro_batches in (1, 2):
        y = placed(f, plan, micro_batches=micro_batches)(p, x)
        assert y.device == META and y.shape == (4, 3)


def test_placed_checks_params_and_micro_batches() -> None:
    model = net()
    params, state = model.init(random.key(0))
    plan = PlacementPlan((("layer2", META),), default=CPU)
    f = funcgraph.bind(model, state)
    x = torch.ones(2, 1, 5, 5)
    with pytest.raises(DeviceError, match="not on their planned devices"):
        placed(f, plan)(params, x)
    with pytest.raises(ConfigError, match="exceeds the batch size 2"):
        placed(f, "*=cpu", micro_batches=3)(params, x)
    with pytest.raises(ConfigError, match="micro_batches must be >= 1"):
        placed(f, "*=cpu", micro_batches=0)


def test_cpu_threads_sets_the_count_for_the_block_and_restores_it() -> None:
    from funcgraph.placement import cpu_threads

    before = torch.get_num_threads()
    with cpu_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="inside"), cpu_threads(2):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before, "restored when the block raises"
    with cpu_threads(0):
        assert torch.get_num_threads() == before, "0 keeps the count"
    with pytest.raises(ConfigError, match="cpu_threads: threads must be an int >= 0, got -1"):
        with cpu_threads(-1):
            pass
