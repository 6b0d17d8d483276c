"""Argument checks for constructors: a bad hyperparameter is a ConfigError at construction.

A layer or model built with ``hidden=0`` or ``drop_prob=2`` would otherwise fail later, deep in
torch, when ``init`` allocates a tensor or ``apply`` runs a kernel. Each check here raises
:class:`~funcgraph.errors.ConfigError` naming the function, the argument, the expected form
and the value received (``"linear: in_features must be an int >= 1, got 0"``), and returns
the value in its checked form so a constructor can use it directly.

``bool`` is refused wherever an int is expected: ``True`` is an ``int`` to Python but never a
meaningful width, and a flag passed in the wrong position is the usual way it gets there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeGuard

from .errors import ConfigError


def _shown(value: object, right_type: bool) -> str:
    """``value`` as a message shows it: its repr, plus its type where the type is the fault."""
    return repr(value) if right_type else f"{value!r} ({type(value).__name__})"


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_int(fn: str, name: str, value: object, *, minimum: int = 1) -> int:
    """``value`` if it is an int ``>= minimum`` (not a bool), else a ConfigError."""
    if not _is_int(value) or value < minimum:
        raise ConfigError(
            f"{fn}: {name} must be an int >= {minimum}, got {_shown(value, _is_int(value))}"
        )
    return value


def check_sizes(fn: str, **sizes: object) -> None:
    """Check that every keyword is a size, an int ``>= 1``: ``check_sizes("linear",
    in_features=in_features, out_features=out_features)``."""
    for name, value in sizes.items():
        check_int(fn, name, value)


def check_ints(
    fn: str, name: str, value: object, *, dims: int | None = None, minimum: int = 1
) -> tuple[int, ...]:
    """An int or a sequence of ints, each ``>= minimum``, as a tuple: kernel sizes, strides.

    With ``dims``, an int gives ``dims`` copies (``3 -> (3, 3)``) and a sequence must have
    ``dims`` entries; without it, an int gives ``(value,)`` and a sequence may have any
    non-zero length.
    """
    if _is_int(value):
        return (check_int(fn, name, value, minimum=minimum),) * (dims or 1)
    items = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else None
    if not items or (dims is not None and len(items) != dims) or not all(
        _is_int(v) and v >= minimum for v in items
    ):
        count = "one or more" if dims is None else str(dims)
        raise ConfigError(
            f"{fn}: {name} must be an int >= {minimum} or a tuple of {count} such ints, "
            f"got {_shown(value, items is not None)}"
        )
    return tuple(items)


def check_fraction(fn: str, name: str, value: object, *, allow_one: bool = False) -> float:
    """``value`` as a float if it is a number in ``[0, 1)`` (``[0, 1]`` with ``allow_one``):
    a drop probability, a decision threshold, a momentum. Not a bool; NaN is outside."""
    if not _is_number(value) or not (0.0 <= value <= 1.0 if allow_one else 0.0 <= value < 1.0):
        interval = "[0, 1]" if allow_one else "[0, 1)"
        raise ConfigError(
            f"{fn}: {name} must be in {interval}, got {_shown(value, _is_number(value))}"
        )
    return float(value)


def check_number(fn: str, name: str, value: object, *, minimum: float = 0.0) -> float:
    """``value`` as a float if it is a finite number ``>= minimum``: a coefficient, a weight.
    Not a bool; NaN and the infinities are outside."""
    if not _is_number(value) or not (math.isfinite(value) and value >= minimum):
        raise ConfigError(f"{fn}: {name} must be a finite number >= {minimum}, got "
                          f"{_shown(value, _is_number(value))}")
    return float(value)


def check_sequence(fn: str, name: str, value: object, what: str) -> list[Any]:
    """``value`` as a list if it is a sequence other than a string (``hidden=(40, 40)``; a
    bare ``40`` is the usual mistake); ``what`` describes one entry, for the message."""
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ConfigError(f"{fn}: {name} must be a sequence of {what}, got {_shown(value, False)}")
    return list(value)




def check_rate(fn: str, name: str, value: object) -> float:
    """``value`` as a float if it is a finite number ``> 0``: a learning rate, a regulariser's
    strength. Not a bool; zero (no step at all), NaN and the infinities are outside."""
    if not _is_number(value) or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{fn}: {name} must be a finite number > 0, got "
                          f"{_shown(value, _is_number(value))}")
    return float(value)


def check_bool(fn: str, name: str, value: object) -> bool:
    """``value`` if it is a bool (``0``/``1`` or a string are the usual mistakes)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{fn}: {name} must be True or False, got {_shown(value, False)}")
    return value


def check_choice(fn: str, name: str, value: object, choices: Sequence[str]) -> str:
    """``value`` if it is one of the strings ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{fn}: {name} must be one of {list(choices)}, got "
                          f"{_shown(value, isinstance(value, str))}")
    return value


def option(name: str) -> str:
    """The command-line spelling of a config field: ``meta_lr`` -> ``--meta-lr``; run configs
    name their options this way in messages (``check_int("meta-train", option("steps"),
    ...)``)."""
    return "--" + name.replace("_", "-")


__all__ = ["check_bool", "check_choice", "check_fraction", "check_int", "check_ints",
           "check_number", "check_rate", "check_sequence", "check_sizes", "option"]
