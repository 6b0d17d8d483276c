"""The built-in layer types: the table a config's ``"type"`` names resolve through first.

``funcgraph.nn`` layers with their shape-inference rules (:func:`last_dim`,
:func:`channel_dim`, :func:`sequence_features`) and bounds, the ``serial``/``residual``/
``parallel`` blocks with the checks that name a shape mismatch between their children
(:data:`BUILTIN_LAYERS`), and the reference models, recurrent layers and DARTS networks of
other floors, imported on first use so that a module that is absent makes only its own names
unavailable (:data:`LAZY_LAYERS`). :data:`funcgraph.factory.registry.REGISTRY` starts with
both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from .. import nn
from ..model import Model
from .layer_type import LayerType, LazyLayer, Shape, ShapeRule, Slot

# --- shape inference rules -------------------------------------------------------------------

def last_dim(shape: Shape) -> int:
    """The feature size of ``(..., features)``: what ``linear`` and ``layer_norm`` take."""
    return shape[-1]


def channel_dim(shape: Shape) -> int:
    """The channel count of ``(B, C, ...)``: what convolutions and batch norm take."""
    return shape[1]


def sequence_features(shape: Any) -> int:
    """The feature size of a recurrent layer's input ``((B, T, F), lengths)`` or ``(B, T, F)``."""
    first = shape[0]
    return int(first[-1]) if isinstance(first, tuple) else int(shape[-1])


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
BUILTIN_LAYERS: tuple[LayerType, ...] = (
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
)
"""The eager entries: what ``funcgraph.nn`` and the blocks give."""


# --- entries imported on first use ----------------------------------------------------------

def _classes_rule(default: int, key: str = "num_classes") -> ShapeRule:
    """Output ``(B, classes)`` for models whose data-dependent forward cannot run on meta
    tensors; B is read from the first input."""

    def rule(in_shape: Any, **params: Any) -> Shape:
        first = in_shape[0]
        batch = first[0] if isinstance(first, tuple) else first
        return (int(batch), int(params.get(key, default)))

    return rule


_recurrent = {"infer": {"input_size": sequence_features},
              "positive": ("input_size", "hidden_size", "num_layers")}
LAZY_LAYERS: dict[str, LazyLayer] = {
    "lstm": LazyLayer("funcgraph.nn.recurrent:lstm", _recurrent),
    "gru": LazyLayer("funcgraph.nn.recurrent:gru", _recurrent),
    "stochastic_depth": LazyLayer(
        "funcgraph.factory.adapters:stochastic_depth_block",
        {"slots": (Slot("body"), Slot("shortcut", required=False),
                   Slot("post", required=False, after="body"))}),
    "conv4": LazyLayer("funcgraph.models.conv4:conv4",
                       {"infer": {"in_channels": channel_dim},
                        "positive": ("hidden", "in_channels", "image_size")}),
    "resnet12": LazyLayer("funcgraph.models.resnet12:resnet12",
                          {"infer": {"in_channels": channel_dim},
                           "positive": ("in_channels", "block_size")}),
    "mlp": LazyLayer("funcgraph.models.mlp:mlp",
                     {"infer": {"in_features": last_dim},
                      "positive": ("in_features", "out_features")}),
    "resnet": LazyLayer("funcgraph.models.resnet:resnet",
                        {"infer": {"in_channels": channel_dim},
                         "positive": ("num_classes", "in_channels", "width")}),
    "early_exit_cnn": LazyLayer("funcgraph.models.early_exit:early_exit_cnn",
                                {"infer": {"in_channels": channel_dim},
                                 "positive": ("num_classes", "in_channels", "width"),
                                 "shape_rule": _classes_rule(10)}),
    "rnn_classifier": LazyLayer("funcgraph.models.rnn:rnn_classifier",
                                {"positive": ("vocab_size", "num_classes", "embed_dim",
                                              "hidden_size", "num_layers"),
                                 "shape_rule": _classes_rule(2)}),
    "sequence_encoder": LazyLayer("funcgraph.models.rnn:sequence_encoder",
                                  {"positive": ("vocab_size", "embed_dim", "hidden_size",
                                                "num_layers"),
                                   "shape_rule": _classes_rule(64, "hidden_size")}),
    # The DARTS networks run thousands of small ops: on meta tensors that takes tens of
    # seconds, so their output shape comes from the rule (inputs must have H, W divisible by 4).
    "darts_search": LazyLayer("funcgraph.nas.cell:search_network",
                              {"infer": {"in_channels": channel_dim},
                               "positive": ("c", "layers", "num_classes", "in_channels",
                                            "steps", "multiplier"),
                               "shape_rule": _classes_rule(10), "meta_run": False}),
    "darts_network": LazyLayer("funcgraph.factory.adapters:darts_network",
                               {"infer": {"in_channels": channel_dim},
                                "positive": ("C", "layers", "num_classes", "in_channels",
                                             "stem_multiplier"),
                                "shape_rule": _classes_rule(10), "meta_run": False}),
}
"""Other parts of funcgraph, by type name: absent modules make only their names unavailable."""


__all__ = [
    "BUILTIN_LAYERS",
    "LAZY_LAYERS",
    "channel_dim",
    "last_dim",
    "parallel_block",
    "residual_block",
    "sequence_features",
    "serial_block",
]
