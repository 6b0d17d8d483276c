"""Tasks from one call: meta-batches over a named data set or a ClassDataset, keys inside.

::

    for batch in tasks("glyphs", "5way1shot", batch=16):             # forever
        ...
    held_out = tasks("glyphs", "5way1shot", batch=50, count=12, split="test")  # 600 tasks

A :class:`TaskStream` is a small frozen record: the split's sampler ``(key, n) -> Task`` and
a root key. Batch ``i`` is ``sample(fold_in(key, i), batch)``, so iterating twice gives the
same batches, and :func:`~funcgraph.meta.evaluate.evaluate` with the stream's sampler, key
and batch size (what :meth:`MetaTrainer.evaluate <funcgraph.meta.trainer.MetaTrainer.evaluate>`
does) scores exactly the tasks the iteration yields.

The sampling is the data package's: a dataset of the registry (:mod:`funcgraph.data.registry`)
loads its split (classification: ``sample_tasks`` over the split's classes, the spec checked
against them first) or draws from its sampler (regression: the split's own stream, key folded
with the split's position in ``("train", "val", "test")``, as ``funcgraph meta-train`` draws
them). Model keys (dropout) are not attached here: the trainer and ``evaluate`` give each task
its own when the learner's model takes keys.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import random
from ..checks import check_choice, check_int
from ..data.datasets import ClassDataset
from ..data.registry import RUN_SPLITS, dataset_type
from ..data.tasks import TaskSpec, check_fits, regression_spec, sample_tasks
from ..errors import ConfigError
from ..placement import resolve_device
from ..random import Key
from .evaluate import TaskSampler
from .learner import Task


@dataclass(frozen=True)
class TaskStream:
    """Batches of ``batch`` tasks from one split: iterate it for :class:`Task` batches.

    Attributes:
        sample: the split's sampler, ``sample(key, n) -> Task`` (a :data:`TaskSampler`).
        key: the root key; batch ``i`` is ``sample(fold_in(key, i), batch)``.
        batch: tasks per batch (the meta-batch).
        count: batches the iteration yields; ``None``: forever (meta-training).
        kind: ``"classification"`` or ``"regression"``.
    """

    sample: TaskSampler
    key: Key
    batch: int
    count: int | None = None
    kind: str = "classification"

    def __iter__(self) -> Iterator[Task]:
        for i in itertools.count() if self.count is None else range(self.count):
            yield self.sample(random.fold_in(self.key, i), self.batch)

    @property
    def episodes(self) -> int:
        """The tasks of a finite stream, ``count * batch``.

        Raises:
            ConfigError: the stream is endless (``count=None``).
        """
        if self.count is None:
            raise ConfigError("TaskStream: an endless stream has no number of tasks; build the "
                              "held-out one with tasks(..., count=N)")
        return self.count * self.batch


def tasks(
    dataset: str | ClassDataset,
    spec: str | TaskSpec,
    *,
    batch: int,
    split: str = "train",
    seed: int = 0,
    count: int | None = None,
    image_size: int | None = None,
    data_root: str | Path | None = None,
    device: torch.device | str = "cpu",
) -> TaskStream:
    """Meta-batches of ``spec`` tasks from ``dataset``'s ``split``, from ``random.key(seed)``.

    Arguments:
        dataset: a registered dataset name (``"glyphs"``, ``"sinusoid"``,
            ``funcgraph.data.dataset_names()``) or a :class:`~funcgraph.data.ClassDataset`
            of your own (one split already).
        spec: classification ``"5way1shot"`` (``"5way1shot1query"``: one query per class) or
            a :class:`~funcgraph.data.TaskSpec`; regression ``"10shot"`` (K points to adapt on,
            as many scored) or ``"10shot20query"``.
        batch: tasks per batch.
        split: ``"train"``, ``"val"`` or ``"test"`` of a named dataset (glyphs: background,
            validation and evaluation alphabets, which share no class).
        seed: the root key's seed: the same seed gives the same tasks.
        count: batches to yield (held-out scoring); ``None``: endless (meta-training).
        image_size: resize a named image dataset's images (default: the dataset's).
        data_root: the folder of a dataset that reads one (omniglot, folder, ...).
        device: where the tasks are put (``"auto"``, ``"cpu"``, ``"cuda"``...).

    Raises:
        ConfigError: an argument of the wrong kind or out of range, an unknown dataset.
        TaskSpecError: a malformed spec, or one the split cannot fill.
    """
    check_int("tasks", "batch", batch)
    check_int("tasks", "seed", seed, minimum=0)
    if count is not None:
        check_int("tasks", "count", count)
    check_choice("tasks", "split", split, RUN_SPLITS)
    to = resolve_device(device)
    if isinstance(dataset, ClassDataset):
        if split != "train":
            raise ConfigError(f"tasks: a ClassDataset is one split already; pass the "
                              f"ClassDataset of that split instead of split={split!r}")
        draw, kind = _classification(dataset, spec), "classification"
    elif isinstance(dataset, str):
        entry = dataset_type(dataset)
        kind = entry.kind
        if kind == "regression":
            if not isinstance(spec, str):
                raise ConfigError(f"tasks: {dataset} is regression; its spec is a string such "
                                  f"as '10shot', got {spec!r}")
            draw = _regression(entry.sampler(), regression_spec(spec, dataset),
                               RUN_SPLITS.index(split))
        else:
            parsed = _spec(spec)  # a bad spec fails before the data loads
            ds = entry.load_split(split, image_size=image_size, root=data_root)
            draw = _classification(ds, parsed)
    else:
        raise ConfigError(f"tasks: dataset must be a registered name or a ClassDataset, got "
                          f"{type(dataset).__name__}")

    def sample(key: Key, n: int) -> Task:
        return draw(key, n).to(to)

    return TaskStream(sample, random.key(seed), batch, count, kind)


def _spec(spec: str | TaskSpec) -> TaskSpec:
    if isinstance(spec, TaskSpec):
        return spec
    if not isinstance(spec, str):
        raise ConfigError(f"tasks: spec must be a string such as '5way1shot' or a TaskSpec, "
                          f"got {spec!r}")
    return TaskSpec.parse(spec)


def _classification(ds: ClassDataset, spec: str | TaskSpec) -> TaskSampler:
    parsed = _spec(spec)
    check_fits(ds, parsed)
    return lambda key, n: Task.of(sample_tasks(key, ds, parsed, n))


def _regression(draw: Callable[..., Any], shots_queries: tuple[int, int],
                tag: int) -> TaskSampler:
    shots, queries = shots_queries
    return lambda key, n: Task.of(draw(random.fold_in(key, tag), n, shots, queries))


__all__ = ["TaskStream", "tasks"]
