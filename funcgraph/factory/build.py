"""Config -> Model, with shape inference on meta tensors and path-precise errors.

The builder walks the layer tree once. For each layer it resolves ``$`` references (against
``vars``, the layer's input shape ``$in_shape`` and the output shapes so far ``$shapes``),
fills omitted input sizes from the input shape, checks the params against the constructor's
signature, builds the children of a block, calls the constructor, and then runs the new
layer's ``init`` and ``apply`` on ``torch.device("meta")`` tensors: shapes and parameter counts
without real compute. Every failure is a :class:`ConfigError` naming the config path.

Schema (JSON shown; TOML and YAML have the same structure)::

    {"name": "mlp", "vars": {"hidden": 64}, "input_shape": [1, 784],
     "layers": [{"type": "linear", "params": {"out_features": "$hidden"}},
                "relu",
                {"type": "linear", "name": "head", "params": {"out_features": 10},
                 "init": {"weight": {"type": "kaiming_normal"}, "bias": "zeros"}}]}
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .. import nn
from ..errors import ConfigError, FuncgraphError
from ..model import Model
from ..params import Params, State, add_prefix, count
from .config import (
    MAX_LAYERS,
    TOO_MANY_LAYERS,
    TOP_KEYS,
    Variables,
    apply_overrides,
    at,
    check_depth,
    describe,
    error,
    suggest,
)
from .inits import with_init
from .layer_type import LayerType, Slot
from .meta_tensors import MAX_NUMEL, meta_init
from .registry import REGISTRY, Registry
from .values import check_params, coerce

_NODE_KEYS = ("type", "name", "params", "init")
_NAME = re.compile(r"^[A-Za-z0-9_]+$")


@dataclass(frozen=True)
class LayerRow:
    """One line of the summary: a layer's param prefix, type, output shape and param count."""

    module: str
    type: str
    depth: int
    output_shape: Any
    params: int
    path: str


@dataclass(frozen=True)
class Built:
    """A built model with what was learned while building it.

    Attributes:
        model: the Model (its ``meta["config"]`` holds the config with overrides applied).
        rows: one per layer, parents before children, depth 0 at the top.
        input_shape: the declared input shape (batch dim included; a tuple of shapes for
            several inputs), or None.
        output_shape: the inferred output shape (a tuple, or a structure of them), or None.
        total_params: number of trainable elements.
    """

    model: Model
    rows: tuple[LayerRow, ...]
    input_shape: Any
    output_shape: Any
    total_params: int


def shape_of(value: Any) -> Any:
    """A meta value's shape for messages and tables: a tuple, or a structure of tuples."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, list | tuple):
        return type(value)(shape_of(v) for v in value)
    if isinstance(value, Mapping):
        return {k: shape_of(v) for k, v in value.items()}
    return value


def _first_line(e: BaseException, layer: str) -> str:
    """An exception from a layer in one line; the class name only where it adds meaning
    (a ValueError or a funcgraph error from a layer is its way of saying "bad argument")."""
    lines = str(e).strip().splitlines()
    text = lines[0] if lines else ""
    if not isinstance(e, ValueError | FuncgraphError):
        text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if text.startswith(f"{layer}:") else f"{layer}: {text}"


def fmt_shape(shape: Any) -> str:
    """``(2, 8)`` for a tensor shape, the structure for several outputs, ``?`` when unknown."""
    return "?" if shape is None else str(shape)


class _Builder:
    def __init__(self, variables: Variables, registry: Registry) -> None:
        self.variables = variables
        self.registry = registry
        self.rows: list[LayerRow | None] = []
        self.shapes: dict[str, Any] = {}

    # -- one layer ------------------------------------------------------------------------
    def node(self, spec: Any, path: str, module: str, x: Any,
             depth: int) -> tuple[Model, Any, Params]:
        """Build one layer: ``(model, output on meta, params on meta)``."""
        if isinstance(spec, str):
            spec = {"type": spec}
        if not isinstance(spec, dict):
            raise error(path, 'expected a layer such as {"type": "linear", "params": {...}} '
                              f"or a type name, got {describe(spec)}")
        if "type" not in spec:
            raise error(at(path, "type"), "missing: every layer needs a type")
        kind = spec["type"]
        if not isinstance(kind, str):
            raise error(at(path, "type"), f"expected a layer type name, got {describe(kind)}")
        layer = self.registry.get(kind, at(path, "type"))
        allowed = (*_NODE_KEYS, *(s.name for s in layer.slots))
        for key in spec:
            if key not in allowed:
                hint = suggest(str(key), allowed)
                raise error(at(path, str(key)),
                            f"unknown key for {kind}{hint}; allowed: {', '.join(allowed)}")
        row = len(self.rows)
        if row >= MAX_LAYERS:
            raise error(path, f"more than {MAX_LAYERS} layers; {TOO_MANY_LAYERS}")
        self.rows.append(None)
        kwargs = self.params(layer, spec.get("params", {}), at(path, "params"), x)
        children: dict[str, Any] = {}
        outputs: dict[str, Any] = {}
        for slot in layer.slots:
            slot_x = x if slot.after is None or outputs.get(slot.after) is None else (
                outputs[slot.after])
            children[slot.name], outputs[slot.name] = self.slot(
                layer, slot, spec.get(slot.name), at(path, slot.name), module, slot_x, depth)
        model = self.construct(layer, kwargs, children, path)
        meta = self.guarded(lambda: meta_init(model), path, f"{kind} init")
        meta_params = meta[0]
        if "init" in spec:
            model = with_init(model, self.variables.resolve(spec["init"], at(path, "init")),
                              at(path, "init"), meta_params)
        y = self.output(layer, model, kwargs, outputs, x, path, meta)
        self.rows[row] = LayerRow(module, kind, depth, shape_of(y), count(meta_params), path)
        self.shapes[module] = shape_of(y)
        return model, y, meta_params

    def params(self, layer: LayerType, raw: Any, path: str, x: Any) -> dict[str, Any]:
        """Resolve references, fill inferable params from the input shape, check types."""
        if not isinstance(raw, dict):
            raise error(path, f"expected a mapping of names to values, got {describe(raw)}")
        env: dict[str, Any] = {"shapes": dict(self.shapes)}
        in_shape = None if x is None else shape_of(x)
        if in_shape is not None:
            env["in_shape"] = in_shape
        given = self.variables.resolve(raw, path, env)
        for name, rule in layer.infer.items():
            if in_shape is None:
                if name not in given:
                    raise error(at(path, name), "missing, and it cannot be inferred because the "
                                                f"config has no input_shape; give {name} or "
                                                "the config's input_shape")
                continue
            try:
                inferred = rule(in_shape)
            except (IndexError, ValueError, TypeError):
                raise error(at(path, name), f"cannot be inferred from input shape "
                                            f"{fmt_shape(in_shape)}; give {name}") from None
            if name not in given:
                given[name] = inferred
            elif given[name] != inferred and _as_list(given[name]) != _as_list(inferred):
                raise error(at(path, name), f"{describe(given[name])} does not match the input "
                                            f"shape {fmt_shape(in_shape)} ({name} would be "
                                            f"{inferred})")
        return check_params(layer.schema or layer.fn, given, path, what=layer.name,
                    exclude=(*(s.name for s in layer.slots), *layer.hidden),
                    positive=layer.positive)

    def slot(self, layer: LayerType, slot: Slot, value: Any, path: str, module: str, x: Any,
             depth: int) -> tuple[Any, Any]:
        if value is None:
            if slot.required:
                raise error(path, f"missing: {layer.name} needs {slot.name}")
            return None, None
        prefix = _join(module, slot.name) if slot.prefix else module
        if slot.kind == "chain":
            model, y, _ = self.chain(value, path, prefix, x, depth + 1,
                                     name=slot.name if slot.prefix else layer.name)
            return model, y
        if not isinstance(value, list) or not value:
            raise error(path, f"expected a non-empty list of branches, got {describe(value)}")
        branches: dict[str, Model] = {}
        outs = []
        for i, item in enumerate(value):
            name = self.child_name(item, i, at(path, i), branches)
            branches[name], y, _ = self.node(item, at(path, i), _join(prefix, name), x,
                                             depth + 1)
            outs.append(y)
        return branches, outs

    def chain(self, value: Any, path: str, module: str, x: Any, depth: int,
              name: str) -> tuple[Model, Any, Params]:
        """One layer (a mapping) or a list of layers run in order (a ``serial``)."""
        if not isinstance(value, list):
            return self.node(value, path, module, x, depth)
        if not value:
            raise error(path, "expected at least one layer, got an empty list")
        children: dict[str, Model] = {}
        params: Params = {}  # a serial has no params of its own: its children's, prefixed
        for i, item in enumerate(value):
            child = self.child_name(item, i, at(path, i), children)
            children[child], x, child_params = self.node(item, at(path, i), _join(module, child),
                                                         x, depth)
            params.update(add_prefix(child_params, child))
        return nn.serial(children, name=name), x, params

    def child_name(self, item: Any, index: int, path: str, taken: Mapping[str, Any]) -> str:
        name = item.get("name", str(index)) if isinstance(item, dict) else str(index)
        if not isinstance(name, str) or not _NAME.match(name):
            raise error(at(path, "name"), "expected a name of letters, digits and underscores, "
                                           f"got {describe(name)}")
        if name in taken:
            raise error(at(path, "name"), f"duplicate layer name {describe(name)} in this block")
        return name

    # -- user code boundaries -------------------------------------------------------------
    def guarded(self, thunk: Any, path: str, what: str) -> Any:
        """Run a layer's own code; any exception it raises (a ConfigError from a constructor
        included, which knows no config path) becomes a ConfigError at ``path``."""
        try:
            return thunk()
        except Exception as e:
            raise error(path, _first_line(e, what)) from None

    def construct(self, layer: LayerType, kwargs: dict[str, Any], children: dict[str, Any],
                  path: str) -> Model:
        try:
            model = layer.fn(**kwargs, **children)
        except Exception as e:  # the layer's own error: see guarded
            message = str(e)
            named = [k for k in kwargs if re.search(rf"\b{re.escape(k)}\b", message)]
            where = at(at(path, "params"), named[0]) if len(named) == 1 else path
            raise error(where, _first_line(e, layer.name)) from None
        if not isinstance(model, Model):
            raise error(path, f"{layer.name} returned {type(model).__name__}, not a Model")
        return model

    def output(self, layer: LayerType, model: Model, kwargs: dict[str, Any],
               outputs: dict[str, Any], x: Any, path: str,
               meta: tuple[Params, State]) -> Any:
        """The layer's output on meta tensors (or by its shape rule), None without input."""
        if x is None:
            return None
        check = layer.check
        if check is not None:
            message = self.guarded(lambda: check(x, outputs, kwargs), path, f"{layer.name} check")
            if message:
                raise error(path, message)
        rule = layer.shape_rule
        if layer.meta_run:
            try:
                with torch.device("meta"):
                    y, _ = model.apply(meta[0], meta[1], x)
                return y
            except Exception as e:  # no meta kernel, data-dependent code, or a real mismatch
                if rule is None:
                    raise error(path, f"{layer.name} cannot take input of shape "
                                      f"{fmt_shape(shape_of(x))}: {_first_line(e, layer.name)}"
                                ) from None
        if rule is None:  # registry.add guarantees a rule when meta_run is False
            raise error(path, f"{layer.name}: registered without a way to infer its output shape")
        out_shape = self.guarded(lambda: rule(shape_of(x), **kwargs), path,
                                 f"{layer.name} shape rule")
        return torch.empty(tuple(out_shape), device="meta")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _as_list(value: Any) -> Any:
    return list(value) if isinstance(value, tuple | list) else [value]


def build(
    config: Mapping[str, Any],
    overrides: Mapping[str, str] | None = None,
    *,
    input_shape: Sequence[int] | None = None,
    registry: Registry = REGISTRY,
) -> Built:
    """Build a Model from a config mapping.

    Arguments:
        config: the parsed config (see the module docstring for the schema).
        overrides: ``--set`` pairs (:func:`~funcgraph.factory.parse_overrides`).
        input_shape: the input shape with batch dim; replaces the config's ``input_shape``.
        registry: where type names resolve (the global one by default).
    Returns:
        :class:`Built`: the model plus the per-layer summary.
    Raises:
        ConfigError: with the config path of the first problem.
    """
    if not isinstance(config, Mapping):
        raise ConfigError(f"a config must be a mapping at the top, got {describe(config)}")
    check_depth(config)
    config = apply_overrides(config, overrides or {})
    check_depth(config)  # an override's value may nest too
    for key in config:
        if key not in TOP_KEYS:
            raise error(str(key), f"unknown top-level key{suggest(str(key), TOP_KEYS)}; "
                                  f"allowed: {', '.join(TOP_KEYS)}")
    raw_vars = config.get("vars", {})
    if not isinstance(raw_vars, dict):
        raise error("vars", f"expected a mapping of names to values, got {describe(raw_vars)}")
    variables = Variables(raw_vars)
    variables.all()
    name = config.get("name", "model")
    if not isinstance(name, str):
        raise error("name", f"expected a string, got {describe(name)}")
    shape = _input_shape(config, variables, input_shape)
    x = _input_value(config, variables, shape)
    builder = _Builder(variables, registry)
    if ("layers" in config) == ("model" in config):
        raise error("layers", "a config needs exactly one of layers (a list run in order) "
                              "or model (one layer or block)")
    if "layers" in config:
        if not isinstance(config["layers"], list):
            raise error("layers", f"expected a list of layers, got {describe(config['layers'])}")
        if len(config["layers"]) > MAX_LAYERS:  # the common case, refused before any is built
            raise error("layers", f"{len(config['layers'])} layers; {TOO_MANY_LAYERS}")
        model, y, params = builder.chain(config["layers"], "layers", "", x, 0, name=name)
    else:
        model, y, params = builder.node(config["model"], "model", "", x, 0)
    if "init" in config:
        model = with_init(model, variables.resolve(config["init"], "init"), "init", params)
    model = dataclasses.replace(model, meta={**model.meta, "config": config,
                                             "input_shape": shape})
    rows = tuple(r for r in builder.rows if r is not None)
    return Built(model, rows, shape, shape_of(y), count(params))


def _input_shape(config: Mapping[str, Any], variables: Variables,
                 override: Sequence[int] | None) -> Any:
    """The declared input: a shape (list of ints) or, for models taking several tensors
    (tokens and mask), a list of shapes."""
    raw = list(override) if override is not None else config.get("input_shape")
    if raw is None:
        return None
    value = variables.resolve(raw, "input_shape")
    several = isinstance(value, list) and bool(value) and all(isinstance(v, list) for v in value)
    shapes = [coerce(v, tuple[int, ...], at("input_shape", i)) for i, v in enumerate(value)
              ] if several else [coerce(value, tuple[int, ...], "input_shape")]
    if any(not s or any(d < 0 for d in s) for s in shapes):
        raise error("input_shape", "expected a list of non-negative ints (or a list of such "
                                   f"lists), got {describe(raw)}")
    for s in shapes:
        if math.prod(s) > MAX_NUMEL:
            raise error("input_shape", f"{list(s)} has {math.prod(s):.3g} elements; a torch "
                                       f"tensor holds at most 2**63 - 1 ({MAX_NUMEL:.3g})")
    return tuple(shapes) if several else shapes[0]


def _input_value(config: Mapping[str, Any], variables: Variables, shape: Any) -> Any:
    """Meta tensors of the declared input shape(s) and ``input_dtype`` (one name or a list)."""
    if shape is None:
        return None
    raw = variables.resolve(config.get("input_dtype", "float32"), "input_dtype")
    if isinstance(shape[0], tuple):
        names = raw if isinstance(raw, list) else [raw] * len(shape)
        if len(names) != len(shape):
            raise error("input_dtype", f"expected {len(shape)} dtype names (one per input), "
                                       f"got {describe(raw)}")
        dtypes = [coerce(n, torch.dtype, at("input_dtype", i)) for i, n in enumerate(names)]
        return tuple(torch.empty(s, dtype=d, device="meta")
                     for s, d in zip(shape, dtypes, strict=True))
    return torch.empty(shape, dtype=coerce(raw, torch.dtype, "input_dtype"), device="meta")


__all__ = ["Built", "LayerRow", "build", "fmt_shape", "shape_of"]
