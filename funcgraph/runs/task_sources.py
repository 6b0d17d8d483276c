"""Where meta-training gets its tasks: a dataset name to one task sampler per split.

A :class:`TaskSources` holds one :data:`~funcgraph.meta.TaskSampler` per split:
``train`` (meta-training), ``val`` (periodic validation, for the best checkpoint) and
``test`` (the final held-out score). Classification datasets split by class (glyphs:
background / validation / evaluation alphabets), so the three never share a class;
sinusoid tasks are drawn from independent key streams.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import random
from ..errors import ConfigError, DataError, TaskSpecError
from ..meta import Task, TaskSampler
from ..random import Key

DATASETS = ("glyphs", "omniglot", "rgb-shapes", "folder", "mini-imagenet", "cub", "sinusoid")


@dataclass(frozen=True)
class TaskSources:
    """Task samplers for the three splits and what a model for them needs to know."""

    kind: str
    train: TaskSampler
    val: TaskSampler
    test: TaskSampler
    ways: int
    in_channels: int
    image_size: int


def _classification(
    datasets: Mapping[str, Any], spec: str, train_queries: int | None, rotate: bool
) -> TaskSources:
    from ..data.datasets import rotate_classes
    from ..data.tasks import TaskSpec, check_fits, sample_tasks

    eval_spec = TaskSpec.parse(spec)
    train_spec = TaskSpec(eval_spec.ways, eval_spec.shots, train_queries or eval_spec.queries)
    train_ds = rotate_classes(datasets["train"]) if rotate else datasets["train"]
    for ds, task_spec in ((train_ds, train_spec), (datasets["val"], eval_spec),
                          (datasets["test"], eval_spec)):
        check_fits(ds, task_spec)  # every split, before a model is sized for the spec

    def sampler(ds: Any, task_spec: Any) -> TaskSampler:
        return lambda key, n: Task.of(sample_tasks(key, ds, task_spec, n))

    channels, size, _ = train_ds.image_shape
    return TaskSources("classification", sampler(train_ds, train_spec),
                       sampler(datasets["val"], eval_spec), sampler(datasets["test"], eval_spec),
                       eval_spec.ways, channels, size)


ON_DISK = {
    "omniglot": "load_omniglot", "folder": "load_folder", "mini-imagenet": "load_mini_imagenet",
    "cub": "load_cub",
}
"""Datasets read from ``--data-root`` (see docs/data.md for each layout) and their loaders."""

IMAGE_SIZE = {"glyphs": 28, "omniglot": 28, "rgb-shapes": 84, "folder": 84,
              "mini-imagenet": 84, "cub": 84}
"""The default ``--image-size`` per image dataset: 28 for the one-channel Omniglot family,
84 for the RGB benchmarks (32 is CIFAR-FS's and FC100's, given with ``--image-size 32``)."""

_SPLITS = {"train": "background", "val": "validation", "test": "evaluation"}
"""Omniglot-style split names behind the run's train / val / test."""


def task_sources(
    dataset: str,
    *,
    spec: str = "5way1shot",
    train_queries: int | None = None,
    data_root: str | Path | None = None,
    rotate: bool = False,
    image_size: int | None = None,
) -> TaskSources:
    """The samplers for ``dataset`` (one of :data:`DATASETS`).

    Arguments:
        spec: the task spec (``"5way1shot"``, ``"5way1shot15query"``) for validation and test.
            For sinusoid, ``shots`` is K (points to adapt on) and ``queries`` the points scored.
        train_queries: query examples per class in meta-training (default: the spec's).
        data_root: the folder of an on-disk dataset (:data:`ON_DISK`).
        rotate: augment the training classes with 90/180/270-degree rotations (MAML protocol).
        image_size: images are resized to ``image_size`` squared (default: :data:`IMAGE_SIZE`).
    """
    if dataset == "sinusoid":
        return _sinusoid(spec)
    if dataset not in IMAGE_SIZE:
        raise ConfigError(f"--dataset must be one of {DATASETS}, got {dataset!r}")
    from .. import data
    from ..data.tasks import TaskSpec

    TaskSpec.parse(spec)  # a bad spec fails before any data is loaded
    size = IMAGE_SIZE[dataset] if image_size is None else image_size
    if dataset == "glyphs":
        loaded = {k: data.load_glyphs(s, image_size=size) for k, s in _SPLITS.items()}
    elif dataset == "rgb-shapes":
        loaded = {k: data.load_rgb_shapes(k, image_size=size) for k in _SPLITS}
    else:
        if data_root is None:
            raise DataError(f"--dataset {dataset} needs --data-root DIR (layouts: docs/data.md)")
        load = getattr(data, ON_DISK[dataset])
        names = _SPLITS if dataset == "omniglot" else {k: k for k in _SPLITS}
        loaded = {k: load(Path(data_root), s, image_size=size) for k, s in names.items()}
    return _classification(loaded, spec, train_queries, rotate)


def _sinusoid(spec: str) -> TaskSources:
    from ..data import sinusoid_tasks

    shots, queries = sinusoid_spec(spec)

    def stream(tag: int) -> TaskSampler:
        def sample(key: Key, n: int) -> Task:
            return Task.of(sinusoid_tasks(random.fold_in(key, tag), n, shots, queries))
        return sample

    return TaskSources("regression", stream(0), stream(1), stream(2), 1, 1, 1)


_SINUSOID_SPEC = re.compile(r"(?:\d+way)?(\d+)shot(?:(\d+)query)?")


def sinusoid_spec(text: str) -> tuple[int, int]:
    """``"10shot"`` (or ``"10shot20query"``; a ``"<N>way"`` prefix is ignored) -> ``(K, Q)``;
    the query count defaults to K, as in the MAML paper."""
    m = _SINUSOID_SPEC.fullmatch(text.strip().lower())
    if m is None or int(m[1]) < 1 or (m[2] is not None and int(m[2]) < 1):
        raise TaskSpecError(f"sinusoid task spec {text!r} is not of the form '<K>shot' or "
                            "'<K>shot<Q>query' with K, Q >= 1, e.g. '10shot'")
    return int(m[1]), int(m[2] or m[1])


__all__ = ["DATASETS", "TaskSources", "sinusoid_spec", "task_sources"]
