"""Hypothesis strategies for funcgraph's inputs: tensors, keys, params, padded sequences,
few-shot tasks and factory configs (valid and deliberately broken).

Import as ``from funcgraph.testing import strategies as fst``. This module needs the
``hypothesis`` package (``pip install "funcgraph[test]"``; without it the import raises an
ImportError saying so); the rest of :mod:`funcgraph.testing` does not.

Values are drawn element by element (they shrink to small, readable counterexamples), so keep
shapes small: the defaults stay at 4-5 per side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

try:
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ImportError as e:  # the one dependency the rest of funcgraph.testing does without
    raise ImportError(
        'funcgraph.testing.strategies needs hypothesis: pip install "funcgraph[test]"'
    ) from e

from .. import random
from ..errors import ConfigError
from ..model import Model

Strategy = st.SearchStrategy

_NUMPY_FLOAT: dict[torch.dtype, tuple[Any, Literal[16, 32, 64]]] = {
    torch.float16: (np.float16, 16),
    torch.bfloat16: (np.float32, 32),  # numpy has no bfloat16: draw float32, then round
    torch.float32: (np.float32, 32),
    torch.float64: (np.float64, 64),
}
_NUMPY_INT: dict[torch.dtype, Any] = {
    torch.int8: np.int8, torch.uint8: np.uint8, torch.int16: np.int16,
    torch.int32: np.int32, torch.int64: np.int64,
}


def available_devices() -> list[str]:
    """``"cpu"`` plus every CUDA device and MPS that torch sees on this machine."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        found.append("mps")
    return found


def devices() -> Strategy[str]:
    """One of :func:`available_devices`; shrinks to ``"cpu"``."""
    return st.sampled_from(available_devices())


def shapes(
    *, min_dims: int = 1, max_dims: int = 4, min_side: int = 1, max_side: int = 5
) -> Strategy[tuple[int, ...]]:
    """Tensor shapes with ``min_dims..max_dims`` dims of ``min_side..max_side`` each."""
    return st.lists(
        st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims
    ).map(tuple)


def _arrays(dtype: torch.dtype, shape: tuple[int, ...], low: float, high: float) -> Strategy[Any]:
    if dtype in _NUMPY_FLOAT:
        np_dtype, width = _NUMPY_FLOAT[dtype]
        elements: Strategy[Any] = st.floats(
            low, high, allow_nan=False, allow_infinity=False, width=width
        )
        return hnp.arrays(np_dtype, shape, elements=elements)
    if dtype in _NUMPY_INT:
        info = np.iinfo(_NUMPY_INT[dtype])
        ints = st.integers(max(int(np.ceil(low)), int(info.min)), min(int(high), int(info.max)))
        return hnp.arrays(_NUMPY_INT[dtype], shape, elements=ints)
    if dtype == torch.bool:
        return hnp.arrays(np.bool_, shape, elements=st.booleans())
    supported = [*_NUMPY_FLOAT, *_NUMPY_INT, torch.bool]
    raise ConfigError(f"tensors: dtype must be one of {supported}, got {dtype}")


def tensors(
    shape: Sequence[int] | Strategy[tuple[int, ...]] | None = None,
    *,
    dtype: torch.dtype | Strategy[torch.dtype] = torch.float32,
    device: str | torch.device | Strategy[str] = "cpu",
    min_value: float = -10.0,
    max_value: float = 10.0,
) -> Strategy[Tensor]:
    """Tensors of finite values in ``[min_value, max_value]``.

    Arguments:
        shape: a fixed shape, a strategy of shapes, or ``None`` for :func:`shapes` defaults.
        dtype: a dtype or a strategy of dtypes (floating, integer or ``torch.bool``).
        device: a device or a strategy such as :func:`devices`.
        min_value: the low end of the value range (integers are drawn from its integer part).
        max_value: the high end of the value range.

    Example::

        @given(fst.tensors((3, 4), dtype=torch.float64))
        def test_relu_is_nonnegative(x): ...
    """
    shape_st = shapes() if shape is None else (
        shape if isinstance(shape, st.SearchStrategy) else st.just(tuple(shape))
    )
    dtype_st = dtype if isinstance(dtype, st.SearchStrategy) else st.just(dtype)
    device_st = device if isinstance(device, st.SearchStrategy) else st.just(str(device))

    @st.composite
    def draw_tensor(draw: st.DrawFn) -> Tensor:
        sh, dt, dev = draw(shape_st), draw(dtype_st), draw(device_st)
        array = draw(_arrays(dt, sh, min_value, max_value))
        return torch.from_numpy(np.ascontiguousarray(array)).to(device=dev, dtype=dt)

    return draw_tensor()


def keys(*, device: str | torch.device = "cpu") -> Strategy[Tensor]:
    """funcgraph random keys from seeds in ``[0, 2**64)``; shrinks towards ``key(0)``."""
    return st.integers(0, 2**64 - 1).map(lambda seed: random.key(seed, device=device))


def params_for(
    model: Model,
    *,
    min_value: float | None = None,
    max_value: float | None = None,
    with_state: bool = False,
) -> Strategy[Any]:
    """Parameter dicts for ``model``: names, shapes and dtypes exactly as ``model.init``.

    By default the values are ``model.init(key)`` for a drawn key, i.e. realistic
    initialisations, a different one per key (a converted ``nn.Module`` draws through its
    ``reset_parameters``, see :func:`funcgraph.from_module`; with ``init="copy"`` it would give
    the module's one parameter set every time). With ``min_value``/``max_value``, every
    floating tensor is instead drawn element by element from that range (integer tensors keep
    their init values), which finds edge cases such as all-zero or saturating weights. With
    ``with_state=True`` the strategy gives ``(params, state)`` where ``state`` is the model's
    initial state.

    Example::

        @given(fst.params_for(model), fst.tensors((2, 3)))
        def test_finite(params, x): ...
    """
    if (min_value is None) != (max_value is None):
        raise ConfigError("params_for: give both min_value and max_value, or neither; got "
                          f"min_value={min_value!r}, max_value={max_value!r}")

    @st.composite
    def draw_params(draw: st.DrawFn) -> Any:
        k = draw(keys())
        params, state = model.init(k)
        if min_value is not None and max_value is not None:
            params = {
                name: draw(tensors(tuple(t.shape), dtype=t.dtype, device=str(t.device),
                                   min_value=min_value, max_value=max_value))
                if t.is_floating_point() else t
                for name, t in params.items()
            }
        return (params, state) if with_state else params

    return draw_params()


def padded_sequences(
    features: int = 3,
    *,
    min_batch: int = 1,
    max_batch: int = 4,
    min_length: int = 1,
    max_length: int = 6,
    dtype: torch.dtype = torch.float32,
    min_value: float = -3.0,
    max_value: float = 3.0,
) -> Strategy[tuple[Tensor, Tensor]]:
    """Padded batches ``(inputs (B, T, F), lengths (B,) int64)``, the input of
    ``funcgraph.nn.lstm``/``gru`` with ``batch_first=True``.

    ``T`` is the longest length in the batch; steps at and after a sequence's length are zero.
    Lengths range over ``min_length..max_length`` (length-1 sequences included by default).
    """
    if min_length < 1 or max_length < min_length:
        raise ConfigError(
            f"padded_sequences: need 1 <= min_length <= max_length, got min_length={min_length!r}, "
            f"max_length={max_length!r}"
        )

    @st.composite
    def draw_batch(draw: st.DrawFn) -> tuple[Tensor, Tensor]:
        lengths = draw(st.lists(st.integers(min_length, max_length),
                                min_size=min_batch, max_size=max_batch))
        steps = max(lengths)
        x = draw(tensors((len(lengths), steps, features), dtype=dtype,
                         min_value=min_value, max_value=max_value))
        lens = torch.tensor(lengths, dtype=torch.int64)
        valid = torch.arange(steps) < lens.unsqueeze(-1)  # (B, T)
        return x * valid.unsqueeze(-1).to(dtype), lens

    return draw_batch()


def task_specs(
    *,
    min_ways: int = 2,
    max_ways: int = 5,
    max_shots: int = 3,
    max_queries: int = 3,
) -> Strategy[Any]:
    """``funcgraph.data.TaskSpec`` values (N-way K-shot, Q queries).

    The bounds are checked up front by ``TaskSpec`` itself, so ``min_ways=1`` raises its
    ``TaskSpecError`` ("1-way tasks have nothing to classify") instead of generating nothing.
    """
    from ..data import TaskSpec

    TaskSpec(min_ways, 1, 1)  # validate the bounds now, with TaskSpec's own message
    TaskSpec(max_ways, max_shots, max_queries)
    return st.builds(TaskSpec, st.integers(min_ways, max_ways), st.integers(1, max_shots),
                     st.integers(1, max_queries))


def class_datasets(
    *, min_classes: int = 2, max_classes: int = 6, per_class: int = 6, image_size: int = 8
) -> Strategy[Any]:
    """Small ``funcgraph.data.ClassDataset`` values of keyed random images in ``[0, 1)``:
    ``(classes, per_class, 1, image_size, image_size)``, cheap enough to draw per example."""
    from ..data import ClassDataset

    def make(n: int, k: Tensor) -> Any:
        images = random.uniform(k, (n, per_class, 1, image_size, image_size))
        return ClassDataset(images, [f"class{i}" for i in range(n)], f"random/{n}")

    return st.builds(make, st.integers(min_classes, max_classes), keys())


def task_batches(
    spec: Any = None,
    *,
    max_tasks: int = 3,
    image_size: int = 8,
) -> Strategy[Any]:
    """``(TaskSpec, funcgraph.data.TaskBatch)`` pairs from ``sample_tasks`` over a drawn
    :func:`class_datasets` large enough for the spec; ``spec`` is a ``TaskSpec``, a strategy
    of them, or ``None`` for :func:`task_specs`. ``1..max_tasks`` tasks per batch.

    Example::

        @given(fst.task_batches())
        def test_labels_cover_every_class(drawn):
            spec, tasks = drawn
            assert tasks.support_y.max() == spec.ways - 1
    """
    from ..data import TaskSpec, sample_tasks

    spec_st = task_specs() if spec is None else (
        spec if isinstance(spec, st.SearchStrategy) else st.just(spec)
    )

    @st.composite
    def draw_batch(draw: st.DrawFn) -> tuple[TaskSpec, Any]:
        sp: TaskSpec = draw(spec_st)
        ds = draw(class_datasets(min_classes=sp.ways, max_classes=sp.ways + 2,
                                 per_class=sp.shots + sp.queries, image_size=image_size))
        return sp, sample_tasks(draw(keys()), ds, sp, draw(st.integers(1, max_tasks)))

    return draw_batch()


_ACTIVATIONS = ("relu", "tanh", "gelu", "sigmoid", "identity")


@st.composite
def factory_configs(draw: st.DrawFn, max_layers: int = 4) -> dict[str, Any]:
    """Valid ``funcgraph.factory`` configs: a ``layers`` stack over ``input_shape (B, F)`` of
    linear layers (some sized through ``vars`` references), activations, norms, dropout and
    residual blocks. Every draw builds with ``funcgraph.factory.build``."""
    batch, width = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    config: dict[str, Any] = {"name": "generated", "vars": {}, "input_shape": [batch, width],
                              "layers": []}
    for i in range(draw(st.integers(1, max_layers))):
        kind = draw(st.sampled_from(["linear", "activation", "norm", "dropout", "residual"]))
        if kind == "linear":
            out = draw(st.integers(1, 5))
            size: Any = out
            if draw(st.booleans()):
                config["vars"][f"width{i}"] = out
                size = f"$width{i}"
            config["layers"].append({"type": "linear", "params": {"out_features": size}})
        elif kind == "activation":
            config["layers"].append(draw(st.sampled_from(_ACTIVATIONS)))
        elif kind == "norm":
            config["layers"].append({"type": "layer_norm"})
        elif kind == "dropout":
            config["layers"].append({"type": "dropout",
                                     "params": {"drop_prob": draw(st.sampled_from([0.0, 0.5]))}})
        else:
            config["layers"].append({"type": "residual", "body": [
                {"type": "linear", "params": {"out_features": "$in_shape[-1]"}}, "tanh"]})
    return config


_BREAKAGES = (
    "empty layers", "no layers", "unknown type", "negative size", "unknown variable",
    "unknown top-level key", "layers not a list",
)


def invalid_factory_configs() -> Strategy[tuple[str, dict[str, Any]]]:
    """``(what is broken, config)``: a valid :func:`factory_configs` draw with one deliberate
    mistake (an empty or missing layer list, an unknown layer type, a negative size, a
    reference to an undefined variable, an unknown top-level key, layers that are not a list).
    ``funcgraph.factory.build`` must raise ``ConfigError`` naming the config path."""

    @st.composite
    def draw_broken(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
        config = draw(factory_configs())
        what = draw(st.sampled_from(_BREAKAGES))
        layers: list[Any] = config["layers"]
        if what == "empty layers":
            config["layers"] = []
        elif what == "no layers":
            del config["layers"]
        elif what == "unknown type":
            layers.insert(draw(st.integers(0, len(layers))), {"type": "no_such_layer"})
        elif what == "negative size":
            layers.insert(0, {"type": "linear", "params": {"out_features": -3}})
        elif what == "unknown variable":
            layers.insert(0, {"type": "linear", "params": {"out_features": "$undefined_var"}})
        elif what == "unknown top-level key":
            config["layerz"] = layers
        else:
            config["layers"] = {"0": "relu"}
        return what, config

    return draw_broken()


__all__ = [
    "available_devices",
    "class_datasets",
    "devices",
    "factory_configs",
    "invalid_factory_configs",
    "keys",
    "padded_sequences",
    "params_for",
    "shapes",
    "task_batches",
    "task_specs",
    "tensors",
]
