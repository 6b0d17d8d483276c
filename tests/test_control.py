"""funcgraph.control.cond against Python branching: eager, grad, vmap, export."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from funcgraph.control import cond, double_or_halve, is_batched
from funcgraph.errors import ShapeError


def reference(x: Tensor) -> Tensor:
    """The seed example with a plain Python ``if``."""
    return x * 2 if x.sum() > 0 else x / 2


vectors = st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=1, max_size=6)


@given(vectors)
def test_eager_equals_python_branch(values: list[float]) -> None:
    x = torch.tensor(values, dtype=torch.float64)
    torch.testing.assert_close(double_or_halve(x), reference(x), msg="eager cond != Python if")


@given(vectors)
def test_grad_equals_python_branch(values: list[float]) -> None:
    x = torch.tensor(values, dtype=torch.float64)
    g = torch.func.grad(lambda v: double_or_halve(v).sum())(x)
    g_ref = torch.func.grad(lambda v: reference(v).sum())(x)
    torch.testing.assert_close(g, g_ref, msg="grad through cond != grad through Python if")


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_second_order_equals_python_branch(sign: float) -> None:
    x = sign * torch.tensor([0.3, 1.2, -0.4], dtype=torch.float64)

    def nonlinear(v: Tensor) -> Tensor:
        return cond(v.sum() > 0, torch.sin, torch.cos, v).sum()

    def nonlinear_ref(v: Tensor) -> Tensor:
        return (torch.sin(v) if v.sum() > 0 else torch.cos(v)).sum()

    # jacrev twice (not hessian/jacfwd: forward AD loads torch.jit decompositions, which warn).
    h = torch.func.jacrev(torch.func.jacrev(nonlinear))(x)
    h_ref = torch.func.jacrev(torch.func.jacrev(nonlinear_ref))(x)
    torch.testing.assert_close(h, h_ref, msg="second order through cond != Python if")


def test_vmap_batched_predicate_equals_loop_and_runs_both_branches() -> None:
    xs = torch.tensor([[1.0, 2.0], [-3.0, 1.0], [0.5, -0.25], [-1.0, -1.0]])
    calls = {"true": 0, "false": 0}

    def double(v: Tensor) -> Tensor:
        calls["true"] += 1
        return v * 2

    def halve(v: Tensor) -> Tensor:
        calls["false"] += 1
        return v / 2

    out = torch.func.vmap(lambda v: cond(v.sum() > 0, double, halve, v))(xs)
    torch.testing.assert_close(out, torch.stack([reference(x) for x in xs]))
    assert calls == {"true": 1, "false": 1}, "a batched predicate must run each branch once"
    grads = torch.func.vmap(torch.func.grad(lambda v: double_or_halve(v).sum()))(xs)
    expected = torch.stack([torch.full_like(x, 2.0 if x.sum() > 0 else 0.5) for x in xs])
    torch.testing.assert_close(grads, expected, msg="vmap(grad(cond)) != per-row derivative")


def test_vmap_unbatched_predicate_runs_one_branch() -> None:
    calls: list[str] = []
    flag = torch.tensor(True)

    def on_true(v: Tensor) -> Tensor:
        calls.append("true")
        return v + 1

    def on_false(v: Tensor) -> Tensor:
        calls.append("false")
        return v - 1

    out = torch.func.vmap(lambda v: cond(flag, on_true, on_false, v))(torch.zeros(3, 2))
    torch.testing.assert_close(out, torch.ones(3, 2))
    assert calls == ["true"], "an unbatched predicate under vmap should run only its branch"


def test_export_keeps_both_branches() -> None:
    class Seed(torch.nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return double_or_halve(x)

    x = torch.tensor([1.0, -0.5, 2.0])
    program = torch.export.export(Seed(), (x,))
    assert "cond" in str(program.graph), "the exported graph should contain torch.cond"
    for v in (x, -x, torch.tensor([-1.0, 0.5, 0.25])):
        torch.testing.assert_close(program.module()(v), reference(v),
                                   msg=f"exported cond wrong for {v.tolist()}")


def test_python_bool_and_tuple_outputs() -> None:
    x = torch.arange(3.0)
    a, b = cond(False, lambda v: (v, v + 1), lambda v: (v - 1, v * 0), x)
    torch.testing.assert_close(a, x - 1)
    torch.testing.assert_close(b, torch.zeros(3))


def test_bad_predicate_and_mismatched_branches() -> None:
    with pytest.raises(ShapeError, match="one-element"):
        cond(torch.tensor([True, False]), lambda v: v, lambda v: v, torch.zeros(2))
    with pytest.raises(ShapeError, match="same structure"):
        torch.func.vmap(lambda v: cond(v.sum() > 0, lambda u: (u, u), lambda u: u, v))(
            torch.randn(2, 3)
        )


def test_is_batched() -> None:
    assert not is_batched(torch.zeros(2))
    seen: list[bool] = []

    def probe(v: Tensor) -> Tensor:
        seen.append(is_batched(v))
        return v

    torch.func.vmap(probe)(torch.zeros(2, 3))
    torch.func.grad(lambda v: probe(v).sum())(torch.zeros(3))
    assert seen == [True, False]
