"""The layer registry: every type name a config may use, and nothing else.

A config never imports or executes code: ``"type": "custom.my_block"`` resolves only through
this table. Entries come from three places:

* the built-in table (:mod:`funcgraph.factory.builtin_layers`: ``funcgraph.nn`` layers and
  the ``serial``/``residual``/``parallel`` blocks, plus reference models registered lazily
  so a module that is absent does not break import);
* ``@register_layer("custom.my_block")`` in user code;
* the ``funcgraph.layers`` entry-point group of installed packages (loaded on first use of
  that name).

What an entry holds (a constructor whose signature is the config's schema, shape hooks,
child slots) is :class:`~funcgraph.factory.layer_type.LayerType`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from ..errors import ConfigError
from ..model import Model
from .builtin_layers import BUILTIN_LAYERS, LAZY_LAYERS
from .config import at, describe, error, suggest
from .layer_type import Check, InferRule, LayerType, LazyLayer, ShapeRule, Slot, describe_params

ENTRY_POINT_GROUP = "funcgraph.layers"


class Registry:
    """Type name -> :class:`LayerType`, with lazy entries and entry-point discovery."""

    def __init__(self) -> None:
        self._types: dict[str, LayerType] = {}
        self._lazy: dict[str, LazyLayer] = {}

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
        self._lazy[name] = LazyLayer(target, options)

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
for _layer in BUILTIN_LAYERS:
    REGISTRY.add(_layer)
for _name, _lazy in LAZY_LAYERS.items():
    REGISTRY.add_lazy(_name, _lazy.target, **_lazy.options)


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
    "Registry",
    "entry_points",
    "layer_types",
    "register_layer",
]
