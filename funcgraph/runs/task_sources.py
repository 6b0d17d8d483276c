"""Where meta-training gets its tasks: a dataset name to one task sampler per split.

A :class:`TaskSources` holds one :data:`~funcgraph.meta.TaskSampler` per split:
``train`` (meta-training), ``val`` (periodic validation, for the best checkpoint) and
``test`` (the final held-out score). The dataset comes from the dataset registry
(:mod:`funcgraph.data.registry`): classification datasets split by class (glyphs:
background / validation / evaluation alphabets), so the three never share a class;
regression tasks (sinusoid) are drawn from independent key streams.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import random
from ..meta import Task, TaskSampler
from ..random import Key

if TYPE_CHECKING:
    from .meta_training.config import MetaTrainConfig


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


def task_sources(
    dataset: str,
    *,
    spec: str = "5way1shot",
    train_queries: int | None = None,
    data_root: str | Path | None = None,
    rotate: bool = False,
    image_size: int | None = None,
) -> TaskSources:
    """The samplers for ``dataset``, a name in the dataset registry
    (:func:`funcgraph.data.registry.dataset_names`).

    Arguments:
        spec: the task spec (``"5way1shot"``, ``"5way1shot15query"``) for validation and test.
            For regression, ``shots`` is K (points to adapt on) and ``queries`` the points
            scored.
        train_queries: query examples per class in meta-training (default: the spec's).
        data_root: the folder of a dataset that reads one (``reads_data_root``).
        rotate: augment the training classes with 90/180/270-degree rotations (MAML protocol).
        image_size: images are resized to ``image_size`` squared (default: the dataset's).
    """
    from ..data.registry import RUN_SPLITS, dataset_type

    entry = dataset_type(dataset)
    if entry.kind == "regression":
        return _regression(entry.name, entry.sampler(), spec)
    from ..data.tasks import TaskSpec

    TaskSpec.parse(spec)  # a bad spec fails before any data is loaded
    loaded = {split: entry.load_split(split, image_size=image_size, root=data_root)
              for split in RUN_SPLITS}
    return _classification(loaded, spec, train_queries, rotate)


def sources_for(cfg: MetaTrainConfig) -> TaskSources:
    """The task sources a ``meta-train`` config runs on: :func:`task_sources` of its data
    set, task spec, training queries, data root, rotation and image size."""
    return task_sources(cfg.dataset, spec=cfg.tasks, train_queries=cfg.train_queries,
                        data_root=cfg.data_root, rotate=cfg.rotate, image_size=cfg.image_size)


def _regression(dataset: str, sample_tasks: Callable[..., Any], spec: str) -> TaskSources:
    """Independent task streams per split: the key folded with 0, 1, 2."""
    from ..data.tasks import regression_spec

    shots, queries = regression_spec(spec, dataset)

    def stream(tag: int) -> TaskSampler:
        def sample(key: Key, n: int) -> Task:
            return Task.of(sample_tasks(random.fold_in(key, tag), n, shots, queries))
        return sample

    return TaskSources("regression", stream(0), stream(1), stream(2), 1, 1, 1)


__all__ = ["TaskSources", "sources_for", "task_sources"]
