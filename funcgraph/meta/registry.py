"""The algorithm registry: every meta-learning algorithm a run can name, with its settings.

A run names its algorithm by one word (``funcgraph meta-train --algo mamlpp``); this table
turns the word into what the run needs: the typed settings record and its defaults
(:mod:`funcgraph.meta.settings`), the builder of the learner, which run options apply to it,
and the run recipe it was tuned with (meta-batch, steps, queries, meta learning rate). The run
layer and the CLI read names, help, defaults and the options that apply from here, so a new
algorithm is one module plus one :func:`register_algorithm` call, and an algorithm of the
user's own registers the same way from their module (loaded with ``--import MODULE``)::

    from dataclasses import dataclass
    from funcgraph.meta import AdaptSettings, TaskInfo, maml, register_algorithm

    @dataclass(frozen=True)
    class MineSettings(AdaptSettings):
        inner_lr: float = 0.3

    def build_mine(apply, settings: MineSettings, info: TaskInfo):
        return maml(apply, kind=info.kind, inner_steps=settings.inner_steps,
                    inner_lr=settings.inner_lr, eval_steps=settings.eval_steps, name="mine")

    register_algorithm("mine", settings=MineSettings, build=build_mine,
                       summary="MAML at inner rate 0.3")

A builder is ``build(apply, settings, info) -> MetaLearner``: ``apply`` the model's bound
forward, ``settings`` a record of the entry's settings class, ``info`` the
:class:`TaskInfo` of the run. It may be given as ``"module:attribute"``, imported on first
use: the built-in entries below are, so reading this table imports no torch (``funcgraph
--help`` lists the names without loading an algorithm).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any

from .._name_table import NameTable
from ..errors import ConfigError
from .settings import (
    MAMLPP_META_STEPS,
    FomamlSettings,
    ImamlSettings,
    MamlppSettings,
    MamlSettings,
    ProtonetSettings,
    ReptileSettings,
    Settings,
)

DEFAULT_META_LR = 3e-3
"""The meta learning rate (Adam's) of an algorithm whose :class:`Recipe` names none: the run
default of ``funcgraph meta-train --meta-lr``, and :class:`~funcgraph.meta.trainer.MetaTrainer`'s
(:meth:`AlgorithmType.meta_lr`)."""

Builder = Callable[..., Any] | str
"""``build(apply, settings, info) -> MetaLearner``, or ``"module:attribute"`` naming one."""


@dataclass(frozen=True)
class TaskInfo:
    """What a builder knows of the run's tasks.

    Attributes:
        kind: ``"classification"`` or ``"regression"``.
        ways: classes per task (``None`` for regression).
        meta_steps: the run's meta-steps (schedules such as MAML++'s MSL annealing use it).
    """

    kind: str = "classification"
    ways: int | None = None
    meta_steps: int = 500


@dataclass(frozen=True)
class Recipe:
    """The run settings an algorithm was tuned with, where they differ from the run's own
    defaults (``None``: the run's default). ``funcgraph meta-train --algo NAME`` starts
    from these. A setting that only makes sense for the recipe's run length
    (``first_order_until``, a step number) lives here, not in the settings record, whose
    defaults are the library function's."""

    meta_batch: int | None = None
    steps: int | None = None
    train_queries: int | None = None
    meta_lr: float | None = None
    cosine_meta_lr: bool | None = None
    rotate: bool | None = None
    first_order_until: int | None = None
    hidden: int | None = None
    """The width (hidden channels) of the default conv4 on image tasks."""

    def given(self) -> dict[str, Any]:
        """The run options that are set, by name (``hidden`` is the model's: see
        :attr:`hidden`)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None and f.name != "hidden"}


@dataclass(frozen=True)
class AlgorithmType:
    """One registry entry.

    Attributes:
        name: what a run names it by (``--algo NAME``).
        settings: the settings class (a frozen dataclass deriving from
            :class:`~funcgraph.meta.settings.Settings`); its defaults are the algorithm's.
        build: the builder (see the module docstring).
        summary: one line for ``--help``.
        kinds: the task kinds it can learn (protonet: classification only).
        second_order: its meta-gradient has a second-order term that ``--first-order`` drops.
        remat: ``--remat`` (the rematerialised inner loop) applies.
        running_stats: ``--bn-running-stats`` (per-step running statistics) applies.
        recipe: the run settings it was tuned with.
    """

    name: str
    settings: type[Settings]
    build: Builder
    summary: str = ""
    kinds: tuple[str, ...] = ("classification", "regression")
    second_order: bool = False
    remat: bool = False
    running_stats: bool = False
    recipe: Recipe = Recipe()

    @property
    def inner_loop(self) -> bool:
        """Whether it adapts by inner steps (its settings have ``inner_steps``)."""
        return "inner_steps" in self.setting_names()

    def setting_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.settings))

    def default(self, name: str) -> Any:
        """The default of setting ``name`` (a ConfigError when it has none)."""
        for f in fields(self.settings):
            if f.name == name and f.default is not MISSING:
                return f.default
        raise ConfigError(f"algorithm {self.name!r} has no setting {name!r} with a default; "
                          f"its settings are {list(self.setting_names())}")

    def defaults(self) -> Settings:
        """The settings record of the defaults."""
        return self.settings()

    def meta_lr(self) -> float:
        """The meta learning rate the algorithm was tuned with: its recipe's, else
        :data:`DEFAULT_META_LR`."""
        return DEFAULT_META_LR if self.recipe.meta_lr is None else self.recipe.meta_lr

    def builder(self) -> Callable[..., Any]:
        """The builder function (imported on first use when given as a string)."""
        if not isinstance(self.build, str):
            return self.build
        module, _, attribute = self.build.partition(":")
        try:
            return getattr(importlib.import_module(module), attribute)
        except Exception as e:  # absent or broken: name what was missing
            raise ConfigError(f"algorithm {self.name!r} needs {self.build}, which is not "
                              f"available: {type(e).__name__}: {e}") from None


_REGISTRY: NameTable[AlgorithmType] = NameTable(
    "register_algorithm",
    lambda name, hint: f"--algo {name}: not a registered algorithm{hint}; expected one of "
                       f"{algorithm_names()}; an algorithm of your own registers with "
                       "funcgraph.meta.register_algorithm in a module loaded by --import MODULE")


def _check(entry: AlgorithmType) -> None:
    """Refuse an entry a run could not use, naming the argument at fault."""
    if not isinstance(entry.name, str) or not entry.name.strip() or entry.name != \
            entry.name.strip():
        raise ConfigError(f"register_algorithm: name must be a non-empty string without "
                          f"surrounding spaces, got {entry.name!r}")
    who = f"register_algorithm({entry.name!r})"
    if not (isinstance(entry.settings, type) and issubclass(entry.settings, Settings)):
        raise ConfigError(f"{who}: settings must be a frozen dataclass deriving from "
                          f"funcgraph.meta.Settings, got {entry.settings!r}")
    try:
        entry.settings()
    except TypeError as e:
        raise ConfigError(f"{who}: settings {entry.settings.__name__} must give every field a "
                          f"default (the algorithm's defaults): {e}") from None
    if not (callable(entry.build) or (isinstance(entry.build, str) and ":" in entry.build)):
        raise ConfigError(f"{who}: build must be a function (apply, settings, info) -> "
                          f"MetaLearner or 'module:attribute', got {entry.build!r}")
    if not entry.kinds or not set(entry.kinds) <= {"classification", "regression"}:
        raise ConfigError(f"{who}: kinds must name 'classification' and/or 'regression', got "
                          f"{entry.kinds!r}")


def register_algorithm(
    name: str,
    *,
    settings: type[Settings],
    build: Builder,
    summary: str = "",
    kinds: tuple[str, ...] = ("classification", "regression"),
    second_order: bool = False,
    remat: bool = False,
    running_stats: bool = False,
    recipe: Recipe | None = None,
    replace: bool = False,
) -> AlgorithmType:
    """Register an algorithm under ``name``, so that runs and ``--algo`` can name it.

    Arguments: see :class:`AlgorithmType`; ``replace`` allows replacing an entry.

    Raises:
        ConfigError: the name is taken (without ``replace``), or the entry is incomplete.
    """
    entry = AlgorithmType(name, settings, build, summary, tuple(kinds), second_order, remat,
                          running_stats, recipe or Recipe())
    _check(entry)
    return _REGISTRY.add(name, entry, replace=replace)


def unregister_algorithm(name: str) -> None:
    """Forget ``name`` (tests use it to undo a registration)."""
    _REGISTRY.remove(name)


def algorithm_names() -> list[str]:
    """Every registered name, in the order of registration (built-ins first)."""
    return _REGISTRY.names()


def algorithm_type(name: str) -> AlgorithmType:
    """The entry for ``name``; a ConfigError naming the registered ones if there is none."""
    return _REGISTRY.get(name)


def algorithm_help() -> str:
    """The registered names with their summaries, for ``--algo``'s help."""
    return "; ".join(f"{e.name} ({e.summary})" if e.summary else e.name
                     for e in _REGISTRY.values())


def defaults_help(setting: str) -> str:
    """``"1 (maml, fomaml); 5 (imaml, reptile)"``: the default of ``setting`` of every
    algorithm that has it, grouped by value, for an option's help (the bare value when one
    algorithm has it)."""
    groups: dict[str, list[str]] = {}
    for entry in _REGISTRY.values():
        if setting in entry.setting_names():
            groups.setdefault(f"{entry.default(setting)!r}", []).append(entry.name)
    if len(groups) == 1 and len(next(iter(groups.values()))) == 1:
        return next(iter(groups))  # one algorithm has it: its value says enough
    return "; ".join(f"{value} ({', '.join(names)})" for value, names in groups.items())


def recipe_help(field: str) -> str:
    """``"mamlpp 16"``: the algorithms whose recipe sets ``field``, with the value."""
    return ", ".join(f"{e.name} {e.recipe.given()[field]!r}" for e in _REGISTRY.values()
                     if field in e.recipe.given())


# The built-in algorithms (docs/meta-learning.md describes each); their modules load on use.
_MAML = "funcgraph.meta.maml_family"
register_algorithm("maml", settings=MamlSettings, build=f"{_MAML}:build_maml",
                   summary="second-order MAML", second_order=True, remat=True)
register_algorithm("fomaml", settings=FomamlSettings, build=f"{_MAML}:build_maml",
                   summary="first-order MAML", second_order=True, remat=True)
register_algorithm("metasgd", settings=MamlSettings, build=f"{_MAML}:build_metasgd",
                   summary="learned per-parameter inner rates", second_order=True, remat=True)
register_algorithm("anil", settings=MamlSettings, build=f"{_MAML}:build_anil",
                   summary="adapts only the head", second_order=True, remat=True)
# MAML++ (Antoniou et al. 2019): the recipe two settings studies found on glyphs 5-way 1-shot
# (funcgraph tune over benchmarks/spaces/mamlpp_glyphs.toml, then the narrower
# mamlpp_glyphs_narrow.toml: its best trial, 15, chosen on the validation alphabets, 15
# CPU-minutes a trial at most) and confirmed on the patterns set with three seeds: 2,775
# steps of 16 tasks with 3 queries per class, first order for the first 2, Adam at 3.95e-3
# annealed by a cosine, rotated classes, conv4 of width 32. Recorded results:
# docs/results/meta-learning.md.
register_algorithm("mamlpp", settings=MamlppSettings,
                   build="funcgraph.meta.mamlpp:build_mamlpp",
                   summary="MAML++: per-step rates and batch norm, multi-step loss",
                   second_order=True, running_stats=True,
                   recipe=Recipe(meta_batch=16, steps=MAMLPP_META_STEPS, train_queries=3,
                                 meta_lr=3.95e-3, cosine_meta_lr=True, rotate=True,
                                 first_order_until=2, hidden=32))
register_algorithm("imaml", settings=ImamlSettings, build="funcgraph.meta.imaml:build_imaml",
                   summary="implicit MAML, conjugate gradients")
# Reptile: Adam 3e-3 on the pseudo-gradient; 5 queries per class give the inner minibatches.
register_algorithm("reptile", settings=ReptileSettings,
                   build="funcgraph.meta.reptile:build_reptile",
                   summary="first-order, no query loss", recipe=Recipe(train_queries=5))
# Prototypical networks have no inner loop; more queries per class are cheap.
register_algorithm("protonet", settings=ProtonetSettings,
                   build="funcgraph.meta.protonet:build_protonet",
                   summary="distances to class prototypes, no inner loop",
                   kinds=("classification",), recipe=Recipe(train_queries=5, meta_lr=1e-3))

__all__ = ["DEFAULT_META_LR", "AlgorithmType", "Builder", "Recipe", "TaskInfo", "algorithm_help",
           "algorithm_names", "algorithm_type", "defaults_help", "recipe_help",
           "register_algorithm", "unregister_algorithm"]
