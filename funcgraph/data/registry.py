"""The dataset registry: every dataset a run can name, and how to get its tasks.

A run names its data by one word (``funcgraph meta-train --dataset rgb-shapes``); this table
turns the word into what the run needs: the kind of tasks, the dataset's own split names,
its default image size, whether it reads ``--data-root``, and the function that loads a split
(classification) or draws tasks (regression). The run layer and the CLI read names, help
and defaults from here, so a new dataset is one module plus one :func:`register_dataset`
call, and a dataset of the user's own registers the same way from their module (loaded with
``--import MODULE``)::

    from funcgraph.data import ClassDataset, register_dataset

    def load_mine(split: str, *, image_size: int) -> ClassDataset: ...

    register_dataset("mine", load=load_mine, splits=("train", "val", "test"), image_size=28)

The calling conventions (see :class:`DatasetType`):

* classification: ``load(split, *, image_size) -> ClassDataset``, or with
  ``reads_data_root=True`` ``load(root, split, *, image_size)``, called once per split with
  the dataset's names for the run's train, val and test splits (``splits``);
* regression: ``sample(key, num_tasks, shots, queries)`` returns a batch with ``support_x``,
  ``support_y``, ``query_x``, ``query_y`` (``(T, K, 1)``, ``(T, Q, 1)``), as
  :func:`~funcgraph.data.sinusoid_tasks` does.

A function may be given as ``"module:attribute"``, imported on first use: the built-in
entries below are, so reading this table imports neither torch's data code nor an image
reader (``funcgraph --help`` lists the names without loading a generator).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .._name_table import NameTable
from ..errors import ConfigError, DataError

Kind = Literal["classification", "regression"]
KINDS: tuple[Kind, ...] = ("classification", "regression")

RUN_SPLITS = ("train", "val", "test")
"""The run's three splits, in the order of :attr:`DatasetType.splits`."""

Target = Callable[..., Any] | str
"""A function, or ``"module:attribute"`` naming one (imported on first use)."""


def _resolve(target: Target, dataset: str) -> Callable[..., Any]:
    if not isinstance(target, str):
        return target
    module, _, attribute = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except Exception as e:  # absent or broken in this installation: name what was missing
        raise ConfigError(f"dataset {dataset!r} needs {target}, which is not available: "
                          f"{type(e).__name__}: {e}") from None


@dataclass(frozen=True)
class DatasetType:
    """One registry entry (see the module docstring for the calling conventions).

    Attributes:
        name: what a run names it by (``--dataset NAME``).
        kind: ``"classification"`` (N-way K-shot tasks from class splits) or
            ``"regression"`` (tasks drawn from a key).
        load: classification: loads one split as a ClassDataset.
        sample: regression: draws a batch of tasks.
        splits: classification: the dataset's names for the run's train, val and test splits
            (glyphs: background, validation, evaluation).
        image_size: classification: the default side of the square images.
        reads_data_root: whether ``load`` reads a folder (``--data-root``) first.
    """

    name: str
    kind: Kind
    load: Target | None = None
    sample: Target | None = None
    splits: tuple[str, ...] = RUN_SPLITS
    image_size: int | None = None
    reads_data_root: bool = False

    def load_split(self, split: str, *, image_size: int | None = None,
                   root: str | Path | None = None) -> Any:
        """The ClassDataset of the run's ``split`` (``"train"``, ``"val"``, ``"test"``) at
        ``image_size`` (default :attr:`image_size`), read from ``root`` when the dataset
        reads a data root."""
        load = self.loader()
        if split not in RUN_SPLITS:
            raise ConfigError(f"DatasetType.load_split: unknown split {split!r}; expected one "
                              f"of {list(RUN_SPLITS)}")
        own = self.splits[RUN_SPLITS.index(split)]
        size = self.image_size if image_size is None else image_size
        if not self.reads_data_root:
            return load(own, image_size=size)
        if root is None:
            raise DataError(f"--dataset {self.name} needs --data-root DIR (layouts: "
                            "docs/data.md)")
        return load(Path(root), own, image_size=size)

    def loader(self) -> Callable[..., Any]:
        """The classification split loader (see the module docstring)."""
        if self.load is None:
            raise ConfigError(f"dataset {self.name!r} is {self.kind}: it has no splits to load")
        return _resolve(self.load, self.name)

    def sampler(self) -> Callable[..., Any]:
        """The regression task sampler ``sample(key, num_tasks, shots, queries)``."""
        if self.sample is None:
            raise ConfigError(f"dataset {self.name!r} is {self.kind}: it loads splits, it does "
                              "not sample regression tasks")
        return _resolve(self.sample, self.name)


_REGISTRY: NameTable[DatasetType] = NameTable(
    "register_dataset",
    lambda name, hint: f"dataset {name!r} is not registered{hint}; expected one of "
                       f"{dataset_names()}; a dataset of your own registers with "
                       "funcgraph.data.register_dataset in a module loaded by --import MODULE")


def _check(entry: DatasetType) -> None:
    """Refuse an entry a run could not use, naming the argument at fault."""
    who = f"register_dataset({entry.name!r})"
    if not isinstance(entry.name, str) or not entry.name or entry.name != entry.name.strip():
        raise ConfigError(f"register_dataset: name must be a non-empty string without "
                          f"surrounding spaces, got {entry.name!r}")
    if entry.kind not in KINDS:
        raise ConfigError(f"{who}: kind must be one of {list(KINDS)}, got {entry.kind!r}")
    needed, unused = ("load", "sample") if entry.kind == "classification" else ("sample", "load")
    function = getattr(entry, needed)
    if not (callable(function) or (isinstance(function, str) and ":" in function)):
        raise ConfigError(f"{who}: a {entry.kind} dataset needs {needed}= a function or "
                          f"'module:attribute', got {function!r}")
    if getattr(entry, unused) is not None:
        raise ConfigError(f"{who}: a {entry.kind} dataset takes {needed}=, not {unused}=")
    if entry.kind == "regression":
        if entry.image_size is not None or entry.reads_data_root:
            raise ConfigError(f"{who}: a regression dataset has no images and reads no data "
                              "root; leave image_size and reads_data_root unset")
        return
    size = entry.image_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 8:
        raise ConfigError(f"{who}: image_size must be an int >= 8, got {size!r}")
    splits = entry.splits
    named = all(isinstance(s, str) and s for s in splits)
    if not named or len(splits) != 3 or len(set(splits)) != 3:
        raise ConfigError(f"{who}: splits must be three different split names (for train, "
                          f"val, test), got {splits!r}")


def register_dataset(
    name: str,
    *,
    kind: Kind = "classification",
    load: Target | None = None,
    sample: Target | None = None,
    splits: Sequence[str] = RUN_SPLITS,
    image_size: int | None = None,
    reads_data_root: bool = False,
    replace: bool = False,
) -> DatasetType:
    """Register a dataset under ``name``, so that runs and ``--dataset`` can name it.

    Arguments (see :class:`DatasetType`): ``load`` for classification or ``sample`` for
    regression, as a function or ``"module:attribute"``; ``splits`` the dataset's names for
    the run's train, val, test splits; ``image_size`` the default image side (classification
    only); ``reads_data_root`` whether ``load`` takes the ``--data-root`` folder first;
    ``replace`` allows replacing an entry.

    Raises:
        ConfigError: the name is taken (without ``replace``), or the entry is incomplete.
    """
    entry = DatasetType(name, kind, load, sample, tuple(splits), image_size, reads_data_root)
    _check(entry)
    return _REGISTRY.add(name, entry, replace=replace)


def unregister_dataset(name: str) -> None:
    """Forget ``name`` (tests use it to undo a registration)."""
    _REGISTRY.remove(name)


def dataset_names() -> list[str]:
    """Every registered name, in the order of registration (built-ins first)."""
    return _REGISTRY.names()


def dataset_type(name: str) -> DatasetType:
    """The entry for ``name``; a ConfigError naming the registered ones if there is none."""
    return _REGISTRY.get(name)


def reads_data_root(name: str) -> bool:
    """Whether dataset ``name`` reads ``--data-root`` (the on-disk layouts of docs/data.md)."""
    return dataset_type(name).reads_data_root


def check_data_root(name: str, data_root: object) -> None:
    """Refuse ``data_root`` for a dataset that reads none (a run would silently ignore it), and
    an unregistered ``name``: a ConfigError naming the datasets that read one."""
    if not dataset_type(name).reads_data_root and data_root is not None:
        readers = ", ".join(e.name for e in _REGISTRY.values() if e.reads_data_root)
        raise ConfigError(f"--data-root is read by --dataset {readers}; {name} is generated")


def _grouped(label: Callable[[DatasetType], str | None]) -> str:
    """``"a, b (label 1); c (label 2)"``: the registered names grouped by ``label(entry)``, in
    the order of registration; entries labelled ``None`` are left out."""
    groups: dict[str, list[str]] = {}
    for entry in _REGISTRY.values():
        text = label(entry)
        if text is not None:
            groups.setdefault(text, []).append(entry.name)
    return "; ".join(f"{', '.join(names)} ({text})" for text, names in groups.items())


def dataset_help() -> str:
    """The registered names for ``--dataset``'s help, grouped by what they need."""
    return _grouped(lambda e: "regression" if e.kind == "regression" else
                    "need --data-root" if e.reads_data_root else "generated")


def image_size_help() -> str:
    """The default image size of every image dataset, for ``--image-size``'s help."""
    return _grouped(lambda e: None if e.image_size is None else f"{e.image_size}px")


# The built-in datasets (docs/data.md describes each); their modules load on first use.
_OMNIGLOT_SPLITS = ("background", "validation", "evaluation")
register_dataset("glyphs", load="funcgraph.data.glyphs:load_glyphs", splits=_OMNIGLOT_SPLITS,
                 image_size=28)
register_dataset("omniglot", load="funcgraph.data.omniglot:load_omniglot",
                 splits=_OMNIGLOT_SPLITS, image_size=28, reads_data_root=True)
register_dataset("rgb-shapes", load="funcgraph.data.rgb_shapes:load_rgb_shapes", image_size=84)
register_dataset("patterns", load="funcgraph.data.patterns:load_patterns", image_size=28)
register_dataset("folder", load="funcgraph.data.folders:load_folder", image_size=84,
                 reads_data_root=True)
register_dataset("mini-imagenet", load="funcgraph.data.folders:load_mini_imagenet",
                 image_size=84, reads_data_root=True)
register_dataset("cub", load="funcgraph.data.folders:load_cub", image_size=84,
                 reads_data_root=True)
register_dataset("sinusoid", kind="regression", sample="funcgraph.data.sinusoid:sinusoid_tasks")

__all__ = ["KINDS", "RUN_SPLITS", "DatasetType", "check_data_root", "dataset_help",
           "dataset_names", "dataset_type", "image_size_help", "reads_data_root",
           "register_dataset", "unregister_dataset"]
