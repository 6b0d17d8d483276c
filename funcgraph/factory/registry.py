"""The layer registry: every type name a config may use, and nothing else.

A config never imports or executes code: ``"type": "custom.my_block"`` resolves only through
this table. Entries come from three places:

* the built-in table below (``funcgraph.nn`` layers and the ``serial``/``residual``/
  ``parallel`` blocks, plus reference models registered lazily so a module that is absent
  does not break import);
* ``@register_layer("custom.my_block")`` in user code;
* the ``funcgraph.layers`` entry-point group of installed packages (loaded on first use of
  that name).

A registered constructor takes keyword hyperparameters and returns a :class:`Model`; its
signature and type hints are the schema the config is checked against. Two optional hooks
serve shape inference: ``infer`` fills omitted params from the input shape
(``{"in_features": last_dim}``), and ``shape_rule(in_shape, **params)`` gives the output
shape when running the layer on meta tensors is impossible (data-dependent control flow).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .. import nn
from ..errors import ConfigError
from ..model import Model
from .config import at, describe, error, suggest
from .values import signature_params

Shape = tuple[int, ...]
InferRule = Callable[[Shape], Any]
ShapeRule = Callable[..., Shape]
Check = Callable[[Any, Mapping[str, Any], Mapping[str, Any]], "str | None"]
ENTRY_POINT_GROUP = "funcgraph.layers"


@dataclass(frozen=True)
class Slot:
    """A place where a block takes child layers from the config.

    Attributes:
        name: the config key (``"body"``) and the constructor keyword it is passed as.
        kind: ``"chain"`` — one layer or a list run in sequence (passed as one Model);
            ``"fan"`` — a list of branches that all see the block's input (passed as an
            ordered ``dict[str, Model]``).
        required: whether the config must give it (an optional chain is passed as ``None``).
        prefix: whether the slot's name appears in parameter names (``body.0.weight``), as
            it does for ``residual`` and not for ``serial``; used for the summary table.
        after: the earlier slot whose output this slot receives (stochastic depth's ``post``
            runs on what ``body`` returns); ``None``: the block's input.
    """

    name: str
    kind: Literal["chain", "fan"] = "chain"
    required: bool = True
    prefix: bool = True
    after: str | None = None


@dataclass(frozen=True)
class LayerType:
    """One registry entry; see the module docstring."""

    name: str
    fn: Callable[..., Model]
    infer: Mapping[str, InferRule] = field(default_factory=dict)
    slots: tuple[Slot, ...] = ()
    positive: tuple[str, ...] = ()
    shape_rule: ShapeRule | None = None
    check: Check | None = None
    schema: Callable[..., Any] | None = None
    hidden: tuple[str, ...] = ()
    meta_run: bool = True
    doc: str = ""

    @property
    def summary(self) -> str:
        """The first line of the docstring, for ``funcgraph model list``."""
        text = self.doc or (self.fn.__doc__ or "")
        return text.strip().splitlines()[0] if text.strip() else ""


@dataclass(frozen=True)
class _Lazy:
    target: str  # "module:attribute"
    options: dict[str, Any]


class Registry:
    """Type name -> :class:`LayerType`, with lazy entries and entry-point discovery."""

    def __init__(self) -> None:
        self._types: dict[str, LayerType] = {}
        self._lazy: dict[str, _Lazy] = {}

    def add(self, layer: LayerType, *, replace_existing: bool = False) -> LayerType:
        """Register ``layer``; a name already taken is a ConfigError unless replacing."""
        if not isinstance(layer.name, str) or not layer.name or layer.name != layer.name.strip():
            raise ConfigError("register_layer: name must be a non-empty string without surrounding "
                              f"spaces, got {layer.name!r}")
        if not layer.meta_run and layer.shape_rule is None:
            raise ConfigError(f"register_layer({layer.name!r}): meta_run=False needs a shape_rule")
        if not replace_existing and (layer.name in self._types or layer.name in self._lazy):
            raise ConfigError(
                f"register_layer: {layer.name!r} is already registered; pick another name "
                "(user layers conventionally start with 'custom.') or pass replace=True"
            )
        self._lazy.pop(layer.name, None)
        self._types[layer.name] = layer
        return layer

    def add_lazy(self, name: str, target: str, **options: Any) -> None:
        """Register ``name`` to be imported from ``"module:attribute"`` on first use."""
        self._lazy[name] = _Lazy(target, options)

    def remove(self, name: str) -> None:
        """Forget ``name`` (tests use it to undo a registration)."""
        self._types.pop(name, None)
        self._lazy.pop(name, None)

    def names(self) -> list[str]:
        """All names a config can use now: registered, lazy and entry points."""
        return sorted({*self._types, *self._lazy, *(ep.name for ep in entry_points())})

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str, path: str = "type") -> LayerType:
        """The entry for ``name``; ConfigError at ``path`` naming close matches if unknown."""
        if name in self._types:
            return self._types[name]
        if name in self._lazy:
            lazy = self._lazy[name]
            module_name, _, attr = lazy.target.partition(":")
            try:
                fn = getattr(importlib.import_module(module_name), attr)
            except Exception as e:  # absent, or broken in this installation: not a config bug
                raise error(
                    path, f"layer type {name!r} needs {lazy.target}, which is not available: {e}"
                ) from None
            return self.add(LayerType(name, fn, **lazy.options), replace_existing=True)
        for ep in entry_points():
            if ep.name == name:
                return self._load_entry_point(ep, path)
        raise error(path, f"unknown layer type {describe(name)}{suggest(name, self.names())}; "
                          "a type from your own code needs --import MODULE (or a "
                          f"'{ENTRY_POINT_GROUP}' entry point) to register it")

    def _load_entry_point(self, ep: importlib.metadata.EntryPoint, path: str) -> LayerType:
        try:
            obj = ep.load()
        except Exception as e:  # a broken plugin is the user's environment, not our bug
            raise error(path, f"layer type {ep.name!r}: entry point {ep.value} failed: {e}"
                        ) from None
        if isinstance(obj, LayerType):
            return self.add(replace(obj, name=ep.name), replace_existing=True)
        if callable(obj):
            return self.add(LayerType(ep.name, obj), replace_existing=True)
        raise error(path, f"layer type {ep.name!r}: entry point {ep.value} is not callable")


def entry_points() -> tuple[importlib.metadata.EntryPoint, ...]:
    """The installed ``funcgraph.layers`` entry points (``name = "pkg.module:constructor"``)."""
    return tuple(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


REGISTRY = Registry()


def register_layer(
    name: str,
    fn: Callable[..., Model] | None = None,
    *,
    infer: Mapping[str, InferRule] | None = None,
    slots: tuple[Slot, ...] = (),
    positive: tuple[str, ...] = (),
    shape_rule: ShapeRule | None = None,
    check: Check | None = None,
    schema: Callable[..., Any] | None = None,
    meta_run: bool = True,
    replace: bool = False,
    registry: Registry = REGISTRY,
) -> Any:
    """Register a layer or model constructor under ``name``; usable as a decorator.

    Example::

        @register_layer("custom.scaled_linear", infer={"in_features": last_dim})
        def scaled_linear(in_features: int, out_features: int, scale: float = 1.0) -> Model:
            ...

    Arguments:
        name: the config type name (user layers conventionally start with ``custom.``).
        fn: the constructor: keyword hyperparameters -> Model (omit to use as a decorator).
        infer: params the factory may fill from the input shape when a config omits them.
        slots: child-layer slots of a block (see :class:`Slot`).
        positive: int params that must be >= 1 (checked with the config path).
        shape_rule: ``(in_shape, **params) -> out_shape`` when meta tensors cannot run it.
        check: ``(x, slot_outputs, params) -> message | None`` to name a shape mismatch
            between children before running the block.
        schema: a function whose signature describes the params, when ``fn`` takes ``**kw``.
        meta_run: ``False`` skips the meta-tensor run and takes the output shape from
            ``shape_rule`` (for big models whose thousands of ops make the meta run slow).
        replace: allow replacing an existing entry.
    """

    def decorate(f: Callable[..., Model]) -> Callable[..., Model]:
        layer = LayerType(name, f, dict(infer or {}), tuple(slots), tuple(positive), shape_rule,
                          check, schema, meta_run=meta_run)
        registry.add(layer, replace_existing=replace)
        return f

    return decorate if fn is None else decorate(fn)


# --- shape inference rules -------------------------------------------------------------------

def last_dim(shape: Shape) -> int:
    """The feature size of ``(..., features)``: what ``linear`` and ``layer_norm`` take."""
    return shape[-1]


def channel_dim(shape: Shape) -> int:
    """The channel count of ``(B, C, ...)``: what convolutions and batch norm take."""
    return shape[1]


# --- blocks ----------------------------------------------------------------------------------

def serial_block(layers: Model) -> Model:
    """Run ``layers`` one after another (params ``0.weight``, ``fc.weight``...)."""
    return layers


def residual_block(body: Model, shortcut: Model | None = None) -> Model:
    """``body(x) + shortcut(x)``; identity shortcut when omitted (params ``body.*``)."""
    return nn.residual(body, shortcut)


def parallel_block(
    branches: dict[str, Model],
    combine: Literal["concat", "sum", "stack", "tuple"] = "concat",
    dim: int = 1,
) -> Model:
    """Run every branch on the input and combine (concat along ``dim``, sum, stack, tuple)."""
    return nn.parallel(branches, combine=combine, dim=dim)


def _shape(value: Any) -> Any:
    return tuple(value.shape) if hasattr(value, "shape") else value


def _check_residual(x: Any, outputs: Mapping[str, Any], params: Mapping[str, Any]) -> str | None:
    body = _shape(outputs["body"])
    skip_name = "shortcut" if outputs.get("shortcut") is not None else "input (identity shortcut)"
    skip = _shape(outputs["shortcut"]) if outputs.get("shortcut") is not None else _shape(x)
    if body != skip:
        return f"residual: body output shape {body} does not match {skip_name} shape {skip}"
    return None


def _check_parallel(x: Any, outputs: Mapping[str, Any], params: Mapping[str, Any]) -> str | None:
    shapes = [_shape(y) for y in outputs["branches"]]
    combine = params.get("combine", "concat")
    if combine == "tuple" or not shapes or not all(isinstance(s, tuple) for s in shapes):
        return None
    dim = params.get("dim", 1)
    first = shapes[0]
    for i, s in enumerate(shapes[1:], start=1):
        if combine == "concat":
            ok = len(s) == len(first) and -len(s) <= dim < len(s) and all(
                a == b for j, (a, b) in enumerate(zip(s, first, strict=True)) if j != dim % len(s)
            )
        else:
            ok = s == first
        if not ok:
            need = f"equal except dim {dim}" if combine == "concat" else "equal"
            return f"parallel ({combine}): branch {i} output shape {s} and branch 0 output " \
                   f"shape {first} must be {need}"
    return None


def _conv_schema() -> Callable[..., Any]:
    from ..nn.linear import _conv  # conv1d/conv2d forward **kw to it: its signature is the schema

    return _conv


_conv_positive = ("in_channels", "out_channels", "groups")
_BUILTINS: list[LayerType] = [
    LayerType("linear", nn.linear, {"in_features": last_dim},
              positive=("in_features", "out_features")),
    LayerType("conv1d", nn.conv1d, {"in_channels": channel_dim}, positive=_conv_positive,
              schema=_conv_schema(), hidden=("dims",)),
    LayerType("conv2d", nn.conv2d, {"in_channels": channel_dim}, positive=_conv_positive,
              schema=_conv_schema(), hidden=("dims",)),
    LayerType("batch_norm", nn.batch_norm, {"num_features": channel_dim},
              positive=("num_features",)),
    LayerType("conv_batch_norm", nn.conv_batch_norm, {"in_channels": channel_dim},
              positive=("in_channels", "out_channels")),
    LayerType("layer_norm", nn.layer_norm, {"normalized_shape": last_dim}),
    LayerType("group_norm", nn.group_norm, {"num_channels": channel_dim},
              positive=("num_groups", "num_channels")),
    LayerType("embedding", nn.embedding, positive=("num_embeddings", "embedding_dim")),
    LayerType("dropout", nn.dropout),
    *(LayerType(n, getattr(nn, n)) for n in (
        "relu", "gelu", "tanh", "sigmoid", "elu", "leaky_relu", "softmax", "identity", "flatten",
        "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d")),
    LayerType("serial", serial_block, slots=(Slot("layers", prefix=False),)),
    LayerType("residual", residual_block, slots=(Slot("body"), Slot("shortcut", required=False)),
              check=_check_residual),
    LayerType("parallel", parallel_block, slots=(Slot("branches", "fan", prefix=False),),
              check=_check_parallel),
]
for _layer in _BUILTINS:
    REGISTRY.add(_layer)


def sequence_features(shape: Any) -> int:
    """The feature size of a recurrent layer's input ``((B, T, F), lengths)`` or ``(B, T, F)``."""
    first = shape[0]
    return int(first[-1]) if isinstance(first, tuple) else int(shape[-1])


def _classes_rule(default: int, key: str = "num_classes") -> ShapeRule:
    """Output ``(B, classes)`` for models whose data-dependent forward cannot run on meta
    tensors; B is read from the first input."""

    def rule(in_shape: Any, **params: Any) -> Shape:
        first = in_shape[0]
        batch = first[0] if isinstance(first, tuple) else first
        return (int(batch), int(params.get(key, default)))

    return rule


# Other parts of funcgraph, registered lazily: absent modules make only their names unavailable.
_recurrent = {"infer": {"input_size": sequence_features},
              "positive": ("input_size", "hidden_size", "num_layers")}
REGISTRY.add_lazy("lstm", "funcgraph.nn.recurrent:lstm", **_recurrent)
REGISTRY.add_lazy("gru", "funcgraph.nn.recurrent:gru", **_recurrent)
REGISTRY.add_lazy("stochastic_depth", "funcgraph.factory.adapters:stochastic_depth_block",
                  slots=(Slot("body"), Slot("shortcut", required=False),
                         Slot("post", required=False, after="body")))
REGISTRY.add_lazy("conv4", "funcgraph.models.conv4:conv4", infer={"in_channels": channel_dim},
                  positive=("hidden", "in_channels", "image_size"))
REGISTRY.add_lazy("resnet12", "funcgraph.models.resnet12:resnet12",
                  infer={"in_channels": channel_dim}, positive=("in_channels", "block_size"))
REGISTRY.add_lazy("mlp", "funcgraph.models.mlp:mlp", infer={"in_features": last_dim},
                  positive=("in_features", "out_features"))
REGISTRY.add_lazy("resnet", "funcgraph.models.resnet:resnet", infer={"in_channels": channel_dim},
                  positive=("num_classes", "in_channels", "width"))
REGISTRY.add_lazy("early_exit_cnn", "funcgraph.models.early_exit:early_exit_cnn",
                  infer={"in_channels": channel_dim}, positive=("num_classes", "in_channels",
                                                                 "width"),
                  shape_rule=_classes_rule(10))
REGISTRY.add_lazy("rnn_classifier", "funcgraph.models.rnn:rnn_classifier",
                  positive=("vocab_size", "num_classes", "embed_dim", "hidden_size",
                            "num_layers"), shape_rule=_classes_rule(2))
REGISTRY.add_lazy("sequence_encoder", "funcgraph.models.rnn:sequence_encoder",
                  positive=("vocab_size", "embed_dim", "hidden_size", "num_layers"),
                  shape_rule=_classes_rule(64, "hidden_size"))
# The DARTS networks run thousands of small ops: on meta tensors that takes tens of seconds,
# so their output shape comes from the rule (inputs must have H, W divisible by 4).
REGISTRY.add_lazy("darts_search", "funcgraph.nas.cell:search_network",
                  infer={"in_channels": channel_dim},
                  positive=("c", "layers", "num_classes", "in_channels", "steps", "multiplier"),
                  shape_rule=_classes_rule(10), meta_run=False)
REGISTRY.add_lazy("darts_network", "funcgraph.factory.adapters:darts_network",
                  infer={"in_channels": channel_dim},
                  positive=("C", "layers", "num_classes", "in_channels", "stem_multiplier"),
                  shape_rule=_classes_rule(10), meta_run=False)


def describe_params(layer: LayerType) -> str:
    """The config keys of a layer type: ``"(in_features) out_features [bias dtype]"`` —
    inferable params in parentheses, optional ones in brackets, child slots after a bar."""
    params, _ = signature_params(layer.schema or layer.fn)
    skip = {*layer.hidden, *(s.name for s in layer.slots)}
    inferred = [n for n in params if n in layer.infer]
    required = [n for n, p in params.items() if p.required and n not in skip and n not in inferred]
    optional = [n for n, p in params.items() if not p.required and n not in skip
                and n not in inferred]
    parts = [f"({' '.join(inferred)})"] * bool(inferred) + required
    parts += [f"[{' '.join(optional)}]"] * bool(optional)
    if layer.slots:
        parts.append("| " + " ".join(s.name if s.required else f"[{s.name}]" for s in layer.slots))
    return " ".join(parts)


def layer_types(registry: Registry = REGISTRY) -> dict[str, tuple[str, str]]:
    """Every usable type name with its params (:func:`describe_params`) and a one-line
    summary; lazy entries are loaded to describe them."""
    out: dict[str, tuple[str, str]] = {}
    for name in registry.names():
        try:
            layer = registry.get(name, at("type", name))
        except ConfigError as e:
            out[name] = ("", f"(unavailable: {e})")
            continue
        out[name] = (describe_params(layer), layer.summary)
    return out


__all__ = [
    "ENTRY_POINT_GROUP",
    "REGISTRY",
    "LayerType",
    "Registry",
    "Slot",
    "channel_dim",
    "describe_params",
    "entry_points",
    "last_dim",
    "layer_types",
    "parallel_block",
    "register_layer",
    "residual_block",
    "sequence_features",
    "serial_block",
]
