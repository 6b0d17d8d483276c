"""A model's first run on real inputs, before a run directory exists.

A model that does not fit its data (channels, image size, vocabulary, head width) fails deep
inside torch. Every run calls it once on a tiny slice of its data through :func:`probe`
before writing anything, so that mistake is one :class:`~funcgraph.errors.ConfigError` line
and leaves no run directory behind. Where the failing line is the user's own (a learner or
module of theirs, neither torch's nor funcgraph's), the line names it: the mistake may be
there rather than in the model's fit.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import TypeVar

import torch

from ..errors import ConfigError, FuncgraphError

T = TypeVar("T")

_LIBRARIES = (os.path.dirname(torch.__file__) + os.sep,
              os.path.dirname(os.path.dirname(__file__)) + os.sep)


def probe(run: Callable[[], T], what: str) -> T:
    """``run()``; torch's complaint about its inputs becomes ``ConfigError("{what}: ...")``
    with the first line of torch's message and, where the failing line is the user's, its
    ``FILE:LINE``. funcgraph's own errors pass through unchanged."""
    try:
        return run()
    except FuncgraphError:
        raise
    except (RuntimeError, ValueError, IndexError, TypeError) as e:
        text = str(e).strip()
        first = text.splitlines()[0] if text else type(e).__name__
        raise ConfigError(f"{what}: {first}{_user_line(e)}") from None


def _user_line(error: BaseException) -> str:
    """`` (at FILE:LINE)`` of the innermost frame of ``error`` that is neither torch's nor
    funcgraph's, or ``""``."""
    frames = traceback.extract_tb(error.__traceback__)[1:]  # [0] is probe's own call
    own = [f for f in frames if not f.filename.startswith(_LIBRARIES)
           and not f.filename.startswith("<")]
    return f" (at {own[-1].filename}:{own[-1].lineno})" if own else ""


__all__ = ["probe"]
