"""Finding a config by name or path and building it: what the CLI and ``--model`` use.

``load_model("conv4")`` finds, in order: a config file (``.json``, ``.toml``, ``.yaml``), a
config shipped in ``funcgraph/configs``, or a registered model type built from its defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..model import Model
from .build import Built, build
from .config import SUFFIXES, at, load_config, load_shipped, shipped_configs, suggest
from .registry import REGISTRY


def resolve_source(path_or_name: str) -> tuple[dict[str, Any], str, bool]:
    """``(config, label, registered)`` for a config file path, a shipped config name, or a
    registered model type (``registered=True``: built as ``{"model": {"type": name}}``)."""
    p = Path(path_or_name)
    if p.suffix.lower() in SUFFIXES or p.exists():
        if not p.is_file():
            raise ConfigError(f"{path_or_name}: no such config file")
        return load_config(p), str(p), False
    if path_or_name in shipped_configs():
        return load_shipped(path_or_name), path_or_name, False
    if path_or_name in REGISTRY:
        config = {"name": path_or_name, "model": {"type": path_or_name, "params": {}}}
        return config, path_or_name, True
    known = [*shipped_configs(), *REGISTRY.names()]
    raise ConfigError(f"{path_or_name}: not a config file, shipped config or registered model"
                      f"{suggest(path_or_name, known)}")


def check_model(path_or_name: str, overrides: Mapping[str, str] | None = None, *,
                input_shape: Sequence[int] | None = None) -> Built:
    """Load and build ``path_or_name`` (see :func:`resolve_source`); errors name the source.

    For a registered model named directly, overrides set its constructor params
    (``depth=3`` -> ``model.params.depth``).
    """
    config, label, registered = resolve_source(path_or_name)
    if registered:
        overrides = {at("model.params", k): v for k, v in (overrides or {}).items()}
    try:
        return build(config, overrides, input_shape=input_shape)
    except ConfigError as e:
        raise ConfigError(f"{label}: {e}") from None


def load_model(path_or_name: str, overrides: Mapping[str, str] | None = None) -> Model:
    """The Model described by a config file, a shipped config name or a registered model.

    Example: ``load_model("mlp", parse_overrides(["hidden=128"]))``.
    """
    return check_model(path_or_name, overrides).model


__all__ = ["check_model", "load_model", "resolve_source"]
