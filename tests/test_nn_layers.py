"""Every pure layer in ``funcgraph.nn`` against its ``torch.nn`` counterpart.

The reference is always the torch module with the same named params: the layer is fed the
module's params and buffers, and outputs, gradients (wrt every param and the input), the
returned state (against the module's buffers after the same call) and the param names all
have to agree. Every comparison also checks that ``apply`` left params, state and x alone.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor, nn

import funcgraph as fg
from funcgraph.errors import KeyMissingError, ShapeError
from funcgraph.model import Model

DTYPES = st.sampled_from([torch.float32, torch.float64])
Params = dict[str, Tensor]


def _close(got: Tensor, want: Tensor, what: str, dtype: torch.dtype) -> None:
    """Equal up to rounding of ``dtype`` (float64 comparisons are tight)."""
    rtol, atol = (1e-9, 1e-10) if dtype == torch.float64 else (1e-4, 1e-5)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def _randomize(module: nn.Module) -> nn.Module:
    """Replace default params/buffers (ones, zeros) by random values so every term matters."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()
        for name, b in module.named_buffers():
            if name.endswith("running_var"):
                b.uniform_(0.5, 1.5)
            elif b.is_floating_point():
                b.normal_()
    return module


def _shapes(d: dict[str, Tensor]) -> dict[str, tuple[int, ...]]:
    return {n: tuple(t.shape) for n, t in d.items()}


def _unchanged(before: dict[str, Tensor], after: dict[str, Tensor], what: str) -> None:
    assert set(before) == set(after), f"apply changed the names of {what}"
    for n in before:
        assert torch.equal(before[n], after[n]), f"apply mutated {what}[{n!r}]"


def check_matches_module(
    model: Model, module: nn.Module, x: Tensor, *, train: bool = False
) -> None:
    """One call of ``model`` on the module's current params/buffers equals one module call.

    Compares init names and shapes, outputs, grads wrt every param and a float ``x``, and the
    returned state against the module's buffers after its call (the module is updated in
    place, so successive calls check state threading). Also asserts nothing was mutated.
    """
    params = {n: p.detach().clone() for n, p in module.named_parameters()}
    state = {n: b.detach().clone() for n, b in module.named_buffers()}
    init_params, init_state = model.init(fg.random.key(0))
    assert _shapes(init_params) == _shapes(params), "init param names/shapes != module's"
    assert _shapes(init_state) == _shapes(state), "init state names/shapes != module's buffers"
    saved = ({n: t.clone() for n, t in params.items()},
             {n: t.clone() for n, t in state.items()}, x.clone())

    float_x = x.is_floating_point()
    dtype = x.dtype if float_x else next(module.parameters()).dtype
    ours_p = {n: t.clone().requires_grad_() for n, t in params.items()}
    ours_x = x.clone().requires_grad_(float_x)
    y, new_state = model.apply(ours_p, state, ours_x, train=train)
    module.train(train)
    theirs_x = x.clone().requires_grad_(float_x)
    want = module(theirs_x)
    _close(y, want, f"{model.name} output", dtype)

    weights = torch.randn_like(want)
    inputs = [ours_x] if float_x else []
    ours_g = torch.autograd.grad((y * weights).sum(), [*ours_p.values(), *inputs])
    theirs_g = torch.autograd.grad((want * weights).sum(),
                                   [*dict(module.named_parameters()).values(),
                                    *([theirs_x] if float_x else [])])
    for name, g, w in zip([*ours_p, "input"], ours_g, theirs_g, strict=False):
        _close(g, w, f"{model.name} grad {name}", dtype)

    buffers = dict(module.named_buffers())
    assert set(new_state) == set(buffers), "returned state names != module buffers"
    for n, b in buffers.items():
        assert new_state[n].dtype == b.dtype, f"state {n!r} dtype"
        _close(new_state[n], b, f"{model.name} state {n}", dtype)

    _unchanged(saved[0], params, "params")
    _unchanged(saved[1], state, "state")
    assert torch.equal(saved[2], x), "apply mutated x"


def _maybe_strided(x: Tensor, strided: bool) -> Tensor:
    """Same values, but a non-contiguous view (last two dims swapped in memory)."""
    if not strided or x.dim() < 2:
        return x
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


# --- affine layers ---------------------------------------------------------------------------


@given(batch=st.lists(st.integers(1, 3), max_size=2), n_in=st.integers(1, 5),
       n_out=st.integers(1, 5), bias=st.booleans(), dtype=DTYPES, seed=st.integers(0, 99))
def test_linear_equals_module(
    batch: list[int], n_in: int, n_out: int, bias: bool, dtype: torch.dtype, seed: int
) -> None:
    torch.manual_seed(seed)
    module = nn.Linear(n_in, n_out, bias=bias).to(dtype)
    x = torch.randn(*batch, n_in, dtype=dtype)
    check_matches_module(fg.nn.linear(n_in, n_out, bias=bias, dtype=dtype), module, x)


@st.composite
def _conv_cases(draw: st.DrawFn) -> dict[str, Any]:
    dims = draw(st.sampled_from([1, 2]))
    groups = draw(st.integers(1, 2))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(dims))
    stride = draw(st.integers(1, 2))
    dilation = draw(st.integers(1, 2))
    padding: int | str = draw(st.integers(0, 2))
    if stride == 1 and draw(st.booleans()):
        padding = draw(st.sampled_from(["same", "valid"]))
    pad = 0 if isinstance(padding, str) else padding
    sizes = [draw(st.integers(max(1, dilation * (k - 1) + 1 - 2 * pad), 6)) for k in kernel]
    return {"dims": dims, "groups": groups, "in_ch": groups * draw(st.integers(1, 2)),
            "out_ch": groups * draw(st.integers(1, 2)), "kernel": kernel, "stride": stride,
            "dilation": dilation, "padding": padding, "sizes": sizes,
            "batch": draw(st.integers(1, 2)), "bias": draw(st.booleans()),
            "strided": draw(st.booleans())}


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")  # torch's own note
@given(case=_conv_cases(), dtype=DTYPES, seed=st.integers(0, 99))
def test_conv_equals_module(case: dict[str, Any], dtype: torch.dtype, seed: int) -> None:
    torch.manual_seed(seed)
    options = {k: case[k] for k in ("stride", "padding", "dilation", "groups", "bias")}
    dims, kernel = case["dims"], case["kernel"]
    module_cls = nn.Conv1d if dims == 1 else nn.Conv2d
    model_fn = fg.nn.conv1d if dims == 1 else fg.nn.conv2d
    module = module_cls(case["in_ch"], case["out_ch"], kernel, **options).to(dtype)
    model = model_fn(case["in_ch"], case["out_ch"], kernel, dtype=dtype, **options)
    x = torch.randn(case["batch"], case["in_ch"], *case["sizes"], dtype=dtype)
    check_matches_module(model, module, _maybe_strided(x, case["strided"]))


def test_affine_init_is_fan_in_uniform_and_keyed() -> None:
    model = fg.nn.conv2d(4, 6, 3, groups=2)
    params, _ = model.init(fg.random.key(0))
    bound = 1 / (2 * 3 * 3) ** 0.5  # fan_in = in_channels / groups * kernel area
    for name, p in params.items():
        assert p.abs().max() <= bound and p.abs().max() > 0.8 * bound, name
    again, _ = model.init(fg.random.key(0))
    assert fg.params.allclose(params, again, rtol=0, atol=0)


# --- normalisation ---------------------------------------------------------------------------


@given(spatial=st.lists(st.integers(1, 3), max_size=2), batch=st.integers(2, 4),
       channels=st.integers(1, 3), train=st.booleans(), affine=st.booleans(),
       track=st.booleans(), momentum=st.sampled_from([0.1, 0.35]),
       eps=st.sampled_from([1e-5, 1e-3]), dtype=DTYPES, seed=st.integers(0, 99))
def test_batch_norm_equals_module_over_two_steps(
    spatial: list[int], batch: int, channels: int, train: bool, affine: bool, track: bool,
    momentum: float, eps: float, dtype: torch.dtype, seed: int,
) -> None:
    torch.manual_seed(seed)
    module_cls = nn.BatchNorm2d if len(spatial) == 2 else nn.BatchNorm1d
    module = _randomize(module_cls(channels, eps=eps, momentum=momentum, affine=affine,
                                   track_running_stats=track).to(dtype))
    model = fg.nn.batch_norm(channels, eps=eps, momentum=momentum, affine=affine,
                             track_running_stats=track, dtype=dtype)
    # Two calls: the second starts from the module's buffers after the first, so running
    # statistics and num_batches_tracked are checked as they accumulate.
    for _ in range(2):
        x = torch.randn(batch, channels, *spatial, dtype=dtype) * 2 + 1
        check_matches_module(model, module, x, train=train)
    if track:
        assert int(module.num_batches_tracked) == (2 if train else 0)  # type: ignore[arg-type]


def test_batch_norm_state_update_counts_and_rejects_wrong_channels() -> None:
    model = fg.nn.batch_norm(3)
    params, state = model.init(fg.random.key(0))
    _, s1 = model.apply(params, state, torch.randn(4, 3), train=True)
    _, s2 = model.apply(params, s1, torch.randn(4, 3), train=True)
    assert int(s2["num_batches_tracked"]) == 2 and s2["num_batches_tracked"].dtype == torch.int64
    _, s3 = model.apply(params, s2, torch.randn(4, 3), train=False)
    assert s3 is s2 or fg.params.allclose(s3, s2, rtol=0, atol=0), "eval must not update state"
    with pytest.raises(ShapeError, match=r"\(B, 3, \.\.\.\), got \(4, 5\)"):
        model.apply(params, state, torch.randn(4, 5))


@given(lead=st.lists(st.integers(1, 3), min_size=1, max_size=2),
       normalized=st.lists(st.integers(1, 4), min_size=1, max_size=2),
       affine=st.booleans(), as_int=st.booleans(), dtype=DTYPES, seed=st.integers(0, 99))
def test_layer_norm_equals_module(
    lead: list[int], normalized: list[int], affine: bool, as_int: bool, dtype: torch.dtype,
    seed: int,
) -> None:
    torch.manual_seed(seed)
    shape: int | tuple[int, ...] = normalized[0] if as_int and len(normalized) == 1 else tuple(
        normalized)
    module = _randomize(nn.LayerNorm(shape, elementwise_affine=affine).to(dtype))
    x = torch.randn(*lead, *normalized, dtype=dtype)
    check_matches_module(fg.nn.layer_norm(shape, elementwise_affine=affine, dtype=dtype),
                         module, x)


@given(groups=st.integers(1, 3), per_group=st.integers(1, 2),
       spatial=st.lists(st.integers(1, 3), max_size=2), batch=st.integers(1, 3),
       affine=st.booleans(), dtype=DTYPES, seed=st.integers(0, 99))
def test_group_norm_equals_module(
    groups: int, per_group: int, spatial: list[int], batch: int, affine: bool,
    dtype: torch.dtype, seed: int,
) -> None:
    torch.manual_seed(seed)
    channels = groups * per_group
    if per_group * max([1, *spatial]) == 1:
        spatial = [*spatial[:-1], 2]  # torch rejects groups of a single value
    module = _randomize(nn.GroupNorm(groups, channels, affine=affine).to(dtype))
    x = torch.randn(batch, channels, *spatial, dtype=dtype)
    check_matches_module(fg.nn.group_norm(groups, channels, affine=affine, dtype=dtype),
                         module, x)


# --- pooling, embedding, parameter-free layers -------------------------------------------


@given(kind=st.sampled_from(["max", "avg"]), kernel=st.integers(1, 3),
       stride=st.sampled_from([None, 1, 2]), pad_frac=st.integers(0, 1),
       ceil_mode=st.booleans(), include_pad=st.booleans(), size=st.integers(3, 6),
       strided=st.booleans(), dtype=DTYPES, seed=st.integers(0, 99))
def test_pools_equal_modules(
    kind: str, kernel: int, stride: int | None, pad_frac: int, ceil_mode: bool,
    include_pad: bool, size: int, strided: bool, dtype: torch.dtype, seed: int,
) -> None:
    torch.manual_seed(seed)
    padding = pad_frac * (kernel // 2)  # torch requires padding <= kernel / 2
    module: nn.Module
    if kind == "max":
        module = nn.MaxPool2d(kernel, stride, padding, ceil_mode=ceil_mode)
        model = fg.nn.max_pool2d(kernel, stride, padding, ceil_mode=ceil_mode)
    else:
        module = nn.AvgPool2d(kernel, stride, padding, ceil_mode=ceil_mode,
                              count_include_pad=include_pad)
        model = fg.nn.avg_pool2d(kernel, stride, padding, ceil_mode=ceil_mode,
                                 count_include_pad=include_pad)
    x = torch.randn(2, 2, size, size + 1, dtype=dtype)
    check_matches_module(model, module, _maybe_strided(x, strided))


@given(kernel=st.integers(1, 3), stride=st.sampled_from([None, 1, 2]), pad_frac=st.integers(0, 1),
       dilation=st.integers(1, 2), ceil_mode=st.booleans(), size=st.integers(5, 7),
       levels=st.sampled_from([0, 3]), seed=st.integers(0, 99))
def test_max_pool_under_transforms_equals_torchs_to_the_second_derivative(
    kernel: int, stride: int | None, pad_frac: int, dilation: int, ceil_mode: bool,
    size: int, levels: int, seed: int,
) -> None:
    """funcgraph's max-pool under vmap and grad (a gather at indices found on another layout)
    against ``F.max_pool2d``: values, gradients and second-order gradients agree exactly,
    ties included (``levels`` > 0 draws from a few values, so windows hold equal maxima)."""
    from torch.func import grad, vmap

    torch.manual_seed(seed)
    shape = (2, 3, 2, size, size + 1)  # 2 tasks of (3, 2, H, W)
    x = (torch.randint(0, levels, shape).double() if levels else
         torch.randn(shape, dtype=torch.float64))
    settings = (kernel, stride, pad_frac * (kernel // 2), dilation, ceil_mode)

    def loss(scale: Tensor, v: Tensor, pool: Any) -> Tensor:
        return (pool(v * scale, *settings) ** 2).sum()

    def outer(scale: Tensor, v: Tensor, pool: Any) -> Tensor:
        inner = grad(loss)(scale, v, pool)  # a MAML-like step: second order through the pool
        return loss(scale - 0.1 * inner, v, pool)

    scale = torch.randn(2, 1, 2, 1, 1, dtype=torch.float64)
    for fn in (lambda s, v, p: p(v * s, *settings), grad(loss), grad(outer)):
        ours = vmap(fn, in_dims=(0, 0, None))(scale, x, fg.nn.max_pool)
        torchs = vmap(fn, in_dims=(0, 0, None))(scale, x, torch.nn.functional.max_pool2d)
        assert torch.equal(ours, torchs)


@given(kind=st.sampled_from(["max", "avg"]), out_h=st.integers(1, 3), out_w=st.integers(1, 3),
       square=st.booleans(), h=st.integers(1, 6), w=st.integers(1, 6), dtype=DTYPES)
def test_adaptive_pools_equal_modules(
    kind: str, out_h: int, out_w: int, square: bool, h: int, w: int, dtype: torch.dtype
) -> None:
    size: int | tuple[int, int] = out_h if square else (out_h, out_w)
    module = nn.AdaptiveMaxPool2d(size) if kind == "max" else nn.AdaptiveAvgPool2d(size)
    model = (fg.nn.adaptive_max_pool2d if kind == "max" else fg.nn.adaptive_avg_pool2d)(size)
    check_matches_module(model, module, torch.randn(2, 3, h, w, dtype=dtype))


@given(num=st.integers(2, 6), dim=st.integers(1, 4), use_pad=st.booleans(),
       shape=st.lists(st.integers(1, 4), min_size=1, max_size=2), dtype=DTYPES,
       seed=st.integers(0, 99))
def test_embedding_equals_module(
    num: int, dim: int, use_pad: bool, shape: list[int], dtype: torch.dtype, seed: int
) -> None:
    torch.manual_seed(seed)
    padding_idx = num - 1 if use_pad else None
    module = nn.Embedding(num, dim, padding_idx=padding_idx).to(dtype)
    x = torch.randint(0, num, shape)
    x.view(-1)[0] = num - 1  # make sure the padding row is looked up (its grad must be 0)
    model = fg.nn.embedding(num, dim, padding_idx=padding_idx, dtype=dtype)
    check_matches_module(model, module, x)
    if use_pad:
        params, _ = model.init(fg.random.key(0))
        assert (params["weight"][num - 1] == 0).all(), "padding row must start at zero"


ACTIVATIONS: list[tuple[str, Model, nn.Module]] = [
    ("relu", fg.nn.relu(), nn.ReLU()),
    ("gelu", fg.nn.gelu(), nn.GELU()),
    ("tanh", fg.nn.tanh(), nn.Tanh()),
    ("sigmoid", fg.nn.sigmoid(), nn.Sigmoid()),
    ("elu", fg.nn.elu(0.7), nn.ELU(0.7)),
    ("leaky_relu", fg.nn.leaky_relu(0.2), nn.LeakyReLU(0.2)),
    ("softmax", fg.nn.softmax(1), nn.Softmax(1)),
    ("identity", fg.nn.identity(), nn.Identity()),
    ("flatten", fg.nn.flatten(), nn.Flatten()),
    ("flatten_2_3", fg.nn.flatten(2, 3), nn.Flatten(2, 3)),
]


@pytest.mark.parametrize(("name", "model", "module"), ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
@given(shape=st.lists(st.integers(1, 3), min_size=4, max_size=4), dtype=DTYPES)
def test_parameter_free_layers_equal_modules(
    name: str, model: Model, module: nn.Module, shape: list[int], dtype: torch.dtype
) -> None:
    check_matches_module(model, module, torch.randn(*shape, dtype=dtype))


# --- dropout -----------------------------------------------------------------------------------


def test_dropout_mask_is_a_function_of_the_key() -> None:
    model = fg.nn.dropout(0.3)
    x = torch.randn(64, 32)
    run = lambda k: model.apply({}, {}, x, key=fg.random.key(k), train=True)[0]  # noqa: E731
    assert torch.equal(run(0), run(0)), "same key, same mask"
    assert not torch.equal(run(0), run(1)), "different keys, different masks"
    y = run(0)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / 0.7, msg="kept values are scaled by 1/keep")
    assert abs(kept.float().mean().item() - 0.7) < 0.03, "keep fraction"


def test_dropout_preserves_expectation_and_is_identity_in_eval() -> None:
    model = fg.nn.dropout(0.5)
    x = torch.linspace(-1, 1, 50, dtype=torch.float64)
    keys = fg.random.split(fg.random.key(7), 4000)
    ys = torch.func.vmap(lambda k: model.apply({}, {}, x, key=k, train=True)[0])(keys)
    # Each mean is over 4000 draws of x_i * {0, 2}: standard error |x_i| / sqrt(4000).
    assert (ys.mean(0) - x).abs().max() < 5 * 1 / 4000**0.5, "E[dropout(x)] must equal x"
    y, _ = model.apply({}, {}, x, train=False)
    assert y is x or torch.equal(y, x)
    y, _ = model.apply({}, {}, x, key=fg.random.key(0), train=False)
    assert torch.equal(y, x), "eval ignores the key"
    module = nn.Dropout(0.5).eval()
    check_matches_module(model, module, x)


def test_dropout_without_key_in_training_raises() -> None:
    with pytest.raises(KeyMissingError, match="key"):
        fg.nn.dropout(0.2).apply({}, {}, torch.ones(3), train=True)
    with pytest.raises(ValueError, match="drop_prob"):
        fg.nn.dropout(1.0)


# --- combinators -------------------------------------------------------------------------------


class _Residual(nn.Module):
    def __init__(self, body: nn.Module, shortcut: nn.Module | None) -> None:
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x) + (x if self.shortcut is None else self.shortcut(x))


class _Parallel(nn.ModuleList):
    def __init__(self, branches: list[nn.Module], combine: str) -> None:
        super().__init__(branches)
        self.combine = combine

    def forward(self, x: Tensor) -> Tensor:
        ys = [branch(x) for branch in self]
        if self.combine == "concat":
            return torch.cat(ys, dim=1)
        if self.combine == "stack":
            return torch.stack(ys, dim=1)
        return torch.stack(ys).sum(0)


def _conv_net() -> tuple[Model, nn.Module]:
    model = fg.nn.serial(fg.nn.conv2d(2, 3, 3, padding=1, dtype=torch.float64),
                         fg.nn.batch_norm(3, dtype=torch.float64), fg.nn.relu(),
                         fg.nn.max_pool2d(2), fg.nn.flatten(),
                         fg.nn.linear(12, 4, dtype=torch.float64))
    module = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(),
                           nn.MaxPool2d(2), nn.Flatten(), nn.Linear(12, 4))
    return model, module


def _named_mlp() -> tuple[Model, nn.Module]:
    model = fg.nn.serial({"fc1": fg.nn.linear(4, 5, dtype=torch.float64),
                          "norm": fg.nn.layer_norm(5, dtype=torch.float64),
                          "act": fg.nn.gelu(), "fc2": fg.nn.linear(5, 4, dtype=torch.float64)})
    module = nn.Sequential(OrderedDict(fc1=nn.Linear(4, 5), norm=nn.LayerNorm(5),
                                       act=nn.GELU(), fc2=nn.Linear(5, 4)))
    return model, module


def _residual_nets() -> tuple[Model, nn.Module]:
    def block(shortcut: bool) -> tuple[Model, nn.Module]:
        body = fg.nn.serial(fg.nn.linear(4, 4, dtype=torch.float64), fg.nn.tanh(),
                            fg.nn.linear(4, 4, dtype=torch.float64))
        body_m = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
        if not shortcut:
            return fg.nn.residual(body), _Residual(body_m, None)
        return (fg.nn.residual(body, fg.nn.linear(4, 4, bias=False, dtype=torch.float64)),
                _Residual(body_m, nn.Linear(4, 4, bias=False)))

    (a, am), (b, bm) = block(False), block(True)
    return fg.nn.serial(a, b), nn.Sequential(am, bm)


def _parallel_net(combine: str) -> tuple[Model, nn.Module]:
    model = fg.nn.parallel(fg.nn.linear(4, 3, dtype=torch.float64),
                           fg.nn.serial(fg.nn.linear(4, 3, dtype=torch.float64), fg.nn.elu()),
                           combine=combine)
    module = _Parallel([nn.Linear(4, 3), nn.Sequential(nn.Linear(4, 3), nn.ELU())], combine)
    return model, module


COMPOSITES = {
    "sequential_conv_bn": (_conv_net, (3, 2, 4, 4)),
    "named_sequential": (_named_mlp, (3, 4)),
    "residual": (_residual_nets, (3, 4)),
    "parallel_concat": (lambda: _parallel_net("concat"), (3, 4)),
    "parallel_sum": (lambda: _parallel_net("sum"), (3, 4)),
    "parallel_stack": (lambda: _parallel_net("stack"), (3, 4)),
}


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_composites_equal_modules(name: str, train: bool) -> None:
    torch.manual_seed(0)
    build, shape = COMPOSITES[name]
    model, module = build()
    module = _randomize(module.double())
    params, state = model.init(fg.random.key(0))
    assert list(params) == [n for n, _ in module.named_parameters()], "param names/order"
    assert list(state) == [n for n, _ in module.named_buffers()], "state names/order"
    for _ in range(2):
        check_matches_module(model, module, torch.randn(*shape, dtype=torch.float64), train=train)


def test_composite_does_not_mutate_with_dropout_and_batch_norm() -> None:
    model = fg.nn.serial(fg.nn.linear(3, 4), fg.nn.batch_norm(4), fg.nn.dropout(0.5))
    params, state = model.init(fg.random.key(0))
    saved = (copy.deepcopy(params), copy.deepcopy(state))
    x = torch.randn(5, 3)
    x_saved = x.clone()
    y1, new_state = model.apply(params, state, x, key=fg.random.key(1), train=True)
    y2, _ = model.apply(params, state, x, key=fg.random.key(1), train=True)
    assert torch.equal(y1, y2), "same key, same output"
    assert int(new_state["1.num_batches_tracked"]) == 1
    _unchanged(saved[0], params, "params")
    _unchanged(saved[1], state, "state")
    assert torch.equal(x, x_saved), "apply mutated its input"


@pytest.mark.parametrize("channels", [1, 3])
def test_channels_last_keeps_values_and_makes_convolutions_channels_last(channels: int) -> None:
    x = torch.randn(2, channels, 5, 6)
    w = torch.randn(4, channels, 3, 3)
    y = fg.nn.channels_last(x)
    assert torch.equal(y, x), "channels_last changed the values"
    out = torch.nn.functional.conv2d(y, w, padding=1)
    assert out.stride()[1] == 1, "channels-last output (NHWC strides)"
    plain = torch.nn.functional.conv2d(x, w, padding=1)
    assert plain.stride()[1] != 1, "the plain NCHW input is the case that differs"
    torch.testing.assert_close(out, plain)
