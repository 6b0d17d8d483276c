"""Init specs, per layer and per tensor, drawn purely from keys::

    "init": {"weight": {"type": "kaiming_normal", "mode": "fan_out"}, "bias": "zeros"}

Each initialiser is ``fn(key, shape, dtype, **options) -> Tensor`` drawn purely from a
funcgraph key, with the options and defaults of its ``torch.nn.init`` namesake (so a spec
reads like the torch call it replaces). :func:`with_init` wraps a Model so that ``init(key)``
first runs the layer's own init, then redraws the tensors the spec names; the redraws use
keys folded from the model key and the tensor's index, so the result is a pure function of
the key.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from .. import random
from ..errors import ConfigError, ShapeError
from ..model import Model
from ..nn.init import fan_in_and_out
from ..params import Params, State
from ..random import Key
from .config import at, describe, error, suggest
from .meta_tensors import meta_draws
from .values import check_params

Nonlinearity = Literal["linear", "conv1d", "conv2d", "conv3d", "sigmoid", "tanh", "relu",
                       "leaky_relu", "selu"]
Initializer = Callable[..., Tensor]
_INIT_SALT = 0x1417  # separates spec redraws from the stream the layer's own init used


def _fans(shape: Sequence[int], fn: str) -> tuple[int, int]:
    if len(shape) < 2:
        raise ShapeError(f"{fn}: needs a tensor with >= 2 dims (fan in and out), "
                         f"got shape {tuple(shape)}")
    return fan_in_and_out(shape)


def kaiming_normal(key: Key, shape: Sequence[int], dtype: torch.dtype, *, a: float = 0.0,
                   mode: Literal["fan_in", "fan_out"] = "fan_in",
                   nonlinearity: Nonlinearity = "leaky_relu") -> Tensor:
    """He normal: ``N(0, gain / sqrt(fan))``, as ``torch.nn.init.kaiming_normal_``."""
    fan_in, fan_out = _fans(shape, "kaiming_normal")
    std = torch.nn.init.calculate_gain(nonlinearity, a) / math.sqrt(fan_in if mode == "fan_in"
                                                                    else fan_out)
    return random.normal(key, shape, dtype=dtype) * std


def kaiming_uniform(key: Key, shape: Sequence[int], dtype: torch.dtype, *, a: float = 0.0,
                    mode: Literal["fan_in", "fan_out"] = "fan_in",
                    nonlinearity: Nonlinearity = "leaky_relu") -> Tensor:
    """He uniform: ``U(-b, b)``, ``b = gain * sqrt(3 / fan)``, as ``kaiming_uniform_``."""
    fan_in, fan_out = _fans(shape, "kaiming_uniform")
    fan = fan_in if mode == "fan_in" else fan_out
    bound = torch.nn.init.calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan)
    return random.uniform(key, shape, dtype=dtype, low=-bound, high=bound)


def xavier_normal(key: Key, shape: Sequence[int], dtype: torch.dtype, *,
                  gain: float = 1.0) -> Tensor:
    """Glorot normal: ``N(0, gain * sqrt(2 / (fan_in + fan_out)))``."""
    fan_in, fan_out = _fans(shape, "xavier_normal")
    return random.normal(key, shape, dtype=dtype) * (gain * math.sqrt(2.0 / (fan_in + fan_out)))


def xavier_uniform(key: Key, shape: Sequence[int], dtype: torch.dtype, *,
                   gain: float = 1.0) -> Tensor:
    """Glorot uniform: ``U(-b, b)``, ``b = gain * sqrt(6 / (fan_in + fan_out))``."""
    fan_in, fan_out = _fans(shape, "xavier_uniform")
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return random.uniform(key, shape, dtype=dtype, low=-bound, high=bound)


def orthogonal(key: Key, shape: Sequence[int], dtype: torch.dtype, *, gain: float = 1.0) -> Tensor:
    """A (semi-)orthogonal matrix over ``(shape[0], prod(shape[1:]))``, as ``orthogonal_``:
    QR of a normal matrix with the signs of R's diagonal folded into Q."""
    if len(shape) < 2:
        raise ShapeError(f"orthogonal: needs a tensor with >= 2 dims, got shape {tuple(shape)}")
    rows, cols = shape[0], math.prod(shape[1:])
    flat = random.normal(key, (max(rows, cols), min(rows, cols)), dtype=torch.float64)
    q, r = torch.linalg.qr(flat)  # (max, min): orthonormal columns
    q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
    if rows < cols:
        q = q.T
    return (gain * q).reshape(tuple(shape)).to(dtype)


def normal(key: Key, shape: Sequence[int], dtype: torch.dtype, *, mean: float = 0.0,
           std: float = 1.0) -> Tensor:
    """``N(mean, std)``."""
    if std < 0:
        raise ConfigError(f"normal: std must be >= 0, got {std!r}")
    return random.normal(key, shape, dtype=dtype) * std + mean


def uniform(key: Key, shape: Sequence[int], dtype: torch.dtype, *, a: float = 0.0,
            b: float = 1.0) -> Tensor:
    """``U(a, b)``."""
    if not a <= b:
        raise ConfigError(f"uniform: need a <= b, got a={a!r}, b={b!r}")
    return random.uniform(key, shape, dtype=dtype, low=a, high=b)


def trunc_normal(key: Key, shape: Sequence[int], dtype: torch.dtype, *, mean: float = 0.0,
                 std: float = 1.0, a: float = -2.0, b: float = 2.0) -> Tensor:
    """``N(mean, std)`` restricted to ``[a, b]`` (absolute bounds, as ``trunc_normal_``),
    by inverse CDF of a uniform draw between the bounds' CDF values."""
    if std <= 0 or not a < b:
        raise ConfigError(f"trunc_normal: need std > 0 and a < b, got std={std!r}, a={a!r}, "
                          f"b={b!r}")

    def cdf(v: float) -> float:
        return 0.5 * (1.0 + math.erf((v - mean) / (std * math.sqrt(2.0))))

    lo, hi = 2.0 * cdf(a) - 1.0, 2.0 * cdf(b) - 1.0
    u = random.uniform(key, shape, dtype=torch.float64, low=lo, high=hi)
    x = mean + std * math.sqrt(2.0) * torch.erfinv(u)
    return x.clamp(a, b).to(dtype)


def constant(key: Key, shape: Sequence[int], dtype: torch.dtype, *, value: float) -> Tensor:
    """Every element ``value``."""
    return torch.full(tuple(shape), value, dtype=dtype, device=key.device)


def zeros(key: Key, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
    """All zeros."""
    return torch.zeros(tuple(shape), dtype=dtype, device=key.device)


def ones(key: Key, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
    """All ones."""
    return torch.ones(tuple(shape), dtype=dtype, device=key.device)


INITIALIZERS: dict[str, Initializer] = {
    f.__name__: f
    for f in (kaiming_normal, kaiming_uniform, xavier_normal, xavier_uniform, orthogonal, normal,
              uniform, trunc_normal, constant, zeros, ones)
}
INITIALIZERS["truncated_normal"] = trunc_normal


def parse_spec(spec: Any, path: str) -> tuple[Initializer, dict[str, Any]]:
    """``"zeros"`` or ``{"type": "normal", "std": 0.02}`` -> ``(initialiser, options)``."""
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict):
        raise error(path, 'expected an init name or {"type": ..., options}, '
                          f"got {describe(spec)}")
    kind = spec.get("type")
    if not isinstance(kind, str):
        raise error(at(path, "type"), f"expected an init name, got {describe(kind)}; "
                                      f"one of {', '.join(INITIALIZERS)}")
    fn = INITIALIZERS.get(kind)
    if fn is None:
        raise error(at(path, "type"), f"unknown init {describe(kind)}{suggest(kind, INITIALIZERS)};"
                                      f" one of {', '.join(INITIALIZERS)}")
    options = {k: v for k, v in spec.items() if k != "type"}
    return fn, check_params(fn, options, path, what=f"init {kind}",
                            exclude=("key", "shape", "dtype"))


def with_init(model: Model, specs: Any, path: str, meta_params: Params) -> Model:
    """``model`` whose ``init`` redraws the params named in ``specs``.

    Arguments:
        model: the layer or block.
        specs: ``{pattern: spec}``; a pattern is a param name (``"weight"``) or a glob
            (``"*.weight"``) over the model's param names. Later patterns win.
        path: config path of the ``init`` mapping, for errors.
        meta_params: the model's params on the meta device (names, shapes, dtypes), used to
            check every spec against its tensors at build time rather than at first init.
    """
    if not isinstance(specs, dict):
        raise error(path, "expected a mapping from param name (or glob) to init spec, e.g. "
                          f'{{"weight": "kaiming_normal", "bias": "zeros"}}, got {describe(specs)}')
    names = sorted(meta_params)
    plan: dict[str, tuple[Initializer, dict[str, Any]]] = {}
    for pattern, spec in specs.items():
        where = at(path, pattern)
        matched = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            raise error(where, f"matches no parameter{suggest(pattern, names)}; "
                               f"params: {', '.join(names) or '(none)'}")
        fn, options = parse_spec(spec, where)
        for n in matched:
            t = meta_params[n]
            try:
                with meta_draws() as key:
                    fn(key, tuple(t.shape), t.dtype, **options)
            except (ValueError, RuntimeError) as e:
                raise error(where, f"{n}: {e}") from None
            plan[n] = (fn, options)
    index = {n: i for i, n in enumerate(names)}
    inner = model.init

    def init(key: Key) -> tuple[Params, State]:
        params, state = inner(key)
        salted = random.fold_in(key, _INIT_SALT)
        new = dict(params)
        for n, (fn, options) in plan.items():
            t = params[n]
            new[n] = fn(random.fold_in(salted, index[n]), tuple(t.shape), t.dtype, **options)
        return new, state

    return Model(init, model.apply, model.name, dict(model.meta))


__all__ = [
    "INITIALIZERS",
    "constant",
    "kaiming_normal",
    "kaiming_uniform",
    "normal",
    "ones",
    "orthogonal",
    "parse_spec",
    "trunc_normal",
    "uniform",
    "with_init",
    "xavier_normal",
    "xavier_uniform",
    "zeros",
]
