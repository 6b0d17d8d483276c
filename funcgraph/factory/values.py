"""Checking config values against a constructor's signature and type hints.

A layer constructor such as ``nn.linear(in_features: int, out_features: int, *, bias: bool)``
is its own schema: the parameter names say which keys a config may give, defaults say which
are optional, and the hints say what each value must be. JSON has no tuples or dtypes, so
lists become tuples and ``"float32"`` becomes ``torch.float32`` where the hint asks for them.
Every mismatch raises ConfigError at the value's path, never a TypeError from inside.
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError
from .config import at, describe, error, suggest

_EMPTY = inspect.Parameter.empty


@dataclass(frozen=True)
class ParamInfo:
    """One keyword a constructor accepts: its type hint and whether a config must give it."""

    name: str
    hint: Any
    required: bool


def signature_params(fn: Callable[..., Any]) -> tuple[dict[str, ParamInfo], bool]:
    """``({name: ParamInfo}, open)`` for ``fn``; ``open`` when it takes ``**kwargs`` too."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return {}, True
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable string hints in a user's layer: check names only
        hints = {}
    params: dict[str, ParamInfo] = {}
    is_open = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            is_open = True
        elif p.kind is not p.VAR_POSITIONAL:
            params[p.name] = ParamInfo(p.name, hints.get(p.name, Any), p.default is _EMPTY)
    return params, is_open


def describe_hint(hint: Any) -> str:
    """A type hint in words: ``int | tuple[int, int]`` -> ``"an int or a list of 2 ints"``."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe_hint(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(describe(a) for a in args)
    if origin is tuple or origin is list or origin is collections.abc.Sequence:
        if len(args) == 2 and args[1] is Ellipsis or origin is not tuple:
            inner = describe_hint(args[0]) if args else "value"
            return f"a list of {inner.removeprefix('a ').removeprefix('an ')}s"
        return f"a list of {len(args)} values"
    names = {int: "an int", float: "a number", bool: "a boolean (true/false)", str: "a string",
             type(None): "null", torch.dtype: 'a dtype name such as "float32"'}
    if hint in names:
        return names[hint]
    if origin in (dict, collections.abc.Mapping) or hint in (dict, Mapping):
        return "a mapping"
    return getattr(hint, "__name__", str(hint))


class _Mismatch(Exception):
    """Internal: a value does not fit a hint (turned into ConfigError with the path)."""


def _coerce(value: Any, hint: Any) -> Any:
    if hint is Any or hint is _EMPTY:
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arm in args:
            try:
                return _coerce(value, arm)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is typing.Literal:
        if value in args:
            return value
        raise _Mismatch
    if origin in (tuple, list, collections.abc.Sequence):
        if not isinstance(value, list | tuple):
            raise _Mismatch
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise _Mismatch
            return tuple(_coerce(v, a) for v, a in zip(value, args, strict=True))
        inner = args[0] if args else Any
        items = [_coerce(v, inner) for v in value]
        return tuple(items) if origin is tuple else items
    if origin in (dict, collections.abc.Mapping) or hint in (dict, Mapping):
        if not isinstance(value, dict):
            raise _Mismatch
        return value
    if origin is not None and origin in (collections.abc.Callable,):
        raise _Mismatch
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if hint is int:
        if isinstance(value, bool):
            raise _Mismatch
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _Mismatch
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch
    if hint is torch.dtype:
        if isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype):
            return getattr(torch, value)
        raise _Mismatch
    if hint is type(None):
        if value is None:
            return None
        raise _Mismatch
    if isinstance(hint, type):
        if isinstance(value, hint):
            return value
        raise _Mismatch
    return value


def coerce(value: Any, hint: Any, path: str) -> Any:
    """``value`` converted to fit ``hint`` (lists to tuples, dtype names to dtypes).

    Raises:
        ConfigError: ``"<path>: expected <hint in words>, got <value>"``.
    """
    try:
        return _coerce(value, hint)
    except _Mismatch:
        raise error(path, f"expected {describe_hint(hint)}, got {describe(value)}") from None


def check_params(
    fn: Callable[..., Any],
    given: Mapping[str, Any],
    path: str,
    *,
    what: str,
    exclude: tuple[str, ...] = (),
    positive: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Check config params ``given`` (at config path ``path``) against ``fn``'s signature.

    Arguments:
        fn: the constructor whose signature is the schema.
        given: the params from the config, references already resolved.
        path: the config path of the params mapping (``layers[3].params``).
        what: the layer type, for messages.
        exclude: parameters the factory supplies itself (child models of a block).
        positive: int parameters that must be >= 1.
    Returns:
        The coerced keyword arguments.
    Raises:
        ConfigError: unknown names (with suggestions), missing required ones, type mismatches.
    """
    params, is_open = signature_params(fn)
    accepted = {n: p for n, p in params.items() if n not in exclude}
    out: dict[str, Any] = {}
    for name, value in given.items():
        if not isinstance(name, str):
            raise error(path, f"parameter names must be strings, got {describe(name)}")
        info = accepted.get(name)
        if info is None:
            if is_open:
                out[name] = value
                continue
            raise error(
                at(path, name),
                f"unknown parameter of {what}{suggest(name, accepted)}; "
                f"accepted: {', '.join(accepted) or '(none)'}",
            )
        if name in positive:
            try:
                out[name] = coerce(value, int, at(path, name))
            except ConfigError:
                out[name] = 0
            if out[name] < 1:
                raise error(at(path, name), f"expected a positive int, got {describe(value)}")
        else:
            out[name] = coerce(value, info.hint, at(path, name))
    missing = [n for n, p in accepted.items() if p.required and n not in out]
    if missing:
        raise error(at(path, missing[0]), f"missing: {what} needs {', '.join(missing)}")
    return out


__all__ = ["ParamInfo", "check_params", "coerce", "describe_hint", "signature_params"]
