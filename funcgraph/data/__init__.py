"""Few-shot data: the embedded ``glyphs`` set, real Omniglot, sinusoids, and task sampling.

Nothing here downloads. ``load_glyphs`` generates (then caches) an Omniglot-like dataset
from a seed; ``load_omniglot`` reads the official layout from disk; ``sample_tasks`` turns
any :class:`ClassDataset` into N-way K-shot episodes; ``sinusoid_tasks`` makes the MAML
paper's regression tasks. See docs/data.md.

Each name loads its module on first use (PEP 562), so code that only samples tasks never
imports the glyph generator or the image readers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .datasets import ClassDataset, rotate_classes, save_preview
    from .glyphs import generate_glyphs, load_glyphs
    from .omniglot import load_omniglot
    from .sequences import SequenceTask
    from .sinusoid import RegressionBatch, sinusoid_tasks
    from .tasks import (
        DEFAULT_QUERIES,
        TaskBatch,
        TaskSpec,
        confidence_interval,
        nearest_neighbour_accuracy,
        sample_tasks,
    )

_HOME = {
    "ClassDataset": "datasets", "rotate_classes": "datasets", "save_preview": "datasets",
    "generate_glyphs": "glyphs", "load_glyphs": "glyphs", "load_omniglot": "omniglot",
    "SequenceTask": "sequences", "RegressionBatch": "sinusoid", "sinusoid_tasks": "sinusoid",
    "DEFAULT_QUERIES": "tasks", "TaskBatch": "tasks", "TaskSpec": "tasks",
    "confidence_interval": "tasks", "nearest_neighbour_accuracy": "tasks",
    "sample_tasks": "tasks",
}
"""Public name -> the module that defines it."""


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_QUERIES",
    "ClassDataset",
    "RegressionBatch",
    "SequenceTask",
    "TaskBatch",
    "TaskSpec",
    "confidence_interval",
    "generate_glyphs",
    "load_glyphs",
    "load_omniglot",
    "nearest_neighbour_accuracy",
    "rotate_classes",
    "sample_tasks",
    "save_preview",
    "sinusoid_tasks",
]
