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
:func:`check_space` refuses an unknown name, a range the option cannot take (each end is
built into a config through the same checks ``meta-train`` runs) or a knob the algorithm
does not have, in one line that says the fix.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, FuncgraphError
from .meta_train_config import MetaTrainConfig, default_config

FRACTIONS = {"first_order_fraction": "first_order_until",
             "msl_anneal_fraction": "msl_anneal_steps"}
"""Knobs given as a fraction of the run's steps, and the config field each sets."""

MODEL_PREFIX = "model."
STUDY_KEYS = ("algo", "dataset", "tasks", "data_root", "image_size")
NOT_SEARCHED = ("algo", "dataset", "tasks", "data_root", "seed", "model", "strategy")
"""Config fields a space may not draw: the study's identity, the seed (confirmation runs
seeds) and the model spec (drawn per hyperparameter as ``model.NAME``)."""

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
            "set model hyperparameters as model.NAME")
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
    """Build the study's run, then the config at each end of every knob (the others left at
    their defaults), then all knobs at their lower ends, through ``meta-train``'s own checks:
    an impossible range or a knob the algorithm does not have is refused before a trial
    runs, naming the knob."""
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


def _settings_of(algo: str) -> set[str]:
    """The config fields that are settings of algorithm ``algo``."""
    from ..meta.registry import algorithm_type
    from .meta_train_config import CONFIG_NAMES

    return {CONFIG_NAMES.get(n, n) for n in algorithm_type(algo).setting_names()} & set(_FIELDS)


def _check_algorithm_has(space: SearchSpace) -> None:
    """Refuse a knob or fixed value that only other algorithms read (``imaml_lambda`` on
    MAML): its trials would run with the setting dead."""
    from ..meta.registry import algorithm_names

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


def check_model_knobs(space: SearchSpace) -> None:
    """Resolve the study's model at each end of every ``model.NAME`` knob (the others at
    their lower ends), so an unknown hyperparameter or a value the model refuses stops the
    study before its first trial, naming the knob. It needs the data set's shapes, so it
    runs when a study starts rather than when the space is parsed; nothing to do without
    model knobs or fixed model values."""
    knobs = [k for k in space.knobs if k.name.startswith(MODEL_PREFIX)]
    if not knobs and not any(name.startswith(MODEL_PREFIX) for name in space.fixed):
        return
    from .meta_plan import model_config
    from .resolve import resolve_model
    from .task_sources import sources_for

    cfg = space.config({})
    sources = sources_for(cfg)
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


__all__ = ["FRACTIONS", "OPTION_NAMES", "Knob", "SearchSpace", "check_model_knobs",
           "check_space", "load_space", "parse_space"]
