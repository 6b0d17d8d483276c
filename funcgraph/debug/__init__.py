"""Looking inside pure functions: taps, per-op traces, the finite check, executed graphs,
call counts.

See ``docs/inspect.md`` for which tool works under ``vmap``/``grad``.
"""

from . import render
from .calls import count_calls
from .graph import Graph, GraphDiff, Node, capture, diff
from .taps import grad_tap, plain, tap
from .trace import (
    NonFiniteError,
    OpRecord,
    Trace,
    check_finite,
    finite_check,
    trace,
)

__all__ = [
    "Graph",
    "GraphDiff",
    "Node",
    "NonFiniteError",
    "OpRecord",
    "Trace",
    "capture",
    "check_finite",
    "count_calls",
    "diff",
    "finite_check",
    "grad_tap",
    "plain",
    "render",
    "tap",
    "trace",
]


_MODULES = ("calls", "graph", "render", "taps", "trace")
"""The submodules the docs cite: with ``__all__``, all that ``dir()`` lists."""


def __dir__() -> list[str]:
    """The public names and the documented submodules; nothing else."""
    return sorted({*__all__, *_MODULES})
