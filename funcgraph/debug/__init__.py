"""Looking inside pure functions: taps, per-op traces, the finite check, executed graphs.

See ``docs/inspect.md`` for which tool works under ``vmap``/``grad``.
"""

from . import render
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
    "diff",
    "finite_check",
    "grad_tap",
    "plain",
    "render",
    "tap",
    "trace",
]
