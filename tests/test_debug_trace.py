"""Taps, gradient taps, per-op traces and the finite check: eager, under grad, under vmap."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from funcgraph import random
from funcgraph.debug import NonFiniteError, check_finite, finite_check, grad_tap, tap, trace
from funcgraph.errors import FuncgraphError

W = random.normal(random.key(0), (4, 3))
X = random.normal(random.key(1), (5, 4))


def tapped_loss(
    seen: list[torch.Tensor], grads: list[torch.Tensor]
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """sum(tanh(x @ w)^2) with a tap on the activation and a gradient tap on it."""

    def loss(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = tap(torch.tanh(x @ w), seen.append)
        h = grad_tap(h, grads.append)
        return (h**2).sum()

    return loss


def test_tap_sees_value_and_leaves_result_unchanged() -> None:
    seen: list[torch.Tensor] = []
    out = tapped_loss(seen, [])(W, X)
    ref = (torch.tanh(X @ W) ** 2).sum()
    assert torch.equal(out, ref), "tap changed the result"
    assert torch.equal(seen[0], torch.tanh(X @ W)), "tap saw a different value"
    assert not seen[0].requires_grad


def test_grad_tap_reports_gradient_eager_backward() -> None:
    grads: list[torch.Tensor] = []
    w = W.clone().requires_grad_()
    tapped_loss([], grads)(w, X).backward()
    assert len(grads) == 1
    torch.testing.assert_close(grads[0], 2 * torch.tanh(X @ W), msg="dL/dh of sum(h^2) is 2h")
    w_ref = W.clone().requires_grad_()
    (torch.tanh(X @ w_ref) ** 2).sum().backward()
    assert w.grad is not None and w_ref.grad is not None
    assert torch.equal(w.grad, w_ref.grad), "grad_tap changed the parameter gradient"


def test_grad_tap_under_func_grad() -> None:
    grads: list[torch.Tensor] = []
    g = torch.func.grad(tapped_loss([], grads))(W, X)
    g_ref = torch.func.grad(lambda w: (torch.tanh(X @ w) ** 2).sum())(W)
    assert torch.equal(g, g_ref), "taps changed the gradient"
    torch.testing.assert_close(grads[0], 2 * torch.tanh(X @ W))


def test_taps_under_vmap_of_grad_see_the_whole_batch() -> None:
    seen: list[torch.Tensor] = []
    grads: list[torch.Tensor] = []
    per_example = torch.func.vmap(torch.func.grad(tapped_loss(seen, grads)), (None, 0))
    g = per_example(W, X[:, None])
    ref = torch.stack([torch.func.grad(lambda w, x=x: (torch.tanh(x[None] @ w) ** 2).sum())(W)
                       for x in X])
    torch.testing.assert_close(g, ref, msg="vmap(grad) with taps != loop of grads")
    assert seen[0].shape == (5, 1, 3), "under vmap the tap sees the batch, vmapped dim first"
    torch.testing.assert_close(seen[0][:, 0], torch.tanh(X @ W))
    torch.testing.assert_close(grads[0][:, 0], 2 * torch.tanh(X @ W))


def test_tap_rejects_non_tensor() -> None:
    with pytest.raises(TypeError, match="tap: x must be a Tensor"):
        tap(3.0, print)  # type: ignore[arg-type]


def f(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(F.linear(x, w.T)).sum()


def test_trace_dispatch_records_ops_shapes_dtype_device() -> None:
    t = trace(f)(W, X)
    assert torch.equal(t.output, f(W, X)), "tracing changed the output"
    names = t.names()
    assert "aten.tanh" in names and "aten.sum" in names
    tanh = t.ops[names.index("aten.tanh")]
    assert tanh.in_shapes == ((5, 3),) and tanh.out_shapes == ((5, 3),)
    assert tanh.dtype == torch.float32 and tanh.device == torch.device("cpu")
    assert all(r.elapsed_s >= 0 for r in t.ops)
    assert "aten.tanh" in t.table() and f"{len(t)} ops" in t.table()


def test_trace_function_level_shows_calls_as_written_with_user_lines() -> None:
    t = trace(f, level="function", stack=True)(W, X)
    assert t.names()[-3:] == ["linear", "tanh", "sum"]
    assert all("test_debug_trace.py" in r.location for r in t.ops), [r.location for r in t.ops]


def test_trace_levels_under_vmap_report_physical_vs_logical_shapes() -> None:
    disp = trace(torch.func.vmap(f, (None, 0)))(W, X)
    func = trace(torch.func.vmap(f, (None, 0)), level="function")(W, X)
    assert ((5, 3),) in [r.out_shapes for r in disp.ops if r.op == "aten.tanh"]
    assert [r.out_shapes for r in func.ops if r.op == "tanh"] == [((3,),)]


def test_trace_dispatch_under_grad_records_backward_ops() -> None:
    t = trace(torch.func.grad(f))(W, X)
    assert "aten.tanh_backward" in t.names()
    assert torch.equal(t.output, torch.func.grad(f)(W, X)), "tracing changed the gradient"


def test_trace_follows_cond_into_the_branch_taken() -> None:
    def g(x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos() * 2, (x,))

    pos, neg = trace(g)(torch.ones(3)), trace(g)(-torch.ones(3))
    assert pos.names()[-2:] == ["cond[true]", "aten.sin"]
    assert neg.names()[-3:] == ["cond[false]", "aten.cos", "aten.mul"]
    torch.testing.assert_close(neg.output, torch.ones(3).cos() * 2)
    # Regression: tracing a cond once must not break torch.cond afterwards (dynamo used to mark
    # torch's cond wrapper as never-compile when it met our mode).
    torch.testing.assert_close(g(-torch.ones(3)), torch.ones(3).cos() * 2)


def test_trace_rejects_unknown_level() -> None:
    with pytest.raises(ValueError, match="level"):
        trace(f, level="autograd")  # type: ignore[arg-type]


def nan_at_log(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    h = torch.exp(x @ w)
    return torch.log(h - 2.0).sum()  # LOG LINE: negative values -> NaN


LOG_LINE = next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                if "# LOG LINE" in line)


@pytest.mark.parametrize("how", ["eager", "grad", "vmap", "vmap_grad"])
def test_finite_check_names_the_first_nan_op_and_line(how: str) -> None:
    calls = {
        "eager": lambda: nan_at_log(W, X),
        "grad": lambda: torch.func.grad(nan_at_log)(W, X),
        "vmap": lambda: torch.func.vmap(nan_at_log, (None, 0))(W, X),
        "vmap_grad": lambda: torch.func.vmap(torch.func.grad(nan_at_log), (None, 0))(W, X),
    }
    with pytest.raises(NonFiniteError) as info:
        with finite_check():
            calls[how]()
    err = info.value
    assert err.record.op == "aten.log", str(err)
    assert f"test_debug_trace.py:{LOG_LINE} in nan_at_log" in err.record.location, str(err)
    assert "NaN" in str(err) and "from finite inputs" in str(err)
    assert isinstance(err, FuncgraphError)


def test_finite_check_catches_nan_born_in_backward() -> None:
    def sqrt_at_zero(x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x).sum()  # forward finite at 0, backward 1/(2*sqrt(0)) = inf

    x = torch.tensor([0.0, 1.0])
    assert math.isfinite(sqrt_at_zero(x).item())
    with pytest.raises(NonFiniteError, match="Inf") as info:
        check_finite(torch.func.grad(sqrt_at_zero))(x)
    assert info.value.record.op != "aten.sqrt", "the forward sqrt was finite"


def test_finite_check_reports_non_finite_inputs_and_passes_clean_code() -> None:
    with pytest.raises(NonFiniteError, match="already non-finite"):
        check_finite(torch.sin)(torch.tensor([float("nan")]))
    assert torch.equal(check_finite(f)(W, X), f(W, X)), "check_finite changed the output"


def test_finite_check_covers_tensor_backward() -> None:
    x = torch.tensor([0.0, 4.0], requires_grad=True)
    with pytest.raises(NonFiniteError, match="Inf"), finite_check():
        torch.sqrt(x).sum().backward()  # d sqrt(x)/dx at 0 is inf
