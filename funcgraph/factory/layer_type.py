"""What a registry entry is: a layer type, its child-layer slots and its shape hooks.

A :class:`LayerType` names a constructor that takes keyword hyperparameters and returns a
:class:`~funcgraph.model.Model`; its signature and type hints (or ``schema``'s) are the schema a
config is checked against. Two optional hooks serve shape inference: ``infer`` fills omitted
params from the input shape (``{"in_features": last_dim}``), and ``shape_rule(in_shape,
**params)`` gives the output shape when running the layer on meta tensors is impossible
(data-dependent control flow). A block takes its child layers through slots (:class:`Slot`).
A :class:`LazyLayer` is an entry whose constructor is imported on first use;
:func:`describe_params` spells an entry's config keys for ``funcgraph model list``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..model import Model
from .values import signature_params

Shape = tuple[int, ...]
InferRule = Callable[[Shape], Any]
ShapeRule = Callable[..., Shape]
Check = Callable[[Any, Mapping[str, Any], Mapping[str, Any]], "str | None"]


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
class LazyLayer:
    """An entry imported on first use: ``target`` is ``"module:attribute"``, ``options`` the
    other :class:`LayerType` fields."""

    target: str
    options: dict[str, Any]


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


__all__ = ["Check", "InferRule", "LayerType", "LazyLayer", "Shape", "ShapeRule", "Slot",
           "describe_params"]
