"""Few-shot data: the embedded ``glyphs`` set, real Omniglot, sinusoids, and task sampling.

Nothing here downloads. ``load_glyphs`` generates (then caches) an Omniglot-like dataset
from a seed; ``load_omniglot`` reads the official layout from disk; ``sample_tasks`` turns
any :class:`ClassDataset` into N-way K-shot episodes; ``sinusoid_tasks`` makes the MAML
paper's regression tasks. See docs/data.md.
"""

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
