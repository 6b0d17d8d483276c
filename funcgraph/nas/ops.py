"""The eight DARTS candidate operations, as pure Models (Liu et al., 2019, ``operations.py``),
and the search spaces built from them or from user operations.

Every op maps ``(B, C, H, W)`` to ``(B, C, H, W)`` at stride 1 and to ``(B, C, H/2, W/2)`` at
stride 2. Convolutions come in ReLU-conv-BN order; ``affine=False`` gives the parameter-free
batch norm DARTS uses during the search (so the architecture weights, not per-op scales,
decide which op matters). Names match the original ``nn.Module`` layout (``op.1.weight``,
``conv_1.weight``, ``bn.running_mean``) so a torch reference loads our params directly.

A search space is a sequence of primitives, in the order of the architecture columns. A
primitive is the name of a known op (one of :data:`OPS`, or one given to :func:`register_op`)
or a ``(name, factory)`` pair, where ``factory(C, stride) -> Model`` builds the op for a cell
of width ``C`` at stride 1 or 2. A factory, not a Model: one network needs each op at every
cell width (C doubles at each reduction) and at stride 2 on a reduction cell's input edges.
:func:`load_space` reads a space from a JSON file of op names.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ArgumentTypeError, ConfigError, ShapeError
from ..model import Model
from ..nn import Children, batch_norm, composite, conv2d, identity, lift, relu, serial
from ..params import Params, State
from ..random import Key

PRIMITIVES: tuple[str, ...] = (
    "none",
    "max_pool_3x3",
    "avg_pool_3x3",
    "skip_connect",
    "sep_conv_3x3",
    "sep_conv_5x5",
    "dil_conv_3x3",
    "dil_conv_5x5",
)
"""The DARTS search space, in the paper's order (the order of the architecture columns)."""

OpBuilder = Callable[[int, int, bool], Model]
"""``builder(C, stride, affine) -> Model``: how a space builds each of its ops."""
OpFactory = Callable[[int, int], Model]
"""A user op: ``factory(C, stride) -> Model`` mapping ``(B, C, H, W)`` to
``(B, C, ceil(H / stride), ceil(W / stride))``. It builds the same op for the search and the
final network (the built-in ops' ``affine`` switch is theirs alone)."""
Primitive = str | tuple[str, OpFactory]
"""One candidate op of a search space: a known op name or a ``(name, factory)`` pair."""


def relu_conv_bn(
    c_in: int, c_out: int, kernel_size: int, stride: int, padding: int, *, affine: bool = True
) -> Model:
    """ReLU, conv (no bias), batch norm: the cells' input preprocessing."""
    return serial({"op": serial(
        relu(),
        conv2d(c_in, c_out, kernel_size, stride=stride, padding=padding, bias=False),
        batch_norm(c_out, affine=affine),
    )}, name="relu_conv_bn")


def dil_conv(
    c_in: int, c_out: int, kernel_size: int, stride: int, padding: int, dilation: int,
    *, affine: bool = True,
) -> Model:
    """ReLU, dilated depthwise conv, pointwise conv, batch norm."""
    return serial({"op": serial(
        relu(),
        conv2d(c_in, c_in, kernel_size, stride=stride, padding=padding, dilation=dilation,
               groups=c_in, bias=False),
        conv2d(c_in, c_out, 1, bias=False),
        batch_norm(c_out, affine=affine),
    )}, name="dil_conv")


def sep_conv(
    c_in: int, c_out: int, kernel_size: int, stride: int, padding: int, *, affine: bool = True
) -> Model:
    """A depthwise-separable conv applied twice (only the first one strides), as in DARTS."""
    return serial({"op": serial(
        relu(),
        conv2d(c_in, c_in, kernel_size, stride=stride, padding=padding, groups=c_in, bias=False),
        conv2d(c_in, c_in, 1, bias=False),
        batch_norm(c_in, affine=affine),
        relu(),
        conv2d(c_in, c_in, kernel_size, padding=padding, groups=c_in, bias=False),
        conv2d(c_in, c_out, 1, bias=False),
        batch_norm(c_out, affine=affine),
    )}, name="sep_conv")


def factorized_reduce(c_in: int, c_out: int, *, affine: bool = True) -> Model:
    """Halve H and W with two stride-2 1x1 convs on offset grids, concatenated: a skip
    connection that changes resolution without discarding every other pixel."""
    if c_out % 2:
        raise ConfigError(f"factorized_reduce: c_out must be even (two halves of c_out // 2 "
                          f"channels), got {c_out!r}")
    children = {
        "conv_1": conv2d(c_in, c_out // 2, 1, stride=2, bias=False),
        "conv_2": conv2d(c_in, c_out // 2, 1, stride=2, bias=False),
        "bn": batch_norm(c_out, affine=affine),
    }

    def forward(run: Children, x: Tensor) -> Tensor:
        if x.shape[-1] % 2 or x.shape[-2] % 2:
            raise ShapeError(f"factorized_reduce: H and W must be even, got {tuple(x.shape)}; "
                             "DARTS networks need image sides divisible by 4")
        x = torch.relu(x)
        out = torch.cat([run("conv_1", x), run("conv_2", x[:, :, 1:, 1:])], dim=1)
        return run("bn", out)

    return composite("factorized_reduce", children, forward)


def _window3(x: Tensor, pad_value: float, combine: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """Combine each pixel's 3x3 neighbourhood (padded with ``pad_value``), separably."""
    h, w = x.shape[-2:]
    p = F.pad(x, (1, 1, 1, 1), value=pad_value)
    rows = combine(combine(p[..., 0:h, :], p[..., 1:h + 1, :]), p[..., 2:h + 2, :])
    return combine(combine(rows[..., 0:w], rows[..., 1:w + 1]), rows[..., 2:w + 2])


def max_pool_3x3(stride: int) -> Model:
    """``F.max_pool2d(x, 3, stride, 1)`` as shifted maxima: the same values, but much faster
    than torch 2.13's CPU kernel at the small sizes a search uses (the search's hot spot)."""

    def fn(x: Tensor) -> Tensor:
        return _window3(x, -torch.inf, torch.maximum)[..., ::stride, ::stride]

    return lift(fn, "max_pool_3x3", stride=stride)


def avg_pool_3x3(stride: int) -> Model:
    """``F.avg_pool2d(x, 3, stride, 1, count_include_pad=False)`` as shifted sums divided by
    the number of in-image pixels of each window (fast for the same reason as max pooling)."""

    def fn(x: Tensor) -> Tensor:
        ones = torch.ones((1, 1, *x.shape[-2:]), dtype=x.dtype, device=x.device)
        avg = _window3(x, 0.0, torch.add) / _window3(ones, 0.0, torch.add)
        return avg[..., ::stride, ::stride]

    return lift(fn, "avg_pool_3x3", stride=stride)


def zero(stride: int) -> Model:
    """The ``none`` op: zeros of the output shape (it still carries the input's graph)."""
    return lift(lambda x: x[:, :, ::stride, ::stride] * 0.0, "zero", stride=stride)


OPS: dict[str, OpBuilder] = {
    "none": lambda c, stride, affine: zero(stride),
    "max_pool_3x3": lambda c, stride, affine: max_pool_3x3(stride),
    "avg_pool_3x3": lambda c, stride, affine: avg_pool_3x3(stride),
    "skip_connect": lambda c, stride, affine: (
        identity() if stride == 1 else factorized_reduce(c, c, affine=affine)
    ),
    "sep_conv_3x3": lambda c, stride, affine: sep_conv(c, c, 3, stride, 1, affine=affine),
    "sep_conv_5x5": lambda c, stride, affine: sep_conv(c, c, 5, stride, 2, affine=affine),
    "dil_conv_3x3": lambda c, stride, affine: dil_conv(c, c, 3, stride, 2, 2, affine=affine),
    "dil_conv_5x5": lambda c, stride, affine: dil_conv(c, c, 5, stride, 4, 2, affine=affine),
}
"""``OPS[name](C, stride, affine) -> Model``, one entry per primitive, in PRIMITIVES' order."""


REGISTERED_OPS: dict[str, OpFactory] = {}
"""User ops known by name (:func:`register_op`): what a space file or a run config can name."""


def register_op(
    name: str, factory: OpFactory | None = None, *, replace: bool = False
) -> Callable[..., Any]:
    """Make ``factory(C, stride) -> Model`` known as the op ``name``, so a space names it like
    a built-in op (in :func:`load_space` files and ``SearchConfig.primitives``, which hold only
    names). Usable as a decorator; importing the module that registers (``--import MODULE``)
    makes the name available to a command. A taken name is a ConfigError unless ``replace``.

    Example::

        @register_op("custom.conv_1x1")
        def conv_1x1(C: int, stride: int) -> Model:
            return serial(relu(), conv2d(C, C, 1, stride=stride, bias=False))
    """

    def decorate(f: OpFactory) -> OpFactory:
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ConfigError("register_op: name must be a non-empty string without surrounding "
                              f"spaces, got {name!r}")
        if name in OPS or (name in REGISTERED_OPS and not replace):
            raise ConfigError(f"register_op: op {name!r} is already known ({_known_list()}); "
                              "pick another name (user ops conventionally start with 'custom.') "
                              "or pass replace=True for a registered one")
        REGISTERED_OPS[name] = _checked_factory(name, f, "register_op")
        return f

    return decorate if factory is None else decorate(factory)


def known_ops() -> list[str]:
    """Every op name a space may use without a factory: the built-in ops, then registered ones."""
    return [*OPS, *REGISTERED_OPS]


def _known_list() -> str:
    return f"known ops: {known_ops()}"


def _checked_factory(name: str, factory: Any, where: str) -> OpFactory:
    """``factory`` as a user op whose Models check their output shape (so a wrong op is named
    where it runs, not found as a mismatch deep inside a mixed op or a cell)."""
    if isinstance(factory, Model):
        raise ArgumentTypeError(
            f"{where}: op {name!r}: expected a factory (C, stride) -> Model, got the Model "
            f"{factory.name!r}; one network needs the op at every cell width and at stride 2 on "
            f"reduction edges, so wrap it: ({name!r}, lambda C, stride: ...)")
    if not callable(factory):
        raise ArgumentTypeError(f"{where}: op {name!r}: expected a factory (C, stride) -> Model, "
                                f"got {type(factory).__name__} {factory!r}")

    def build(c: int, stride: int) -> Model:
        op = factory(c, stride)
        if not isinstance(op, Model):
            raise ArgumentTypeError(f"op {name!r}: factory(C={c}, stride={stride}) must return a "
                                    f"Model, got {type(op).__name__}")

        def apply(params: Params, state: State, x: Any, *, key: Key | None = None,
                  train: bool = False) -> tuple[Any, State]:
            y, new_state = op.apply(params, state, x, key=key, train=train)
            b, _, h, w = x.shape
            want = (b, c, (h - 1) // stride + 1, (w - 1) // stride + 1)
            if not isinstance(y, Tensor) or tuple(y.shape) != want:
                got = tuple(y.shape) if isinstance(y, Tensor) else type(y).__name__
                raise ShapeError(f"op {name!r} (C={c}, stride={stride}): expected output {want} "
                                 f"for input {tuple(x.shape)}, got {got}")
            return y, new_state

        return dataclasses.replace(op, apply=apply)

    return build


def space_ops(primitives: Sequence[Primitive], *, where: str = "space") -> dict[str, OpBuilder]:
    """``{name: builder(C, stride, affine)}`` of a search space, in its order, after checking
    it: a non-empty sequence of known op names and ``(name, factory)`` pairs with distinct
    names, at least one of them not ``none``. ``where`` starts the error messages."""
    if isinstance(primitives, str) or not isinstance(primitives, Sequence) or not primitives:
        raise ConfigError(f"{where}: primitives must be a non-empty list of op names or "
                          f"(name, factory) pairs, got {primitives!r}")
    ops: dict[str, OpBuilder] = {}
    for i, primitive in enumerate(primitives):
        at = f"{where}: primitives[{i}]"
        if isinstance(primitive, str):
            name, builder = primitive, _known(primitive)
            if builder is None:
                raise ConfigError(
                    f"{at}: unknown op {name!r}; {_known_list()}; a user op is a (name, factory) "
                    "pair or a name given to register_op (from code that --import MODULE loads)")
        elif isinstance(primitive, tuple | list) and len(primitive) == 2:
            name, factory = primitive
            if not isinstance(name, str) or not name.strip():
                raise ConfigError(f"{at}: the name of a (name, factory) pair must be a non-empty "
                                  f"string, got {name!r}")
            if _known(name) is not None:
                raise ConfigError(f"{at}: {name!r} is already a known op; give a known op by its "
                                  "name alone, and a user op a name of its own")
            builder = _ignore_affine(_checked_factory(name, factory, at))
        else:
            raise ConfigError(f"{at}: expected an op name or a (name, factory) pair, got "
                              f"{primitive!r}")
        if name in ops:
            raise ConfigError(f"{at}: op {name!r} appears twice; every op of a space needs its "
                              "own name (the genotype refers to ops by name)")
        ops[name] = builder
    if set(ops) == {"none"}:
        raise ConfigError(f"{where}: primitives must hold an op besides 'none' (a derived cell "
                          f"never picks 'none'), got {list(ops)}")
    return ops


def _ignore_affine(factory: OpFactory) -> OpBuilder:
    return lambda c, stride, affine: factory(c, stride)


def _known(name: str) -> OpBuilder | None:
    """The builder of a built-in or registered op, or None for an unknown name."""
    if name in OPS:
        return OPS[name]
    if name in REGISTERED_OPS:
        return _ignore_affine(REGISTERED_OPS[name])
    return None


def primitive_names(primitives: Sequence[Primitive], *, where: str = "space") -> tuple[str, ...]:
    """The op names of a space (checked as :func:`space_ops` does), in its order."""
    return tuple(space_ops(primitives, where=where))


def make_op(
    name: str, c: int, stride: int, *, affine: bool = True,
    primitives: Sequence[Primitive] | None = None,
) -> Model:
    """The op ``name`` on ``c`` channels, from ``primitives`` or, by default, from every known
    op (:func:`known_ops`); a ConfigError for an unknown name, listing the choices."""
    if primitives is None:
        builder, choices = _known(name), _known_list()
    else:
        ops = space_ops(primitives, where="make_op")
        builder, choices = ops.get(name), f"the space's ops: {list(ops)}"
    if builder is None:
        raise ConfigError(f"make_op: unknown op {name!r}; {choices}")
    if stride not in (1, 2):
        raise ConfigError(f"make_op: stride must be 1 or 2, got {stride!r}")
    return builder(c, stride, affine)


def load_space(path: str | Path) -> tuple[str, ...]:
    """The search space in a JSON file ``{"primitives": ["sep_conv_3x3", ...]}`` (optional
    ``"name"`` and ``"description"`` strings beside it), as the tuple of op names that
    ``search_network(primitives=...)`` and ``SearchConfig(primitives=...)`` take.

    A file holds only names: built-in ops and ops given to :func:`register_op` (the config
    never runs code; import the module that registers them first). Every mistake is a
    ConfigError naming the file and the key.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"search space file {p} not found (expected a JSON file such as "
                          '{"primitives": ["sep_conv_3x3", "skip_connect"]})')
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"search space file {p} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a JSON object with a 'primitives' list, got "
                          f"{type(data).__name__}")
    extra = sorted(set(data) - {"primitives", "name", "description"})
    if extra:
        raise ConfigError(f"{p}: unknown keys {extra}; a space file has 'primitives' (and "
                          "optionally 'name', 'description')")
    for key in ("name", "description"):
        if not isinstance(data.get(key, ""), str):
            raise ConfigError(f"{p}: {key} must be a string, got {data[key]!r}")
    primitives = data.get("primitives")
    if not isinstance(primitives, list) or not all(isinstance(n, str) for n in primitives):
        raise ConfigError(f"{p}: primitives must be a list of op names (strings), got "
                          f"{primitives!r}")
    return primitive_names(primitives, where=str(p))


__all__ = [
    "OPS",
    "PRIMITIVES",
    "REGISTERED_OPS",
    "OpBuilder",
    "OpFactory",
    "Primitive",
    "avg_pool_3x3",
    "dil_conv",
    "factorized_reduce",
    "known_ops",
    "load_space",
    "make_op",
    "max_pool_3x3",
    "primitive_names",
    "register_op",
    "relu_conv_bn",
    "sep_conv",
    "space_ops",
    "zero",
]
