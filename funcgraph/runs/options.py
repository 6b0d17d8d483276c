"""Checks of a run's numeric options, with messages that name the command-line option.

Typer's ``min=`` bounds let ``nan`` through (every comparison with it is false) and the
library's configs are built from Python too, so each run config checks its own numbers here.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError


def option(name: str) -> str:
    """The command-line spelling of config field ``name``: ``meta_lr`` -> ``--meta-lr``."""
    return "--" + name.replace("_", "-")


def check_count(name: str, value: Any, least: int) -> None:
    """``value`` of option ``name`` must be an int >= ``least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{option(name)} must be an int >= {least}, got {value!r}")


def check_rate(name: str, value: Any) -> None:
    """``value`` of option ``name`` (a learning rate) must be a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0):
        raise ConfigError(f"{option(name)} must be a finite number > 0, got {value!r}")


__all__ = ["check_count", "check_rate", "option"]
