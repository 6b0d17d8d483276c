"""Looking inside pure functions: taps, per-op traces, the finite check, executed graphs,
call counts.

See ``docs/inspect.md`` for which tool works under ``vmap``/``grad``.
"""

from typing import TYPE_CHECKING

from .._exports import lazy_exports
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

if not TYPE_CHECKING:  # type checkers see the names and submodules through the imports
    __getattr__, __dir__ = lazy_exports(__name__, submodules=(
        "calls", "graph", "render", "taps", "trace"))


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
