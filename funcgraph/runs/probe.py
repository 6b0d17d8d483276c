"""A model's first run on real inputs, before a run directory exists.

A model that does not fit its data (channels, image size, vocabulary, head width) fails deep
inside torch. Every run calls it once on a tiny slice of its data through :func:`probe`
before writing anything, so that mistake is one :class:`~funcgraph.errors.ConfigError` line
and leaves no run directory behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..errors import ConfigError, FuncgraphError

T = TypeVar("T")


def probe(run: Callable[[], T], what: str) -> T:
    """``run()``; torch's complaint about its inputs becomes ``ConfigError("{what}: ...")``
    with the first line of torch's message. funcgraph's own errors pass through unchanged."""
    try:
        return run()
    except FuncgraphError:
        raise
    except (RuntimeError, ValueError, IndexError, TypeError) as e:
        text = str(e).strip()
        first = text.splitlines()[0] if text else type(e).__name__
        raise ConfigError(f"{what}: {first}") from None


__all__ = ["probe"]
