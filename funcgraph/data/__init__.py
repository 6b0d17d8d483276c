"""Few-shot data: embedded generated sets, datasets from disk, augmentation, task sampling.

Nothing here downloads. ``load_glyphs`` generates (then caches) an Omniglot-like dataset
from a seed and ``load_rgb_shapes`` a mini-ImageNet-sized RGB one; ``load_omniglot``,
``load_folder``, ``load_mini_imagenet`` and ``load_cub`` read layouts from disk (the RGB ones
through a decoded, memory-mapped cache); ``random_crop``, ``horizontal_flip`` and
``color_jitter`` are keyed augmentations; ``sample_tasks`` turns any :class:`ClassDataset`
into N-way K-shot episodes; ``sinusoid_tasks`` makes the MAML paper's regression tasks. See
docs/data.md.

Each name loads its module on first use (PEP 562), so code that only samples tasks never
imports the glyph generator or the image readers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .augment import color_jitter, compose, horizontal_flip, random_crop
    from .datasets import ClassDataset, as_float, rotate_classes, save_preview
    from .folders import load_cub, load_folder, load_mini_imagenet
    from .glyphs import generate_glyphs, load_glyphs
    from .omniglot import load_omniglot
    from .rgb_shapes import generate_rgb_shapes, load_rgb_shapes
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
    "color_jitter": "augment", "compose": "augment", "horizontal_flip": "augment",
    "random_crop": "augment",
    "ClassDataset": "datasets", "as_float": "datasets", "rotate_classes": "datasets",
    "save_preview": "datasets",
    "load_cub": "folders", "load_folder": "folders", "load_mini_imagenet": "folders",
    "generate_glyphs": "glyphs", "load_glyphs": "glyphs", "load_omniglot": "omniglot",
    "generate_rgb_shapes": "rgb_shapes", "load_rgb_shapes": "rgb_shapes",
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
    "as_float",
    "color_jitter",
    "compose",
    "confidence_interval",
    "generate_glyphs",
    "generate_rgb_shapes",
    "horizontal_flip",
    "load_cub",
    "load_folder",
    "load_glyphs",
    "load_mini_imagenet",
    "load_omniglot",
    "load_rgb_shapes",
    "nearest_neighbour_accuracy",
    "random_crop",
    "rotate_classes",
    "sample_tasks",
    "save_preview",
    "sinusoid_tasks",
]
