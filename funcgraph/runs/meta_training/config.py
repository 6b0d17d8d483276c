"""The config of a ``funcgraph meta-train`` run and where its defaults come from.

A :class:`MetaTrainConfig` is flat (it is the run's ``config.json``); its algorithm fields
are read into the algorithm's typed settings (:func:`algorithm_settings`) when the learner is
built. Defaults are written once: an algorithm's inner-loop settings are its settings class's
field defaults (:mod:`funcgraph.meta.settings`), the run recipe it was tuned with is its
registry entry's :class:`~funcgraph.meta.registry.Recipe`, and :func:`default_config` layers
them, then the dataset's defaults, then the options the user set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ...checks import check_choice, check_int, check_number, check_rate, option
from ...data.registry import check_data_root, dataset_type
from ...errors import ConfigError
from ...meta.registry import (
    DEFAULT_META_LR,
    AlgorithmType,
    TaskInfo,
    algorithm_names,
    algorithm_type,
)
from ...meta.settings import INNER_OPTIMIZERS, ImamlSettings, MamlSettings, Settings
from ...meta.strategy import CHOICES, STRATEGIES, check_compiled_strategy
from ...precision import CHOICES as PRECISION_CHOICES

META_OPTIMIZERS = ("adam", "sgd")

CONFIG_NAMES = {"eval_steps": "inner_steps_eval", "lam": "imaml_lambda"}
"""Settings whose config field (and command-line option) has another name."""

FLAGS = ("first_order", "remat")
"""Settings the config holds as flags that add to the algorithm's own: fomaml's first order
stays on whatever ``--first-order`` says."""

_WHO = "meta-train"


@dataclass(frozen=True)
class MetaTrainConfig:
    """Everything a meta-training run depends on (stored as the run's ``config.json``).

    The run defaults are a CPU recipe (docs/meta-learning.md): meta-batch 32 with one query
    per class (learn2learn's Omniglot recipe; one query makes the step far cheaper than 15),
    Adam at 3e-3, 500 steps (recorded results: docs/results/meta-learning.md).
    The inner-loop fields default to MAML's settings (:class:`MamlSettings`); other
    algorithms' come from :func:`default_config`.
    """

    algo: str = "maml"
    dataset: str = "glyphs"
    data_root: str | None = None
    image_size: int | None = None
    tasks: str = "5way1shot"
    train_queries: int | None = 1
    rotate: bool = False
    meta_batch: int = 32
    steps: int = 500
    inner_steps: int = MamlSettings.inner_steps
    inner_steps_eval: int = MamlSettings.eval_steps
    inner_lr: float = MamlSettings.inner_lr
    meta_lr: float = DEFAULT_META_LR
    first_order: bool = False
    remat: bool = False
    cosine_meta_lr: bool = False
    linear_meta_lr: bool = False
    meta_optimizer: str = "adam"
    inner_optimizer: str = "sgd"
    inner_minibatches: bool = False
    msl_anneal_steps: int | None = None
    first_order_until: int = 0
    bn_running_stats: bool = False
    imaml_lambda: float = ImamlSettings.lam
    cg_steps: int = ImamlSettings.cg_steps
    cg_tol: float = ImamlSettings.cg_tol
    strategy: str = "auto"
    max_memory: int | None = None
    """Bytes the meta-step's estimated peak may take (``--max-memory``): vmap maps fewer tasks
    at a time to stay under it (:func:`~funcgraph.runs.meta_training.plan.plan_meta_train`)."""
    precision: str = "float32"
    compile: bool = False
    """The user's request (``--compile``): compile the whole meta-step."""
    threads: int = 0
    """CPU threads for torch (``--threads``; 0: the process's count). The run records the count
    it ran with, and ``--resume`` sets it again: the rounding of a step depends on it."""
    step_strategy: str | None = None
    """The strategy the meta-step takes (loop, threads or vmap); ``None``: ``strategy``
    resolved at the start. The run records what it took; a resume takes it again."""
    score_strategy: str | None = None
    """The strategy validation and the test score with; ``None``: resolved at the start (under
    ``--max-memory`` from the memory the process holds then). Recorded like
    ``step_strategy``; ``funcgraph evaluate`` scores with it."""
    chunk_size: int | None = None
    """Tasks vmap maps at a time as ``--max-memory`` left room for (``None``: the device's
    default); recorded by the run, so a resume maps the same chunks."""
    seed: int = 0
    validate_every: int = 250
    val_episodes: int = 200
    test_episodes: int = 600
    checkpoint_every: int = 50
    model: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    """Algorithm settings without a field (or option) of their own, by their name in the
    algorithm's settings class: a plugin algorithm's fields (``--setting NAME=VALUE``)."""

    def __post_init__(self) -> None:
        algorithm_type(self.algo)
        check_choice(_WHO, "--strategy", self.strategy, CHOICES)
        check_choice(_WHO, "--precision", self.precision, PRECISION_CHOICES)
        for name in ("step_strategy", "score_strategy"):
            if getattr(self, name) is not None:
                check_choice(_WHO, name, getattr(self, name), STRATEGIES)
        if self.step_strategy is not None and self.strategy in STRATEGIES and (
                self.step_strategy != self.strategy):
            raise ConfigError(f"--strategy {self.strategy}: the run's meta-step took "
                              f"{self.step_strategy}; a strategy cannot change mid-run")
        check_compiled_strategy(_WHO, self.compile, self.strategy, self.step_strategy,
                                compile_option="--compile", strategy_option="--strategy")
        check_int(_WHO, "--threads", self.threads, minimum=0)
        if self.chunk_size is not None:
            check_int(_WHO, "chunk_size", self.chunk_size, minimum=1)
        for name in ("meta_batch", "steps", "test_episodes", "val_episodes", "checkpoint_every"):
            check_int(_WHO, option(name), getattr(self, name), minimum=1)
        for name in ("inner_steps", "inner_steps_eval", "validate_every", "first_order_until"):
            check_int(_WHO, option(name), getattr(self, name), minimum=0)
        if self.train_queries is not None:
            check_int(_WHO, "--train-queries", self.train_queries, minimum=1)
        if self.max_memory is not None:
            check_int(_WHO, "--max-memory (bytes)", self.max_memory, minimum=1)
        for name in ("inner_lr", "meta_lr", "imaml_lambda"):
            check_rate(_WHO, option(name), getattr(self, name))
        check_int(_WHO, "--cg-steps", self.cg_steps, minimum=1)
        if self.msl_anneal_steps is not None:
            check_int(_WHO, "--msl-anneal-steps", self.msl_anneal_steps, minimum=1)
        check_number(_WHO, "--cg-tol", self.cg_tol)
        check_choice(_WHO, "--meta-optimizer", self.meta_optimizer, META_OPTIMIZERS)
        check_choice(_WHO, "--inner-optimizer", self.inner_optimizer, INNER_OPTIMIZERS)
        self._check_settings()
        self._check_combination()

    @property
    def entry(self) -> AlgorithmType:
        """The algorithm's registry entry."""
        return algorithm_type(self.algo)

    def _check_settings(self) -> None:
        """``settings`` names only the algorithm's own fields, each without an option."""
        if not isinstance(self.settings, dict):
            raise ConfigError(f"{_WHO}: settings must be a dict of setting names to values, "
                              f"got {type(self.settings).__name__}")
        names = self.entry.setting_names()
        for name in self.settings:
            held = CONFIG_NAMES.get(name, name)
            if held in _FIELD_NAMES:
                raise ConfigError(f"--setting {name}: it has an option of its own; use "
                                  f"{option(held)}")
            if name not in names:
                raise ConfigError(f"--setting {name}: {self.algo} has no setting {name!r}; its "
                                  f"settings are {list(names)}")

    def _check_combination(self) -> None:
        """Refuse options that contradict each other instead of ignoring one of them."""
        entry, has = self.entry, self.entry.setting_names()

        def those(flag: str) -> str:
            return ", ".join(n for n in algorithm_names() if getattr(algorithm_type(n), flag))

        if self.remat and not entry.remat:
            raise ConfigError(f"--remat applies to the MAML family ({those('remat')}); "
                              f"{self.algo} keeps no second-order graph")
        if self.remat and (self.first_order or ("first_order" in has
                                                and entry.default("first_order"))):
            raise ConfigError("--remat saves memory of the second-order gradient; first-order "
                              "MAML keeps no second-order graph (drop one of the two)")
        if self.cosine_meta_lr and self.linear_meta_lr:
            raise ConfigError("--cosine-meta-lr and --linear-meta-lr are two schedules of the "
                              "same rate; choose one")
        if self.bn_running_stats and not entry.running_stats:
            raise ConfigError(f"--bn-running-stats: per-step running statistics are MAML++'s "
                              f"(--algo {those('running_stats')}); {self.algo} evaluates with "
                              "batch statistics")
        if self.inner_minibatches and "inner_minibatches" not in has:
            raise ConfigError(f"--inner-minibatches applies to reptile, whose inner loop fits a "
                              f"task's support and query examples; {self.algo} adapts on the "
                              "support set")
        if self.inner_optimizer != "sgd" and "inner_optimizer" not in has:
            raise ConfigError(f"--inner-optimizer {self.inner_optimizer} applies to reptile; "
                              f"the inner loop of {self.algo} is SGD (its meta-gradient "
                              "differentiates through it)")
        if self.first_order and not entry.second_order:
            raise ConfigError(f"--first-order applies to the MAML family; {self.algo} has no "
                              "second-order term to drop")
        regression = dataset_type(self.dataset).kind == "regression"
        if regression:
            if "way" in self.tasks.lower():
                raise ConfigError(f"--tasks {self.tasks}: {self.dataset} tasks are regression "
                                  "and have no ways; use '<K>shot', e.g. --tasks 10shot")
            if self.rotate:
                raise ConfigError(f"--rotate adds rotated image classes; {self.dataset} tasks "
                                  "are regression and have none")
            if self.inner_minibatches:
                raise ConfigError(f"--inner-minibatches takes one example of every class per "
                                  f"step; {self.dataset} tasks are regression and have no "
                                  "classes")
        check_data_root(self.dataset, self.data_root)
        if self.image_size is not None:
            check_int(_WHO, "--image-size", self.image_size, minimum=8)
            if regression:
                raise ConfigError(f"--image-size applies to image datasets; {self.dataset} "
                                  "tasks are regression")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MetaTrainConfig:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known - {"device", "imports"})
        if unknown:
            raise ConfigError(f"config.json: unknown keys {unknown} (not a meta-train run?)")
        return cls(**{k: v for k, v in data.items() if k in known})


_CONFIG_FIELDS = frozenset(MetaTrainConfig.__dataclass_fields__)
_FIELD_NAMES = _CONFIG_FIELDS - {"settings", "model"}

RECORDED_BY_THE_RUN = ("threads", "step_strategy", "score_strategy", "chunk_size")
"""Fields a run fills in when it starts (a count of 0, a ``None``: the run resolves them) and
records in its ``config.json``; a resume left to choose takes the recorded ones
(:func:`as_recorded`)."""

MAY_CHANGE_ON_RESUME = ("steps", "threads", "compile", "max_memory", "chunk_size",
                        "score_strategy")
"""Fields a ``--resume`` may change: more steps, another thread count, compiling or not, and
another memory bound (with the chunk and scoring strategy it leaves room for). Each moves
rounding or speed, not what is computed; the run's ``metrics.jsonl`` records the change. Any
other field that differs is refused in one line: it would change the results mid-run."""


def as_recorded(cfg: MetaTrainConfig, recorded: Mapping[str, Any]) -> MetaTrainConfig:
    """``cfg`` with the fields of :data:`RECORDED_BY_THE_RUN` that it leaves to the run taken
    from ``recorded`` (the ``config.json`` of the run a resume continues): its thread count
    and strategies. The chunk and scoring strategy are taken only under the same
    ``max_memory`` (another bound resolves them again)."""
    same_bound = recorded.get("max_memory") == cfg.max_memory
    taken: dict[str, Any] = {}
    for name in RECORDED_BY_THE_RUN:
        mine, theirs = getattr(cfg, name), recorded.get(name)
        if name in ("chunk_size", "score_strategy") and not same_bound:
            if mine is not None and mine == theirs:  # the old bound's: resolved again
                taken[name] = None
        elif not mine and theirs is not None:
            taken[name] = theirs
    return replace(cfg, **taken) if taken else cfg


def algorithm_settings(cfg: MetaTrainConfig) -> Settings:
    """The typed settings of ``cfg.algo`` from ``cfg``: each setting the config holds (under
    its :data:`CONFIG_NAMES` name) is taken from it; the others keep the algorithm's
    defaults. MAML++ under ``--first-order`` is first order for the whole run."""
    entry = cfg.entry
    values: dict[str, Any] = {}
    for name in entry.setting_names():
        held = CONFIG_NAMES.get(name, name)
        if held in _CONFIG_FIELDS:
            values[name] = getattr(cfg, held)
            if name in FLAGS:
                values[name] = values[name] or entry.default(name)
    if "first_order_until" in values and cfg.first_order:
        values["first_order_until"] = cfg.steps
    try:
        return entry.settings(**{**values, **cfg.settings})
    except (TypeError, ValueError) as e:  # a value the settings class refuses
        raise ConfigError(f"--setting: {cfg.algo}'s settings refuse {cfg.settings}: {e}"
                          ) from None


def task_info(cfg: MetaTrainConfig, kind: str, ways: int | None) -> TaskInfo:
    """What ``cfg.algo``'s builder knows of the tasks; refuses a kind it cannot learn."""
    entry = cfg.entry
    if kind not in entry.kinds:
        raise ConfigError(f"--algo {cfg.algo} needs a {' or '.join(entry.kinds)} dataset "
                          f"(glyphs, omniglot); {cfg.dataset} is {kind}")
    return TaskInfo(kind, ways if kind == "classification" else None, cfg.steps)


KIND_DEFAULTS: dict[str, dict[str, Any]] = {
    # Regression (sinusoid, or a user's registered regression dataset) starts from the MAML
    # paper's sinusoid setting: K = 10, inner lr 0.01, meta-batch 25, Adam 1e-3.
    "regression": {"tasks": "10shot", "inner_lr": 0.01, "meta_lr": 1e-3, "meta_batch": 25,
                   "inner_steps_eval": 10, "train_queries": None, "inner_minibatches": False,
                   "rotate": False},
}
"""Run defaults per dataset kind (the registry's ``kind``), over the algorithm's own."""


def default_algo(dataset: str) -> str:
    """The algorithm ``meta-train`` runs when none is named: prototypical networks on image
    classification (the recorded comparison is in docs/results/meta-learning.md), MAML on
    regression, which ProtoNet cannot do."""
    return "maml" if dataset_type(dataset).kind == "regression" else "protonet"


def algorithm_defaults(algo: str) -> dict[str, Any]:
    """The config values ``algo`` starts from: its settings' defaults (under their config
    names; :data:`FLAGS` stay off, the algorithm keeps its own) and its run recipe."""
    entry = algorithm_type(algo)
    defaults = entry.defaults()
    values = {CONFIG_NAMES.get(n, n): getattr(defaults, n) for n in entry.setting_names()
              if n not in FLAGS and CONFIG_NAMES.get(n, n) in _CONFIG_FIELDS}
    return {**values, **entry.recipe.given()}


def default_config(algo: str | None = None, dataset: str = "glyphs", **given: Any
                   ) -> MetaTrainConfig:
    """The config for ``algo`` (default :func:`default_algo` of ``dataset``) on ``dataset``:
    the class defaults, then :func:`algorithm_defaults`, then the dataset kind's defaults, then
    ``given`` (options the user set; ``None`` values are skipped). Inner-loop options given
    to an algorithm without an inner loop are refused, not ignored."""
    algo = default_algo(dataset) if algo is None else algo
    entry = algorithm_type(algo)
    kind_defaults = KIND_DEFAULTS.get(dataset_type(dataset).kind, {})
    values: dict[str, Any] = {**algorithm_defaults(algo), **kind_defaults}
    given = {k: v for k, v in given.items() if v is not None}
    inner = ("inner_steps", "inner_steps_eval", "inner_lr")
    if not entry.inner_loop and (unused := [k for k in inner if k in given]):
        flags = ", ".join(option(k) for k in unused)
        raise ConfigError(f"{flags}: {algo} has no inner loop ({entry.summary}); name an "
                          "algorithm that adapts, e.g. --algo maml")
    values.update(given)
    return MetaTrainConfig(algo=algo, dataset=dataset, **values)


__all__ = ["CONFIG_NAMES", "FLAGS", "KIND_DEFAULTS", "MAY_CHANGE_ON_RESUME", "META_OPTIMIZERS",
           "RECORDED_BY_THE_RUN", "MetaTrainConfig", "algorithm_defaults", "algorithm_settings",
           "as_recorded", "default_algo", "default_config", "task_info"]
