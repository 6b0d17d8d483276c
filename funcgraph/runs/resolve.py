"""The one model resolver: whatever a command was told to run becomes a Model here.

Every command that builds a model (``meta-train``, ``train``, ``graph``, ``export``,
``evaluate``) calls :func:`resolve_model`, and a run directory records its model in one of the
forms it takes, so the model can be rebuilt from ``config.json`` alone. All forms go through
one name -> Model table, the factory's registry (:data:`funcgraph.factory.REGISTRY`), so a
hyperparameter is checked the same way whichever command it came from, and a mistake is a
:class:`~funcgraph.errors.ConfigError` that names it.

The recorded forms (a run's ``config["model"]``):

* ``{"name": TYPE, **hyperparams}``: a registered type (``conv4``, ``resnet``, ...) with its
  constructor arguments;
* ``{"factory": SOURCE, "overrides": {PATH: TEXT}}``: a factory config file, a shipped config
  name or a registered type, with ``--set`` overrides as text;
* ``{"genotype": PATH, **network options}``: the discrete DARTS network of a genotype file;
* an inline factory config (a mapping with ``"layers"`` or ``"model"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from ..factory import build, load_model
from ..factory.config import parse_value
from ..model import Model

ModelSpec = dict[str, Any]
"""A run's ``config["model"]``: one of the forms in the module docstring."""


def resolve_model(spec: str | Mapping[str, Any],
                  overrides: Mapping[str, str] | None = None) -> Model:
    """The Model that ``spec`` names; see the module docstring for the forms.

    Arguments:
        spec: a config file path, shipped config name or registered type (text), or a run's
            recorded model (a mapping).
        overrides: ``--set`` pairs as text (:func:`funcgraph.factory.parse_overrides`); for a
            registered type they set its hyperparameters (``hidden=32``).
    Raises:
        ConfigError: naming the source and the offending value.
    """
    overrides = dict(overrides or {})
    if isinstance(spec, str):
        return load_model(spec, overrides)
    if not isinstance(spec, Mapping):
        raise ConfigError(f"model: expected a config name, path or mapping, got {spec!r}")
    if "factory" in spec:
        stored = spec.get("overrides", {})
        if not isinstance(stored, Mapping):
            raise ConfigError(f"model.overrides: expected a mapping, got {stored!r}")
        return load_model(str(spec["factory"]), {**stored, **overrides})
    if "genotype" in spec:
        return _genotype_network(with_overrides(spec, overrides))
    if "layers" in spec or "model" in spec:  # an inline config; its name is a label
        return build(spec, overrides).model
    if "name" in spec:
        return _registered(with_overrides(spec, overrides))
    raise ConfigError(f"model: expected one of the keys name, factory, genotype, layers or "
                      f"model, got {sorted(spec)}")


def with_overrides(spec: Mapping[str, Any], overrides: Mapping[str, str]) -> ModelSpec:
    """``spec`` with ``--set`` values (JSON literals, else text) replacing its entries."""
    for name in overrides:
        if name in ("name", "genotype"):
            raise ConfigError(f"--set {name}: the model's {name} cannot be overridden")
    return {**spec, **{k: parse_value(v) for k, v in overrides.items()}}


def _registered(spec: Mapping[str, Any]) -> Model:
    """``{"name": TYPE, **hyperparams}`` through the factory, which checks every value."""
    hparams = {k: v for k, v in spec.items() if k != "name"}
    name = spec["name"]
    if not isinstance(name, str):
        raise ConfigError(f"model.name: expected a registered type name, got {name!r}")
    config = {"name": name, "model": {"type": name, "params": hparams}}
    try:
        return build(config).model
    except ConfigError as e:
        raise ConfigError(f"model {name}: {e}") from None


def _genotype_network(spec: Mapping[str, Any]) -> Model:
    """``{"genotype": PATH, **options}``: the factory's ``darts_network`` of that genotype."""
    from ..nas import Genotype

    genotype = Genotype.load(str(spec["genotype"]))
    options = {k: v for k, v in spec.items() if k != "genotype"}
    return _registered({"name": "darts_network", "genotype": genotype.to_dict(), **options})


__all__ = ["ModelSpec", "resolve_model", "with_overrides"]
