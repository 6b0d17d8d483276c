"""What ``funcgraph search`` will run, checked before its run directory is written.

The data (:func:`class_halves`: a classification dataset's classes, glyph characters by
default, each class's images halved into a weight half and an architecture half), the network
around the cells (:func:`network_fields`, from ``--model``, a factory config whose model is a
``darts_search`` supernet, docs/darts.md, with ``-C`` and ``--layers``) and the plan
(:func:`plan_search`: the supernet, the epoch batches, the step budget and the run's config,
a search too big for the device refused from shapes). :func:`funcgraph.runs.search.run_search`
runs the plan; ``funcgraph search --dry-run`` shows it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError
from ..factory import resolve_source
from ..factory.config import Variables, at, check_depth, describe, error, suggest
from ..model import Model
from ..nas import BatchFn, SearchConfig, SearchData, build_search_model, epoch_batches
from ..nas.cell import STEPS, output_nodes
from ..nas.search import NETWORK_FIELDS, check_network_value
from .memory import check_search_sizes


def class_halves(
    dataset: str = "glyphs",
    *,
    split: str = "train",
    num_classes: int = 20,
    image_size: int = 16,
    data_root: str | Path | None = None,
) -> SearchData:
    """Image classification from a registered classification dataset (``glyphs``,
    ``rgb-shapes``, a folder, one of your own): ``num_classes`` classes spread evenly over the
    run's ``split`` (``"train"``, ``"val"`` or ``"test"``; glyphs' train split is its
    background alphabets, its test split the evaluation ones), each class's images halved into
    train (first half) and validation (second half)."""
    from ..data.datasets import as_float
    from ..data.registry import dataset_type

    check_image_size("class_halves: image_size (--image-size)", image_size, image_size)
    ds = dataset_type(dataset).load_split(split, image_size=image_size, root=data_root)
    if not 2 <= num_classes <= ds.num_classes:
        raise ConfigError(f"class_halves: num_classes (--classes) must be in "
                          f"[2, {ds.num_classes}] for {dataset}'s {split} split, got "
                          f"{num_classes}")
    picked = as_float(ds.images[(torch.arange(num_classes) * ds.num_classes) // num_classes])
    half = ds.per_class // 2  # picked: (classes, images, channels, H, W), distinct ones first
    labels = torch.arange(num_classes)

    def flat(images: Tensor) -> tuple[Tensor, Tensor]:
        n = images.shape[1]
        return images.flatten(0, 1), labels.repeat_interleave(n)

    (tx, ty), (vx, vy) = flat(picked[:, :half]), flat(picked[:, half:2 * half])
    return SearchData(tx, ty, vx, vy, num_classes,
                      f"{dataset}/{split}:{num_classes}x{image_size}px")


def check_image_size(what: str, height: int, width: int) -> None:
    """The supernet's two reduction cells each halve the image, so both sides must be
    multiples of 4 (else the cells' branches disagree on shape deep inside a step)."""
    if height % 4 or width % 4:
        shown = height if height == width else f"{height}x{width}"
        raise ConfigError(f"{what} must be a multiple of 4 (two reduction cells), got {shown}")


SEARCH_TYPE = "darts_search"
CONFIG_KEYS = ("name", "description", "vars", "model")
"""The top-level keys of a ``search --model`` config: the input comes from the data and the
supernet initialises itself, so ``input_shape``, ``input_dtype`` and ``init`` have no place."""
ROOT_KEYS = ("type", "name", "params")
OWNED_PARAMS = {"primitives": "--space", "partial_channels": "--partial-channels",
                "edge_normalization": "--edge-normalization", "aux_skip": "--aux-skip",
                "num_classes": "the data (--classes)",
                "in_channels": "the data (its images' channels)"}
"""The ``darts_search`` arguments the search sets itself, with what sets each."""
MODEL_PARAMS = {arg: name for name, arg in NETWORK_FIELDS.items()}
"""The ``darts_search`` arguments a ``search --model`` config may give, with the
:class:`~funcgraph.nas.SearchConfig` field each sets (``steps`` is ``nodes``)."""


def model_network(source: str) -> dict[str, Any]:
    """The :class:`~funcgraph.nas.SearchConfig` fields of the network around the cells that
    the ``search --model`` config ``source`` gives: a config file, shipped config name or
    registered type (:func:`funcgraph.factory.resolve_source`, as ``train --model`` names
    one), whose model is a ``darts_search`` layer with some of the params in
    :data:`MODEL_PARAMS` (``vars`` and ``$`` references as in any factory config).

    Every mistake is a ConfigError naming ``source`` and the config path: another root type,
    a param the search sets itself (:data:`OWNED_PARAMS`, naming the option that sets it), an
    unknown key, a bad value.

    The bare name ``darts_search`` is the registered supernet with no params (the default
    network), not the shipped ``darts_search`` config of that name: that one is written for
    ``train`` and ``graph`` (input shape, class count), which the search takes from its data."""
    if source == SEARCH_TYPE and not Path(source).exists():
        config, label = {"model": SEARCH_TYPE}, source
    else:
        config, label, _ = resolve_source(source)
    try:
        return _model_network(config)
    except ConfigError as e:
        raise ConfigError(f"{label}: {e}") from None


def _model_network(config: dict[str, Any]) -> dict[str, Any]:
    """:func:`model_network` of a parsed config, its errors without the source."""
    check_depth(config)
    root = config.get("model")
    root = {"type": root} if isinstance(root, str) else root
    if not isinstance(root, dict) or root.get("type") != SEARCH_TYPE:
        if root is None:
            found = "a layers list" if "layers" in config else "no model"
        else:
            found = f"type {describe(root.get('type'))}" if isinstance(root, dict) else (
                describe(root))
        raise error("model", f"found {found}; search --model takes a {SEARCH_TYPE} supernet "
                             f'(model = {{type = "{SEARCH_TYPE}", params = {{...}}}})')
    for where, mapping, allowed in (("", config, CONFIG_KEYS), ("model", root, ROOT_KEYS)):
        for key in mapping:
            if key not in allowed:
                raise error(at(where, str(key)),
                            f"not used by search --model{suggest(str(key), allowed)}; "
                            f"allowed: {', '.join(allowed)}")
    raw_vars, raw_params = config.get("vars", {}), root.get("params", {})
    for where, value in (("vars", raw_vars), ("model.params", raw_params)):
        if not isinstance(value, dict):
            raise error(where, f"expected a mapping of names to values, got {describe(value)}")
    variables = Variables(raw_vars)
    variables.all()
    params = variables.resolve(raw_params, "model.params")
    owned = [k for k in params if k in OWNED_PARAMS]
    if owned:
        raise error("model.params", "; ".join(f"{k} is set by {OWNED_PARAMS[k]}" for k in owned)
                    + ", not by search --model: remove " + ("it" if len(owned) == 1 else "them"))
    for key in params:
        if key not in MODEL_PARAMS:
            raise error(at("model.params", str(key)),
                        f"unknown key for search --model{suggest(str(key), MODEL_PARAMS)}; "
                        f"allowed: {', '.join(MODEL_PARAMS)}")
    fields = {MODEL_PARAMS[k]: check_network_value("model.params", k, v)
              for k, v in params.items()}
    output_nodes(params.get("steps", STEPS), params.get("multiplier"), where="model.params")
    return fields


def network_fields(model: str | None, *, channels: int | None = None,
                   layers: int | None = None) -> dict[str, Any]:
    """The :class:`~funcgraph.nas.SearchConfig` fields of the network around the cells for
    ``funcgraph search``: those of the ``--model`` config (:func:`model_network`) with
    ``-C`` (``channels``) and ``--layers``. A value given by both is a ConfigError, so
    neither silently wins; a field neither gives keeps SearchConfig's default (without
    ``--model`` and the options: the default search, exactly)."""
    fields = {} if model is None else model_network(model)
    for option, name, value in (("-C/--channels", "C", channels), ("--layers", "layers", layers)):
        if value is None:
            continue
        if name in fields:
            raise ConfigError(f"{option} {value} and --model {model} (model.params."
                              f"{NETWORK_FIELDS[name]} = {fields[name]}) both set {name}; give it "
                              "in one place")
        fields[name] = value
    return fields


@dataclass(frozen=True)
class SearchPlan:
    """A validated search, before anything is written: what ``--dry-run`` shows."""

    model: Model
    per_epoch: int
    batch: BatchFn
    total: int
    config: dict[str, Any]


def plan_search(data: SearchData, cfg: SearchConfig,
                extra_config: Mapping[str, Any] | None = None, *,
                device: str | torch.device = "cpu") -> SearchPlan:
    """The supernet, the epoch batches, the step budget and the run's config for ``cfg``;
    a search too big for the free memory of ``device`` is refused from shapes
    (:func:`~funcgraph.runs.memory.check_search_sizes`)."""
    check_image_size("search: the images", *data.train_x.shape[-2:])
    model = build_search_model(cfg, data)
    check_search_sizes(model, channels=cfg.C, layers=cfg.layers, batch_size=cfg.batch_size,
                       image_shape=tuple(data.train_x.shape[1:]), device=torch.device(device))
    per_epoch, batch = epoch_batches(data, cfg.batch_size, cfg.seed)
    total = cfg.steps if cfg.steps is not None else cfg.epochs * per_epoch
    if total < 1:
        raise ConfigError(f"search: need at least one step, got steps={total}")
    epochs = math.ceil(total / per_epoch)
    if cfg.warmup_epochs >= epochs:
        raise ConfigError(f"search: warmup_epochs ({cfg.warmup_epochs}) must be below the "
                          f"number of epochs ({epochs}: {total} steps, {per_epoch} per epoch), "
                          "or the architecture never moves")
    config = {"command": "search", "data": data.name, **cfg.to_dict(), **(extra_config or {}),
              "steps": total}
    return SearchPlan(model, per_epoch, batch, total, config)


__all__ = [
    "MODEL_PARAMS",
    "OWNED_PARAMS",
    "SearchPlan",
    "class_halves",
    "model_network",
    "network_fields",
    "plan_search",
]
