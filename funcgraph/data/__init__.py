"""Few-shot data: embedded generated sets, datasets from disk, augmentation, task sampling.

Nothing here downloads. ``load_glyphs`` generates (then caches) an Omniglot-like dataset
from a seed, ``load_rgb_shapes`` a mini-ImageNet-sized RGB one and ``load_patterns`` a
grayscale texture set kept for confirming tuned defaults; ``load_omniglot``,
``load_folder``, ``load_mini_imagenet`` and ``load_cub`` read layouts from disk (the RGB ones
through a decoded, memory-mapped cache); ``random_crop``, ``horizontal_flip`` and
``color_jitter`` are keyed augmentations; ``sample_tasks`` turns any :class:`ClassDataset`
into N-way K-shot episodes; ``sinusoid_tasks`` makes the MAML paper's regression tasks.
``register_dataset`` adds a dataset that runs can name (``--dataset NAME``; see
:mod:`funcgraph.data.registry`). See docs/data.md.

Each name loads its module on first use (PEP 562), so code that only samples tasks never
imports the glyph generator or the image readers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._exports import lazy_exports

_EXPORTS: dict[str, tuple[str, ...]] = {
    "augment": ("color_jitter", "compose", "horizontal_flip", "random_crop"),
    "datasets": ("ClassDataset", "as_float", "rotate_classes", "save_preview"),
    "folders": ("load_cub", "load_folder", "load_mini_imagenet"),
    "glyphs": ("generate_glyphs", "load_glyphs"),
    "omniglot": ("load_omniglot",),
    "patterns": ("generate_patterns", "load_patterns"),
    "registry": ("DatasetType", "dataset_names", "dataset_type", "register_dataset"),
    "rgb_shapes": ("generate_rgb_shapes", "load_rgb_shapes"),
    "sequences": ("SequenceTask",),
    "sinusoid": ("RegressionBatch", "sinusoid_tasks"),
    "tasks": ("DEFAULT_QUERIES", "TaskBatch", "TaskSpec", "confidence_interval",
              "nearest_neighbour_accuracy", "sample_tasks"),
}
"""Module -> the public names it defines: the one list of this package's surface (the
imports below repeat it for type checkers only; tests/test_data_registry.py holds them equal)."""

if TYPE_CHECKING:  # the same names for type checkers, which cannot read _EXPORTS
    from .augment import color_jitter, compose, horizontal_flip, random_crop  # noqa: F401
    from .datasets import ClassDataset, as_float, rotate_classes, save_preview  # noqa: F401
    from .folders import load_cub, load_folder, load_mini_imagenet  # noqa: F401
    from .glyphs import generate_glyphs, load_glyphs  # noqa: F401
    from .omniglot import load_omniglot  # noqa: F401
    from .patterns import generate_patterns, load_patterns  # noqa: F401
    from .registry import DatasetType, dataset_names, dataset_type, register_dataset  # noqa: F401
    from .rgb_shapes import generate_rgb_shapes, load_rgb_shapes  # noqa: F401
    from .sequences import SequenceTask  # noqa: F401
    from .sinusoid import RegressionBatch, sinusoid_tasks  # noqa: F401
    from .tasks import (  # noqa: F401
        DEFAULT_QUERIES,
        TaskBatch,
        TaskSpec,
        confidence_interval,
        nearest_neighbour_accuracy,
        sample_tasks,
    )

_HOME = {name: module for module, names in _EXPORTS.items() for name in names}

_MODULES = (*_EXPORTS, "cache", "images", "strokes")
"""The submodules the docs cite, reachable as ``funcgraph.data.<name>`` (imported on first
use)."""


__all__ = sorted(_HOME)

__getattr__, __dir__ = lazy_exports(__name__, __all__, submodules=_MODULES, homes=_HOME)
