"""Where meta-training gets its tasks and its model: datasets to task samplers, configs to Models.

A :class:`TaskSources` holds one :data:`~funcgraph.meta.evaluate.TaskSampler` per split:
``train`` (meta-training), ``val`` (periodic validation, for the best checkpoint) and
``test`` (the final held-out score). Classification datasets split by class (glyphs:
background / validation / evaluation alphabets), so the three never share a class;
sinusoid tasks are drawn from independent key streams.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import random
from ..errors import ConfigError, DataError, TaskSpecError
from ..model import Model
from ..random import Key
from .evaluate import TaskSampler
from .learner import Task

DATASETS = ("glyphs", "omniglot", "sinusoid")


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
    from ..data.tasks import TaskSpec, sample_tasks

    eval_spec = TaskSpec.parse(spec)
    train_spec = TaskSpec(eval_spec.ways, eval_spec.shots, train_queries or eval_spec.queries)
    train_ds = rotate_classes(datasets["train"]) if rotate else datasets["train"]

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
    image_size: int = 28,
) -> TaskSources:
    """The samplers for ``dataset`` (``"glyphs"``, ``"omniglot"`` or ``"sinusoid"``).

    Arguments:
        spec: the task spec (``"5way1shot"``, ``"5way1shot15query"``) for validation and test.
            For sinusoid, ``shots`` is K (points to adapt on) and ``queries`` the points scored.
        train_queries: query examples per class in meta-training (default: the spec's).
        data_root: the Omniglot folder (``images_background/``, ``images_evaluation/``).
        rotate: augment the training classes with 90/180/270-degree rotations (MAML protocol).
    """
    if dataset in ("glyphs", "omniglot"):
        from ..data.tasks import TaskSpec

        TaskSpec.parse(spec)  # a bad spec fails before any data is loaded
    if dataset == "glyphs":
        from ..data.glyphs import load_glyphs

        splits = {"train": "background", "val": "validation", "test": "evaluation"}
        loaded = {k: load_glyphs(s, image_size=image_size) for k, s in splits.items()}
        return _classification(loaded, spec, train_queries, rotate)
    if dataset == "omniglot":
        from ..data import load_omniglot

        if data_root is None:
            raise DataError("--dataset omniglot needs --data-root DIR holding "
                            "images_background/ and images_evaluation/")
        splits = {"train": "background", "val": "validation", "test": "evaluation"}
        loaded = {k: load_omniglot(Path(data_root), s, image_size=image_size)
                  for k, s in splits.items()}
        return _classification(loaded, spec, train_queries, rotate)
    if dataset == "sinusoid":
        from ..data import sinusoid_tasks

        shots, queries = sinusoid_spec(spec)

        def stream(tag: int) -> TaskSampler:
            def sample(key: Key, n: int) -> Task:
                return Task.of(sinusoid_tasks(random.fold_in(key, tag), n, shots, queries))
            return sample

        return TaskSources("regression", stream(0), stream(1), stream(2), 1, 1, 1)
    raise ConfigError(f"--dataset must be one of {DATASETS}, got {dataset!r}")


_SINUSOID_SPEC = re.compile(r"(?:\d+way)?(\d+)shot(?:(\d+)query)?")


def sinusoid_spec(text: str) -> tuple[int, int]:
    """``"10shot"`` (or ``"10shot20query"``; a ``"<N>way"`` prefix is ignored) -> ``(K, Q)``;
    the query count defaults to K, as in the MAML paper."""
    m = _SINUSOID_SPEC.fullmatch(text.strip().lower())
    if m is None or int(m[1]) < 1 or (m[2] is not None and int(m[2]) < 1):
        raise TaskSpecError(f"sinusoid task spec {text!r} is not of the form '<K>shot' or "
                            "'<K>shot<Q>query' with K, Q >= 1, e.g. '10shot'")
    return int(m[1]), int(m[2] or m[1])


def default_model_config(algo: str, sources: TaskSources) -> dict[str, Any]:
    """``config["model"]`` for the built-in models: conv4 (no head for protonet) or the MLP."""
    if sources.kind == "regression":
        return {"name": "mlp", "in_features": 1, "out_features": 1, "hidden": [40, 40]}
    return {"name": "conv4", "ways": None if algo == "protonet" else sources.ways,
            "in_channels": sources.in_channels, "hidden": 64, "image_size": sources.image_size,
            "variant": "strided"}


def parse_value(text: str) -> Any:
    """A ``--set`` value: JSON when it parses (``3``, ``0.5``, ``[40, 40]``), else text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_sets(items: list[str]) -> dict[str, str]:
    """``["hidden=32", "variant=pool"]`` -> ``{"hidden": "32", "variant": "pool"}``."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--set expects NAME=VALUE, got {item!r}")
        out[name.strip()] = value.strip()
    return out


def model_config(
    algo: str, sources: TaskSources, *, factory: str | None = None, sets: Sequence[str] = ()
) -> dict[str, Any]:
    """The resolved ``config["model"]``: the built-in model with ``--set`` overrides, or
    ``{"factory": path_or_name, "overrides": {...}}`` for a :mod:`funcgraph.factory` config."""
    overrides = parse_sets(list(sets))
    if factory is not None:
        return {"factory": str(factory), "overrides": overrides}
    cfg = default_model_config(algo, sources)
    for name, value in overrides.items():
        if name not in cfg or name == "name":
            raise ConfigError(f"--set {name}: {cfg['name']} has no hyperparameter {name!r}; "
                              f"expected one of {sorted(k for k in cfg if k != 'name')}")
        cfg[name] = parse_value(value)
    return cfg


def build_model(config: Mapping[str, Any], *, dtype: torch.dtype = torch.float32) -> Model:
    """The Model for a run's ``config["model"]`` (see :func:`model_config`)."""
    if "factory" in config:
        try:
            from ..factory import load_model
        except ImportError as e:
            raise ConfigError(f"--model needs funcgraph.factory, which failed to import: {e}"
                              ) from None
        return load_model(str(config["factory"]), dict(config.get("overrides", {})))
    from ..models import build

    return build({**config, "dtype": dtype})


__all__ = ["DATASETS", "TaskSources", "build_model", "default_model_config", "model_config",
           "parse_sets", "parse_value", "sinusoid_spec", "task_sources"]
