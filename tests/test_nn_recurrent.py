"""LSTM/GRU with lengths against ``nn.LSTM``/``nn.GRU`` on packed sequences.

References: the torch module fed ``pack_padded_sequence`` (outputs, last states, first- and
second-order gradients through plain autograd), finite differences in float64 for the
Hessian-vector product, and a Python loop for ``vmap``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import funcgraph as fg
from funcgraph.errors import ShapeError
from funcgraph.model import Model

KINDS = {"lstm": (fg.nn.lstm, nn.LSTM), "gru": (fg.nn.gru, nn.GRU)}
Params = dict[str, Tensor]


def _pair(kind: str, in_size: int, hidden: int, **kw: Any) -> tuple[Model, nn.RNNBase, Params]:
    """Our model, the torch module, and the module's params (detached copies)."""
    ours, theirs = KINDS[kind]
    dtype = kw.pop("dtype", torch.float64)
    module = theirs(in_size, hidden, **kw).to(dtype)
    params = {n: p.detach().clone() for n, p in module.named_parameters()}
    return ours(in_size, hidden, dtype=dtype, **kw), module, params


def _last_states(kind: str, y: Any) -> tuple[Tensor, ...]:
    """``(outputs, h_n[, c_n])`` from either layout of ``y``."""
    out, hidden = y
    return (out, *hidden) if kind == "lstm" else (out, hidden)


def _module_forward(
    kind: str, module: nn.RNNBase, params: Params, x: Tensor, lengths: Tensor, batch_first: bool
) -> tuple[Tensor, ...]:
    packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    out, hidden = functional_call(module, params, (packed,))
    steps = x.shape[int(batch_first)]
    out, _ = pad_packed_sequence(out, batch_first=batch_first, total_length=steps)
    return _last_states(kind, (out, hidden))


def _loss(states: tuple[Tensor, ...], weights: tuple[Tensor, ...]) -> Tensor:
    """A scalar touching every output with fixed random weights (so no gradient cancels)."""
    return torch.stack([(s * w).sum() for s, w in zip(states, weights, strict=True)]).sum()


def _dot(a: Params, b: Params) -> Tensor:
    return torch.stack([(a[n] * b[n]).sum() for n in a]).sum()


def _close(got: Tensor, want: Tensor, what: str, *, rtol: float, atol: float) -> None:
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


@st.composite
def _cases(draw: st.DrawFn) -> dict[str, Any]:
    batch = draw(st.integers(1, 4))
    steps = draw(st.integers(1, 5))
    # Always include a full-length and (when there is room) a length-1 sequence.
    lengths = [steps] + draw(st.lists(st.integers(1, steps), min_size=batch - 1,
                                      max_size=batch - 1))
    if batch > 1:
        lengths[draw(st.integers(1, batch - 1))] = 1
    return {
        "kind": draw(st.sampled_from(sorted(KINDS))),
        "batch": batch,
        "steps": steps,
        "lengths": draw(st.permutations(lengths)),
        "in_size": draw(st.integers(1, 4)),
        "hidden": draw(st.integers(1, 4)),
        "num_layers": draw(st.sampled_from([1, 2])),
        "bias": draw(st.booleans()),
        "batch_first": draw(st.booleans()),
        "dtype": draw(st.sampled_from([torch.float32, torch.float64])),
    }


@given(_cases())
def test_equals_module_on_packed_sequences(case: dict[str, Any]) -> None:
    kind, dtype, bf = case["kind"], case["dtype"], case["batch_first"]
    model, module, params = _pair(kind, case["in_size"], case["hidden"],
                                  num_layers=case["num_layers"], bias=case["bias"],
                                  batch_first=bf, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    shape = (case["batch"], case["steps"], case["in_size"])
    x = torch.randn(shape if bf else (shape[1], shape[0], shape[2]), generator=gen, dtype=dtype)
    lengths = torch.tensor(case["lengths"], dtype=torch.int64)
    rtol, atol = (1e-4, 1e-5) if dtype == torch.float32 else (0.0, 1e-10)

    def ours(p: Params, x: Tensor) -> tuple[Tensor, ...]:
        y, _ = model.apply(p, {}, (x, lengths))
        return _last_states(kind, y)

    def theirs(p: Params, x: Tensor) -> tuple[Tensor, ...]:
        return _module_forward(kind, module, p, x, lengths, bf)

    got, want = ours(params, x), theirs(params, x)
    for name, g, w in zip(("outputs", "h_n", "c_n"), got, want, strict=False):
        assert g.shape == w.shape, f"{kind} {name}: shape {g.shape} != module's {w.shape}"
        _close(g, w, f"{kind} {name}", rtol=rtol, atol=atol)
    # pad_packed_sequence zero-fills padded steps, so the check above covers them too.

    weights = tuple(torch.randn(w.shape, generator=gen, dtype=dtype) for w in want)
    grads = []
    for fn in (ours, theirs):
        p = {n: t.clone().requires_grad_() for n, t in params.items()}
        xg = x.clone().requires_grad_()
        grads.append(torch.autograd.grad(_loss(fn(p, xg), weights), [*p.values(), xg]))
    for name, g, w in zip([*params, "input"], *grads, strict=True):
        _close(g, w, f"{kind} grad {name}", rtol=rtol, atol=atol)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_param_names_shapes_and_init(kind: str) -> None:
    model, module, _ = _pair(kind, 3, 5, num_layers=2, dtype=torch.float32)
    params, state = model.init(fg.random.key(0))
    assert state == {}
    assert {n: p.shape for n, p in params.items()} == {
        n: p.shape for n, p in module.state_dict().items()
    }, "param names/shapes must equal the module's state_dict"
    bound = 1 / 5**0.5
    for name, p in params.items():
        assert p.dtype == torch.float32
        assert p.abs().max() <= bound, f"{name} outside U(-1/sqrt(H), 1/sqrt(H))"
        assert p.std() > bound / 4, f"{name} does not look uniform over the bound"
    again, _ = model.init(fg.random.key(0))
    assert fg.params.allclose(params, again, rtol=0, atol=0), "init must be a function of the key"
    other, _ = model.init(fg.random.key(1))
    assert not fg.params.allclose(params, other), "different keys must give different params"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_lengths_none_is_full_length(kind: str) -> None:
    model, module, params = _pair(kind, 2, 3, num_layers=2, batch_first=True)
    x = torch.randn(3, 4, 2, dtype=torch.float64)
    full, _ = model.apply(params, {}, (x, torch.full((3,), 4)))
    none, _ = model.apply(params, {}, (x, None))
    want = _last_states(kind, functional_call(module, params, (x,)))
    for a, b, c in zip(_last_states(kind, full), _last_states(kind, none), want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(b, c, rtol=0, atol=1e-12)


def _hvp(loss: Callable[[Params], Tensor], params: Params, v: Params) -> Params:
    """Hessian-vector product by grad of grad (torch.func)."""

    return grad(lambda p: _dot(grad(loss)(p), v))(params)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_second_order_grad_matches_module_and_finite_differences(kind: str) -> None:
    model, module, params = _pair(kind, 2, 3, num_layers=2, batch_first=True)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 4, 2, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([4, 1, 2])
    weights = tuple(torch.randn(s, generator=gen, dtype=torch.float64)
                    for s in [(3, 4, 3), (2, 3, 3), (2, 3, 3)][: 3 if kind == "lstm" else 2])
    v = {n: torch.randn(p.shape, generator=gen, dtype=torch.float64) for n, p in params.items()}

    def loss(p: Params) -> Tensor:
        y, _ = model.apply(p, {}, (x, lengths))
        return _loss(_last_states(kind, y), weights) ** 2 / 10  # squared: a richer Hessian

    hv = _hvp(loss, params, v)
    assert all(torch.isfinite(t).all() for t in hv.values())

    # Reference 1: central differences of the first-order gradient along v.
    eps = 1e-6
    plus = grad(loss)({n: p + eps * v[n] for n, p in params.items()})
    minus = grad(loss)({n: p - eps * v[n] for n, p in params.items()})
    for n in params:
        fd = (plus[n] - minus[n]) / (2 * eps)
        _close(hv[n], fd, f"Hv {n} vs finite differences", rtol=1e-6, atol=1e-7)

    # Reference 2: double backward through the module with plain autograd (CPU kernels).
    p = {n: t.clone().requires_grad_() for n, t in params.items()}
    states = _module_forward(kind, module, p, x, lengths, batch_first=True)
    g = torch.autograd.grad(_loss(states, weights) ** 2 / 10, list(p.values()), create_graph=True)
    directional = _dot(dict(zip(p, g, strict=True)), v)
    want = dict(zip(p, torch.autograd.grad(directional, list(p.values())), strict=True))
    for n in params:
        _close(hv[n], want[n], f"Hv {n} vs module", rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_vmap_over_param_dicts_and_inputs_equals_loop(kind: str) -> None:
    model = KINDS[kind][0](2, 3, num_layers=2, dtype=torch.float64)
    per_task = [model.init(k)[0] for k in fg.random.split(fg.random.key(3), 3)]
    gen = torch.Generator().manual_seed(2)
    xs = torch.randn(3, 2, 4, 2, generator=gen, dtype=torch.float64)  # (N, B, T, F)
    lengths = torch.tensor([[4, 1], [2, 3], [1, 1]])  # (N, B)

    def run(p: Params, x: Tensor, lengths: Tensor) -> tuple[Tensor, ...]:
        y, _ = model.apply(p, {}, (x, lengths))
        return _last_states(kind, y)

    batched = vmap(run)(fg.params.stack([*per_task]), xs, lengths)
    for i, p in enumerate(per_task):
        for b, want in zip(batched, run(p, xs[i], lengths[i]), strict=True):
            torch.testing.assert_close(b[i], want, rtol=0, atol=1e-12)

    # Second order under vmap: per-task grad of grad equals the loop.
    def task_loss(p: Params, x: Tensor, lengths: Tensor) -> Tensor:
        inner = grad(lambda q: run(q, x, lengths)[0].pow(2).sum())(p)
        return run({n: p[n] - 0.1 * inner[n] for n in p}, x, lengths)[1].sum()

    shared = per_task[0]
    vm = grad(lambda p: vmap(task_loss, in_dims=(None, 0, 0))(p, xs, lengths).sum())(shared)
    loop = grad(lambda p: sum(task_loss(p, xs[i], lengths[i]) for i in range(3)))(shared)
    for n in shared:
        torch.testing.assert_close(vm[n], loop[n], rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_padded_steps_are_ignored(kind: str) -> None:
    """Whatever is written in the padding changes neither the valid outputs nor h_n."""
    model = KINDS[kind][0](2, 3)
    params, state = model.init(fg.random.key(0))
    x = torch.randn(2, 5, 2)
    lengths = torch.tensor([2, 5])
    noisy = x.clone()
    noisy[0, 2:] = 1e3
    a = _last_states(kind, model.apply(params, state, (x, lengths))[0])
    b = _last_states(kind, model.apply(params, state, (noisy, lengths))[0])
    for s, t in zip(a, b, strict=True):
        torch.testing.assert_close(s, t, rtol=0, atol=0)
    assert (a[0][0, 2:] == 0).all(), "outputs at padded steps must be zero"
    empty = _last_states(kind, model.apply(params, state, (x, torch.tensor([0, 5])))[0])
    assert (empty[0][0] == 0).all(), "a length-0 sequence gives zero outputs"
    torch.testing.assert_close(empty[0][1], a[0][1], rtol=0, atol=0)
    for s, t in zip(empty[1:], a[1:], strict=True):  # (num_layers, B, H)
        assert (s[:, 0] == 0).all(), "a length-0 sequence keeps zero final states"
        torch.testing.assert_close(s[:, 1], t[:, 1], rtol=0, atol=0)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_apply_does_not_mutate_inputs(kind: str) -> None:
    model = KINDS[kind][0](2, 3, num_layers=2)
    params, state = model.init(fg.random.key(0))
    x, lengths = torch.randn(2, 3, 2), torch.tensor([3, 1])
    before = ({n: p.clone() for n, p in params.items()}, x.clone(), lengths.clone())
    model.apply(params, state, (x, lengths))
    assert fg.params.allclose(params, before[0], rtol=0, atol=0)
    assert torch.equal(x, before[1]), "apply mutated its input"
    assert torch.equal(lengths, before[2]), "apply mutated the lengths"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_bad_shapes_raise_shape_error_with_both_shapes(kind: str) -> None:
    model = KINDS[kind][0](2, 3)
    params, state = model.init(fg.random.key(0))
    with pytest.raises(ShapeError, match=r"F=2, got \(4, 5, 7\)"):
        model.apply(params, state, (torch.randn(4, 5, 7), None))
    with pytest.raises(ShapeError, match=r"got \(4, 2\)"):
        model.apply(params, state, (torch.randn(4, 2), None))
    with pytest.raises(ShapeError, match=r"\(B,\) = \(4,\) for inputs \(4, 5, 2\), got \(3,\)"):
        model.apply(params, state, (torch.randn(4, 5, 2), torch.tensor([1, 2, 3])))
    with pytest.raises(ShapeError, match="integer"):
        model.apply(params, state, (torch.randn(4, 5, 2), torch.ones(4)))
    with pytest.raises(ShapeError, match="expected x = "):
        model.apply(params, state, torch.randn(4, 5, 2))
