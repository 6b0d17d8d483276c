"""Stochastic depth: plain residual at p=0, eval = expectation of train, skipped bodies, vmap."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from funcgraph import nn, random
from funcgraph.errors import ConfigError, KeyMissingError
from funcgraph.model import Model
from funcgraph.models.resnet import resnet
from funcgraph.nn.stochastic_depth import (
    Warmup,
    blocks_ran,
    linear_decay,
    ran_metrics,
    stochastic_depth,
)
from funcgraph.params import Params, State, select

modes = st.sampled_from(["batch", "row"])


def dense_body(features: int = 4) -> Model:
    return nn.serial({"fc": nn.linear(features, features, dtype=torch.float64),
                      "act": nn.tanh()})


def counting(model: Model) -> tuple[Model, list[int]]:
    """``model`` with a call counter (the list's length)."""
    calls: list[int] = []

    def apply(params: Params, state: State, x: Any, *, key: Any = None,
              train: bool = False) -> tuple[Any, State]:
        calls.append(1)
        return model.apply(params, state, x, key=key, train=train)

    return Model(model.init, apply, model.name), calls


def test_linear_decay_is_the_papers_rule() -> None:
    probs = linear_decay(4, 0.5)
    # The paper: survival p_l = 1 - l/L (1 - p_L) with p_L = 0.5.
    survival = [1 - l / 4 * (1 - 0.5) for l in range(1, 5)]
    assert probs == pytest.approx([1 - s for s in survival])
    with pytest.raises(ConfigError):
        linear_decay(0)
    with pytest.raises(ConfigError):
        linear_decay(3, 1.0)


@settings(max_examples=6)
@given(mode=modes, seed=st.integers(0, 2**31))
def test_zero_drop_prob_is_the_plain_residual_block(mode: str, seed: int) -> None:
    body = nn.serial({"conv": nn.conv2d(2, 2, 3, padding=1), "bn": nn.batch_norm(2)})
    block = stochastic_depth(body, 0.0, post=nn.relu(), mode=mode)  # type: ignore[arg-type]
    plain = nn.residual(body)
    params, state = block.init(random.key(seed))
    x = random.normal(random.key(seed + 1), (3, 2, 5, 5))
    for train in (True, False):
        y, new_state = block.apply(params, state, x, key=random.key(seed + 2), train=train)
        y_ref, ref_state = plain.apply(select(params, "body", strip=False), {
            n: t for n, t in state.items() if n.startswith("body.")}, x, train=train)
        torch.testing.assert_close(y, F.relu(y_ref), msg=f"p=0 differs (train={train})")
        for n, t in ref_state.items():
            torch.testing.assert_close(new_state[n], t, msg=f"state {n} differs")
        assert float(new_state["ran"]) == 1.0


def reference_resnet8(params: Params, state: State, x: Tensor) -> Tensor:
    """ResNet-8 in evaluation mode written out with torch.nn.functional."""

    def bn(h: Tensor, name: str) -> Tensor:
        return F.batch_norm(h, state[f"{name}.running_mean"], state[f"{name}.running_var"],
                            params[f"{name}.weight"], params[f"{name}.bias"], False, 0.0, 1e-5)

    h = F.relu(bn(F.conv2d(x, params["conv1.weight"], padding=1), "bn1"))
    for stage, stride in (("layer1", 1), ("layer2", 2), ("layer3", 2)):
        b = f"{stage}.0.body"
        out = F.relu(bn(F.conv2d(h, params[f"{b}.conv1.weight"], stride=stride, padding=1),
                        f"{b}.bn1"))
        out = bn(F.conv2d(out, params[f"{b}.conv2.weight"], padding=1), f"{b}.bn2")
        skip = h
        if stride == 2:
            extra = out.shape[1] - h.shape[1]
            skip = F.pad(h[:, :, ::2, ::2], (0, 0, 0, 0, extra // 2, extra - extra // 2))
        h = F.relu(out + skip)
    return F.linear(h.mean((2, 3)), params["fc.weight"], params["fc.bias"])


def test_resnet_evaluation_matches_functional_reference_and_is_deterministic() -> None:
    model = resnet(8, num_classes=3, in_channels=1, width=4)
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (2, 1, 8, 8))
    # One training step so the running statistics are not the identity.
    _, state = model.apply(params, state, x, key=random.key(2), train=True)
    y1, _ = model.apply(params, state, x)
    y2, _ = model.apply(params, state, x, key=random.key(9))
    torch.testing.assert_close(y1, y2, rtol=0, atol=0, msg="evaluation must not depend on keys")
    torch.testing.assert_close(y1, reference_resnet8(params, state, x))


def test_resnet_with_zero_drop_ignores_the_key() -> None:
    model = resnet(8, num_classes=3, in_channels=1, width=4, final_drop_prob=0.0)
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (2, 1, 8, 8))
    y1, s1 = model.apply(params, state, x, key=random.key(3), train=True)
    y2, _ = model.apply(params, state, x, key=random.key(4), train=True)
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    assert ran_metrics(s1) == {"blocks_ran": 3.0, "blocks": 3}
    with pytest.raises(ConfigError, match="6n"):
        resnet(21)


def _mc_check(model: Model, params: Params, state: State, x: Tensor, n: int) -> None:
    """Mean of training outputs over ``n`` keys equals evaluation within 5 standard errors."""
    keys = random.split(random.key(123), n)
    ys, _ = torch.func.vmap(lambda k: model.apply(params, state, x, key=k, train=True))(keys)
    y_eval, _ = model.apply(params, state, x)
    mean, sem = ys.mean(0), ys.std(0) / math.sqrt(n)
    err = (mean - y_eval).abs()
    assert bool((err <= 5 * sem + 1e-9).all()), f"MC mean off by {err.max()} (sem {sem.max()})"


@given(drop_prob=st.floats(0.05, 0.9), mode=modes)
def test_training_mean_over_keys_equals_evaluation(drop_prob: float, mode: str) -> None:
    block = stochastic_depth(dense_body(), drop_prob, mode=mode)  # type: ignore[arg-type]
    params, state = block.init(random.key(0))
    x = random.normal(random.key(1), (3, 4), dtype=torch.float64)
    _mc_check(block, params, state, x, 2000)


def test_training_mean_of_a_linear_stack_equals_evaluation() -> None:
    # Linear bodies: the output is multilinear in the independent masks, so E[train] = eval.
    blocks = {str(i): stochastic_depth(nn.linear(4, 4, dtype=torch.float64), p)
              for i, p in enumerate(linear_decay(4, 0.5))}
    stack = nn.serial(blocks)
    params, state = stack.init(random.key(0))
    x = random.normal(random.key(1), (2, 4), dtype=torch.float64)
    _mc_check(stack, params, state, x, 4000)


def test_batch_mode_never_calls_a_dropped_body() -> None:
    body, calls = counting(dense_body())
    block = stochastic_depth(body, 0.5, mode="batch")
    params, state = block.init(random.key(0))
    x = random.normal(random.key(1), (3, 4), dtype=torch.float64)
    ran = []
    for i in range(40):
        before = len(calls)
        y, new_state = block.apply(params, state, x, key=random.key(i), train=True)
        did_run = float(new_state["ran"]) == 1.0
        assert len(calls) - before == int(did_run), "body called iff the block ran"
        if not did_run:
            torch.testing.assert_close(y, x, msg="a dropped block must be the shortcut")
        ran.append(did_run)
    assert 5 < sum(ran) < 35, f"implausible survival count {sum(ran)}/40 at p=0.5"


def test_row_mode_drops_rows_independently() -> None:
    block = stochastic_depth(dense_body(), 0.5, mode="row")
    params, state = block.init(random.key(0))
    x = random.normal(random.key(1), (64, 4), dtype=torch.float64)
    y, new_state = block.apply(params, state, x, key=random.key(2), train=True)
    full, _ = dense_body().apply(select(params, "body"), {}, x)
    kept = ~torch.isclose(y, x).all(1)
    torch.testing.assert_close(y[kept], x[kept] + full[kept] / 0.5)
    assert float(new_state["ran"]) == pytest.approx(kept.double().mean().item())
    assert 10 < int(kept.sum()) < 54


@pytest.mark.parametrize("mode", ["batch", "row"])
def test_vmap_over_keys_equals_loop_over_keys(mode: str) -> None:
    model = resnet(8, num_classes=3, in_channels=1, width=4, mode=mode)  # type: ignore[arg-type]
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (2, 1, 8, 8))
    keys = random.split(random.key(5), 6)
    ys, states = torch.func.vmap(lambda k: model.apply(params, state, x, key=k, train=True))(keys)
    runs = set()
    for i, k in enumerate(keys):
        y, s = model.apply(params, state, x, key=k, train=True)
        torch.testing.assert_close(ys[i], y, msg=f"vmap member {i} differs from the loop")
        for n, t in s.items():
            torch.testing.assert_close(states[n][i], t, msg=f"state {n} of member {i}")
        runs.add(tuple(float(v) for v in blocks_ran(s).values()))
    assert len(runs) > 1, "different keys should drop different blocks"


def test_warmup_schedule_and_missing_key() -> None:
    block = stochastic_depth(dense_body(), 0.4, warmup=Warmup(steps=10, start_scale=0.0))
    params, state = block.init(random.key(0))
    x = random.normal(random.key(1), (2, 4), dtype=torch.float64)
    assert int(state["step"]) == 0
    # At step 0 the drop probability is 0.4 * 0 = 0: every key keeps the body.
    for i in range(10):
        _, s = block.apply(params, state, x, key=random.key(i), train=True)
        assert float(s["ran"]) == 1.0 and int(s["step"]) == 1
    warm = Warmup(steps=10, start_scale=0.5)
    assert [float(warm.scale(torch.tensor(t))) for t in (0, 5, 10, 20)] == [0.5, 0.75, 1.0, 1.0]
    _, s = block.apply(params, state, x)
    assert int(s["step"]) == 0, "evaluation must not advance the schedule"
    with pytest.raises(KeyMissingError, match="key"):
        block.apply(params, state, x, train=True)


def test_grad_through_batch_mode() -> None:
    model = resnet(8, num_classes=3, in_channels=1, width=4)
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (2, 1, 8, 8))

    def loss(p: Params, key: Tensor) -> Tensor:
        return model.apply(p, state, x, key=key, train=True)[0].sum()

    k = random.key(7)
    grads = torch.func.grad(loss)(params, k)
    _, s = model.apply(params, state, x, key=k, train=True)
    for name, ran in blocks_ran(s).items():
        g = grads[f"{name}.body.conv1.weight"]
        assert bool((g != 0).any()) == bool(ran), f"{name}: gradient iff the block ran"


def test_evaluation_exports() -> None:
    from funcgraph.export import export

    model = resnet(8, num_classes=3, in_channels=1, width=4)
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (2, 1, 8, 8))
    program = export(model, params, state, x)
    y = random.normal(random.key(2), (3, 1, 8, 8))
    torch.testing.assert_close(program.module()(y), model.apply(params, state, y)[0])
