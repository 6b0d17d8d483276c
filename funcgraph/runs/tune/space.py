"""What ``funcgraph tune`` searches over: a study's space, read from TOML and checked before
anything runs.

A space file names the run every trial starts from and the knobs the sampler draws::

    [study]
    algo = "mamlpp"            # any registered algorithm
    dataset = "glyphs"
    tasks = "5way1shot"

    [fixed]                    # meta-train options every trial shares
    steps = 300
    validate_every = 50
    "model.hidden" = 32        # a model hyperparameter, as --set hidden=32

    [space]
    inner_lr = { low = 0.05, high = 1.0, log = true }
    inner_steps = { low = 1, high = 3 }            # ints where the option is an int
    meta_batch = { choices = [8, 16, 32] }
    rotate = { choices = [false, true] }
    first_order_fraction = { low = 0.0, high = 0.5 }

Names are ``meta-train``'s config fields (``inner_lr`` or ``inner-lr``), ``model.NAME`` for a
model hyperparameter, and two fractions of the run's steps that the integer options cannot
say when ``steps`` is itself searched: ``first_order_fraction`` (MAML++'s first-order
warm-up, ``first_order_until``) and ``msl_anneal_fraction`` (``msl_anneal_steps``).
:func:`check_space` refuses a bad ``[study]`` value (the task spec parsed as the data set
reads it), a flag given anything but true or false, an unknown name, a range the option
cannot take (each end is built into a config through the same checks ``meta-train`` runs) or
a knob the algorithm does not have, in one line that says the fix; :func:`check_run`, when a
study starts, what needs the data (the spec fits every split, the model builds).
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import ConfigError, FuncgraphError
from ..meta_training.config import RECORDED_BY_THE_RUN, MetaTrainConfig, default_config

FRACTIONS = {"first_order_fraction": "first_order_until",
             "msl_anneal_fraction": "msl_anneal_steps"}
"""Knobs given as a fraction of the run's steps, and the config field each sets."""

MODEL_PREFIX = "model."
STUDY_KEYS = ("algo", "dataset", "tasks", "data_root", "image_size")
NOT_SEARCHED = ("algo", "dataset", "tasks", "data_root", "seed", "model", "strategy",
                *RECORDED_BY_THE_RUN)
"""Config fields a space may not draw: the study's identity, the seed (confirmation runs
seeds), the model spec (drawn per hyperparameter as ``model.NAME``) and what each trial's run
resolves and records itself (its thread count: ``tune run --threads``; its strategies)."""

Value = bool | int | float | str


@dataclass(frozen=True)
class Knob:
    """One searched setting: a numeric range (``low``..``high``, ``log`` scale, ints where
    the option is an int) or a list of ``choices``."""

    name: str
    kind: str  # "int", "float" or "choice"
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Value, ...] = ()

    def extremes(self) -> tuple[Value, ...]:
        """The values whose configs :func:`check_space` builds: both ends or every choice."""
        if self.kind == "choice":
            return self.choices
        assert self.low is not None and self.high is not None
        cast = int if self.kind == "int" else float
        return cast(self.low), cast(self.high)


@dataclass(frozen=True)
class SearchSpace:
    """A study's space: the run it starts from (``study``, ``fixed``) and its knobs."""

    study: dict[str, Any]
    fixed: dict[str, Value]
    knobs: tuple[Knob, ...]
    text: str = field(default="", compare=False)

    def config(self, drawn: Mapping[str, Value], seed: int = 0) -> MetaTrainConfig:
        """The config of one trial: the study's run, the fixed options, then the drawn ones
        (model hyperparameters go to ``config["model"]`` when the run resolves its model;
        see :func:`model_overrides`)."""
        values = {**self.fixed, **drawn}
        options = {k: v for k, v in values.items() if not k.startswith(MODEL_PREFIX)
                   and k not in FRACTIONS}
        cfg = default_config(self.study["algo"], self.study["dataset"],
                             **{k: v for k, v in self.study.items()
                                if k not in ("algo", "dataset")},
                             **options, seed=seed)
        fractions = {FRACTIONS[k]: max(1, round(float(v) * cfg.steps)) if
                     k == "msl_anneal_fraction" else round(float(v) * cfg.steps)
                     for k, v in values.items() if k in FRACTIONS}
        if not fractions:
            return cfg
        return default_config(cfg.algo, cfg.dataset, **{**_given(cfg), **fractions})

    def lowest(self) -> dict[str, Value]:
        """Every knob at its lower end (its first choice)."""
        return {k.name: k.extremes()[0] for k in self.knobs}

    def model_overrides(self, drawn: Mapping[str, Value]) -> dict[str, str]:
        """``--set`` overrides of the model, as text (``{"hidden": "32"}``)."""
        values = {**self.fixed, **drawn}
        return {k[len(MODEL_PREFIX):]: _text(v) for k, v in values.items()
                if k.startswith(MODEL_PREFIX)}


def _given(cfg: MetaTrainConfig) -> dict[str, Any]:
    data = cfg.to_json()
    return {k: v for k, v in data.items() if k not in ("algo", "dataset", "model")}


def _text(value: Value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


_FIELDS = MetaTrainConfig.__dataclass_fields__


def _field_kind(name: str) -> str:
    """``"bool"``, ``"int"``, ``"float"`` or ``"str"``: the type of config field ``name``."""
    annotation = str(_FIELDS[name].type)
    for kind in ("bool", "int", "float", "str"):
        if annotation.startswith(kind):
            return kind
    return "other"


OPTION_NAMES = {"test_episodes": "--episodes"}
"""Config fields whose ``meta-train`` option is not the field's name (a space may use
either)."""


def _normal(name: str) -> str:
    """A config field's name from a space's key: ``inner-lr``, ``inner_lr`` or an option's
    own name (``episodes`` for ``test_episodes``)."""
    name = name.strip().replace("-", "_")
    aliases = {option[2:].replace("-", "_"): field for field, option in OPTION_NAMES.items()}
    return aliases.get(name, name)


def _check_name(name: str, where: str) -> None:
    if name.startswith(MODEL_PREFIX):
        if len(name) > len(MODEL_PREFIX):
            return
        raise ConfigError(f"{where}: 'model.' needs a hyperparameter name, e.g. model.hidden")
    if name in FRACTIONS or (name in _FIELDS and name not in NOT_SEARCHED):
        return
    known = [n for n in _FIELDS if n not in NOT_SEARCHED] + list(FRACTIONS)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]}?" if close else "see funcgraph meta-train --help"
    if name in NOT_SEARCHED:
        hint = "it names the study's run: set it under [study]" if name in STUDY_KEYS else (
            "the seed belongs to confirmation runs" if name == "seed" else
            "give the trials' threads with tune run --threads" if name == "threads" else
            "each trial's run resolves and records it" if name in RECORDED_BY_THE_RUN else
            "set model hyperparameters as model.NAME")
        raise ConfigError(f"{where}: {name!r} is not set in a space's [fixed] or [space] "
                          f"({hint})")
    raise ConfigError(f"{where}: {name!r} is not a meta-train setting ({hint})")


def _knob(name: str, spec: Any, where: str) -> Knob:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a table such as {{ low = 0.1, high = 1.0 }} or "
                          f"{{ choices = [8, 16] }}, got {spec!r}")
    unknown = sorted(set(spec) - {"low", "high", "log", "choices"})
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; a knob takes low, high, log or "
                          "choices")
    if "choices" in spec:
        choices = spec["choices"]
        if set(spec) != {"choices"} or not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}: choices is a non-empty list and stands alone, got "
                              f"{dict(spec)!r}")
        if not all(isinstance(c, bool | int | float | str) for c in choices):
            raise ConfigError(f"{where}: choices must be numbers, strings or booleans")
        return Knob(name, "choice", choices=tuple(choices))
    low, high, log = spec.get("low"), spec.get("high"), spec.get("log", False)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
               for v in (low, high)):
        raise ConfigError(f"{where}: low and high must both be finite numbers, got "
                          f"low={low!r}, high={high!r}")
    assert low is not None and high is not None
    if not isinstance(log, bool):
        raise ConfigError(f"{where}: log is true or false, got {log!r}")
    if not low < high:
        raise ConfigError(f"{where}: low must be below high, got low={low}, high={high} (a "
                          "single value belongs under [fixed])")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log scale needs low > 0, got {low}")
    kind = "float" if name in FRACTIONS or name.startswith(MODEL_PREFIX) and (
        isinstance(low, float) or isinstance(high, float)) else "int"
    if name in _FIELDS:
        field_kind = _field_kind(name)
        if field_kind in ("bool", "str"):
            raise ConfigError(f"{where}: {name} is a {field_kind} option; give its choices, "
                              f"e.g. {{ choices = [...] }}")
        kind = field_kind
        if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
            raise ConfigError(f"{where}: {name} is an int option; give whole numbers, got "
                              f"low={low}, high={high}")
    if name in FRACTIONS and not (0 <= low and high <= 1):
        raise ConfigError(f"{where}: a fraction of the run's steps lies in [0, 1], got "
                          f"low={low}, high={high}")
    return Knob(name, kind, low=low, high=high, log=log)


def parse_space(data: Mapping[str, Any], text: str = "") -> SearchSpace:
    """A :class:`SearchSpace` from a parsed TOML document, checked (:func:`check_space`)."""
    unknown = sorted(set(data) - {"study", "fixed", "space"})
    if unknown:
        raise ConfigError(f"space: unknown tables {unknown}; a space file has [study], "
                          "[fixed] and [space]")
    study = dict(data.get("study", {}))
    if bad := sorted(set(study) - set(STUDY_KEYS)):
        raise ConfigError(f"[study]: unknown keys {bad}; it takes {', '.join(STUDY_KEYS)}")
    study.setdefault("algo", "maml")
    study.setdefault("dataset", "glyphs")
    fixed: dict[str, Value] = {}
    for raw, value in dict(data.get("fixed", {})).items():
        name = _normal(raw)
        _check_name(name, f"[fixed] {raw}")
        fixed[name] = value
    knobs = []
    for raw, spec in dict(data.get("space", {})).items():
        name = _normal(raw)
        _check_name(name, f"[space] {raw}")
        if name in fixed:
            raise ConfigError(f"[space] {raw}: also under [fixed]; keep it in one of the two")
        knobs.append(_knob(name, spec, f"[space] {raw}"))
    if not knobs:
        raise ConfigError("[space]: no knobs to search; add one, e.g. "
                          "inner_lr = { low = 0.05, high = 1.0, log = true }")
    space = SearchSpace(study, fixed, tuple(knobs), text)
    check_space(space)
    return space


def check_space(space: SearchSpace) -> None:
    """Check the ``[study]`` values (the task spec through the data set's own parser), every
    ``[fixed]`` value and choice against its option's type, then build the study's run, the
    config at each end of every knob (the others left at their defaults) and all knobs at
    their lower ends, through ``meta-train``'s own checks: a bad value, an impossible range
    or a knob the algorithm does not have is refused before a trial runs, naming it."""
    _check_study(space.study)
    for name, value in space.fixed.items():
        _check_type(name, value, f"[fixed] {name}")
    for knob in space.knobs:
        for value in knob.choices:
            _check_type(knob.name, value, f"[space] {knob.name}")
    try:
        space.config({})
    except FuncgraphError as e:
        raise ConfigError(f"space: the study's run is refused: {e}") from None
    for knob in space.knobs:
        for value in knob.extremes():
            try:
                space.config({knob.name: value})
            except FuncgraphError as e:
                raise ConfigError(f"[space] {knob.name} = {value!r} is refused: {e}") from None
    try:
        space.config(space.lowest())
    except FuncgraphError as e:
        raise ConfigError(f"[space]: the knobs' lower ends together are refused: {e}") from None
    _check_algorithm_has(space)


def _check_study(study: Mapping[str, Any]) -> None:
    """The ``[study]`` values, each by the library's own check: the algorithm and data set
    registered, the task spec parsed as the data set's kind reads it (``5way1shot``;
    regression: ``10shot``), the data root and image size as ``meta-train`` takes them."""
    from ...checks import check_int
    from ...data.registry import check_data_root, dataset_type
    from ...data.tasks import TaskSpec, regression_spec
    from ...meta.registry import algorithm_type

    for key in ("algo", "dataset", "tasks", "data_root"):
        if key in study and not isinstance(study[key], str):
            raise ConfigError(f"[study] {key} = {study[key]!r}: expected a string, e.g. "
                              f"{key} = {_STUDY_EXAMPLES[key]!r}")
    kind = ""

    def tasks(spec: str) -> None:
        if kind == "regression":
            regression_spec(spec, study["dataset"])
        else:
            TaskSpec.parse(spec)

    checks: list[tuple[str, Callable[[Any], object]]] = [
        ("algo", algorithm_type),
        ("dataset", lambda name: dataset_type(name).kind),
        ("data_root", lambda root: check_data_root(study["dataset"], root)),
        ("image_size", lambda size: check_int("image_size", "the size", size, minimum=8)),
        ("tasks", tasks)]
    for key, check in checks:
        if key not in study:
            continue
        try:
            found = check(study[key])
        except FuncgraphError as e:
            raise ConfigError(f"[study] {key} = {study[key]!r} is refused: {e}") from None
        kind = str(found) if key == "dataset" else kind


_STUDY_EXAMPLES = {"algo": "maml", "dataset": "glyphs", "tasks": "5way1shot",
                   "data_root": "data/omniglot"}


def _check_type(name: str, value: Value, where: str) -> None:
    """A ``[fixed]`` value or a choice of the type its option takes, where ``meta-train``'s
    config would not refuse another (a flag given ``1`` or ``"yes"`` would read as on); the
    ranges are the config's own checks (:func:`check_space`)."""
    from ...checks import check_bool

    if name in _FIELDS and _field_kind(name) == "bool":
        check_bool(where, "a flag", value)


def _settings_of(algo: str) -> set[str]:
    """The config fields that are settings of algorithm ``algo``."""
    from ...meta.registry import algorithm_type
    from ..meta_training.config import CONFIG_NAMES

    return {CONFIG_NAMES.get(n, n) for n in algorithm_type(algo).setting_names()} & set(_FIELDS)


def _check_algorithm_has(space: SearchSpace) -> None:
    """Refuse a knob or fixed value that only other algorithms read (``imaml_lambda`` on
    MAML): its trials would run with the setting dead."""
    from ...meta.registry import algorithm_names

    algo = space.study["algo"]
    mine = _settings_of(algo)
    names = [("[fixed]", n) for n in space.fixed] + [("[space]", k.name) for k in space.knobs]
    for table, name in names:
        held = FRACTIONS.get(name, name)
        owners = [a for a in algorithm_names() if a != algo and held in _settings_of(a)]
        if owners and held not in mine:
            whose = ", ".join(owners[:3]) + (", ..." if len(owners) > 3 else "")
            raise ConfigError(f"{table} {name}: {algo} has no {held} setting (it is "
                              f"{whose}'s), so the trials would not use it; remove it, or "
                              "tune an algorithm that has it")


SOURCE_FIELDS = ("dataset", "tasks", "train_queries", "rotate", "data_root", "image_size")
"""Config fields the task sources are built from
(:func:`~funcgraph.runs.task_sources.sources_for`)."""


def check_run(space: SearchSpace) -> None:
    """What needs the data, checked when a study starts, before its first trial: the task
    spec fits every split of the data set (enough classes, enough examples per class) for
    the study's run and at each end of every knob that changes the tasks (``train_queries``,
    ``rotate``), and the model at each end of every ``model.NAME`` knob
    (:func:`check_model_knobs`)."""
    from ..task_sources import TaskSources, sources_for

    built: dict[tuple[Any, ...], TaskSources] = {}
    cases = [("space: the study's run", space.config({}))]
    cases += [(f"[space] {k.name} = {v!r}", space.config({k.name: v}))
              for k in space.knobs if k.name in SOURCE_FIELDS for v in k.extremes()]
    for where, cfg in cases:
        key = tuple(getattr(cfg, name) for name in SOURCE_FIELDS)
        if key not in built:
            try:
                built[key] = sources_for(cfg)
            except FuncgraphError as e:
                raise ConfigError(f"{where} is refused: {e}") from None
    first = cases[0][1]
    check_model_knobs(space, built[tuple(getattr(first, n) for n in SOURCE_FIELDS)])


def check_model_knobs(space: SearchSpace, sources: Any = None) -> None:
    """Resolve the study's model at each end of every ``model.NAME`` knob (the others at
    their lower ends), so an unknown hyperparameter or a value the model refuses stops the
    study before its first trial, naming the knob. It needs the data set's shapes
    (``sources``: the study's run's task sources, built here if not given), so it runs when
    a study starts rather than when the space is parsed; nothing to do without model knobs
    or fixed model values."""
    knobs = [k for k in space.knobs if k.name.startswith(MODEL_PREFIX)]
    if not knobs and not any(name.startswith(MODEL_PREFIX) for name in space.fixed):
        return
    from ..meta_training.plan import model_config
    from ..resolve import resolve_model
    from ..task_sources import sources_for

    cfg = space.config({})
    sources = sources_for(cfg) if sources is None else sources
    fixed = {k: v for k, v in space.fixed.items() if k.startswith(MODEL_PREFIX)}
    low = {k.name: k.extremes()[0] for k in knobs}
    # Each fixed value alone first, so a bad one is named, not the knob checked beside it.
    cases = [(f"[fixed] {name} = {value!r}", {name[len(MODEL_PREFIX):]: _text(value)})
             for name, value in fixed.items()]
    cases += [("[fixed] the model values together", space.model_overrides({}))] if (
        len(fixed) > 1) else []
    cases += [(f"[space] {k.name} = {v!r}", space.model_overrides({k.name: v}))
              for k in knobs for v in k.extremes()]
    cases += [("[space] the model knobs' lower ends together", space.model_overrides(low))
              ] if len(knobs) > 1 else []
    for where, overrides in cases:
        try:
            resolve_model(model_config(cfg.algo, sources, overrides=overrides))
        except FuncgraphError as e:
            raise ConfigError(f"{where} is refused: {e}") from None


def load_space(path: str | Path) -> SearchSpace:
    """Read and check a space file (see the module docstring)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the space file ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (a space file is TOML)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    return parse_space(data, text)


__all__ = ["FRACTIONS", "OPTION_NAMES", "SOURCE_FIELDS", "Knob", "SearchSpace",
           "check_model_knobs", "check_run", "check_space", "load_space", "parse_space"]
