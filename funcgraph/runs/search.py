"""What ``funcgraph search`` runs: a DARTS search over a run directory, epoch by epoch.

:func:`run_search` drives :func:`funcgraph.train.run_loop` with the bilevel step
(:func:`funcgraph.nas.make_search_step`) and, at the end of every epoch, records
``softmax(alpha)`` (``alpha_history.jsonl``), derives the genotype, reports its skip
connections and applies the collapse guard: when the normal cell derived without any cap
holds ``stop_skips`` or more skip connections, the search stops early (the DARTS+ criterion,
Liang et al., 2019). With ``stop_stable`` it also stops when the derived genotype has been
the same for that many consecutive epoch ends (DARTS+' stability criterion). At the end it
writes ``genotype.json`` (DARTS' derivation, or DARTS-PT's selection by perturbation with
``select="perturbation"``), ``alphas.png`` (a heat map of the final weights) and
``search.json`` (a summary). :func:`glyph_halves` is the default data.

:func:`network_fields` reads the network around the cells from ``funcgraph search --model``,
a factory config whose model is a ``darts_search`` supernet (docs/darts.md).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .. import distributed, random
from ..errors import ConfigError
from ..factory import resolve_source
from ..factory.config import Variables, at, check_depth, describe, error, suggest
from ..files import atomic_write
from ..model import Model
from ..nas import (
    BatchFn,
    Genotype,
    SearchConfig,
    SearchData,
    arch_weights,
    build_search_model,
    derive_genotype,
    epoch_batches,
    is_arch,
    make_search_step,
    remedy_params,
    supernet_accuracy,
)
from ..nas.cell import STEPS, output_nodes
from ..nas.search import NETWORK_FIELDS, check_network_value
from ..params import Params, partition
from ..params import to as params_to
from ..train import Groups, LoopConfig, Run, run_loop
from ..train.ownership import CONFIG_FILE
from .curves import write_curves
from .heatmap import write_heatmap
from .memory import check_search_sizes

HISTORY_FILE = "alpha_history.jsonl"
GENOTYPE_FILE = "genotype.json"
HEATMAP_FILE = "alphas.png"
SUMMARY_FILE = "search.json"


def glyph_halves(
    *,
    num_classes: int = 20,
    image_size: int = 16,
    split: str = "background",
    seed: int = 0,
    cache_dir: Path | None = None,
) -> SearchData:
    """Glyph classification: ``num_classes`` characters spread evenly over ``split``, each
    class's drawings halved into train (first half) and validation (second half)."""
    from ..data import load_glyphs

    check_image_size("glyph_halves: image_size (--image-size)", image_size, image_size)
    ds = load_glyphs(split, seed=seed, cache_dir=cache_dir, image_size=image_size)
    if not 2 <= num_classes <= ds.num_classes:
        raise ConfigError(f"glyph_halves: num_classes must be in [2, {ds.num_classes}] for "
                          f"split {split!r}, got {num_classes}")
    picked = ds.images[(torch.arange(num_classes) * ds.num_classes) // num_classes]
    half = ds.per_class // 2  # picked: (classes, per_class, 1, H, W)
    labels = torch.arange(num_classes)

    def flat(images: Tensor) -> tuple[Tensor, Tensor]:
        n = images.shape[1]
        return images.flatten(0, 1), labels.repeat_interleave(n)

    (tx, ty), (vx, vy) = flat(picked[:, :half]), flat(picked[:, half:])
    return SearchData(tx, ty, vx, vy, num_classes, f"glyphs/{split}:{num_classes}x{image_size}px")


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


def _as_stored(config: dict[str, Any], out: Path) -> dict[str, Any]:
    """``config`` for resuming the run in ``out`` as its ``config.json`` has it: a
    :class:`~funcgraph.nas.SearchConfig` field that the stored config lacks (a run from
    before the field existed) is left out when its value is the default, which is what that
    run ran with, so ``--resume`` compares it equal; any other difference is refused as
    ever."""
    if not (out / CONFIG_FILE).is_file():
        return config
    stored = Run.open(out).config
    defaults = json.loads(json.dumps(SearchConfig().to_dict()))
    return {k: v for k, v in config.items()
            if k in stored or k not in defaults or json.loads(json.dumps(v)) != defaults[k]}


class _Stopped(Exception):
    """Raised at an epoch end when a stopping criterion fires (caught by :func:`run_search`):
    ``record`` is the metrics record that logs it, its ``kind`` the criterion
    (``collapse_guard`` or ``stop_stable``)."""

    def __init__(self, step: int, groups: Groups, record: dict[str, Any]) -> None:
        super().__init__(f"{record['kind']} at step {step}")
        self.step, self.groups, self.record = step, groups, record


def _stable_for(genotypes: list[Any]) -> int:
    """How many epoch ends, counted back from the last, derived the last genotype."""
    n = 0
    while n < len(genotypes) and genotypes[-1 - n] == genotypes[-1]:
        n += 1
    return n


@dataclass(frozen=True)
class SearchResult:
    """The genotype a search chose, how far it ran, and where its files are. ``stop_reason``
    names the criterion that stopped it early (``collapse_guard``, ``stop_stable``), if any."""

    genotype: Genotype
    steps_done: int
    stopped_early: bool
    val_acc: float
    seconds: float
    path: Path
    stop_reason: str | None = None


def _history_record(epoch: int, step: int, weights: Mapping[str, Tensor], genotype: Genotype,
                    uncapped: Genotype, val_acc: float) -> dict[str, Any]:
    return {
        "epoch": epoch, "step": step, "val_acc": val_acc,
        "normal": [[round(v, 6) for v in row] for row in weights["normal"].tolist()],
        "reduce": [[round(v, 6) for v in row] for row in weights["reduce"].tolist()],
        "skips_normal": uncapped.skips("normal"), "skips_reduce": uncapped.skips("reduce"),
        "genotype": genotype.to_dict(),
    }


def _read_history(path: Path, upto_step: int) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if int(r.get("step", 0)) <= upto_step:
            records.append(r)
    return records


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


def run_search(
    out: str | Path,
    data: SearchData,
    cfg: SearchConfig,
    *,
    resume: bool = False,
    device: str | torch.device = "cpu",
    show_progress: bool = True,
    extra_config: Mapping[str, Any] | None = None,
    env: distributed.DistEnv | None = None,
    tensorboard: bool = False,
) -> SearchResult:
    """Search in run directory ``out`` (``resume=True`` continues the run there).

    With a distributed ``env`` the ranks share every step (see :func:`make_search_step`); all
    ranks evaluate the epoch ends (identical params give identical decisions, so the collapse
    guard stops them together) and rank 0 alone writes. Second order is single-process: its
    unrolled weight step would need the whole training batch on every rank. Selection by
    perturbation (``cfg.select``) runs on rank 0 alone, after the search; the other ranks'
    results carry DARTS' derivation."""
    env = env or distributed.DistEnv()
    if env.active and cfg.bilevel.order != "first":
        raise ConfigError("search: --order second runs in one process (the unrolled step "
                          "needs the whole batch); use --order first with --nproc")
    started = time.perf_counter()
    plan = plan_search(data, cfg, extra_config, device=device)
    model, per_epoch, batch, total = plan.model, plan.per_epoch, plan.batch, plan.total
    config = _as_stored(plan.config, Path(out)) if resume else plan.config
    run = Run.create(out, config, resume=resume, may_change=("steps", "epochs"), env=env,
                     tensorboard=tensorboard)
    try:
        data = replace(data, train_x=data.train_x.to(device), train_y=data.train_y.to(device),
                       val_x=data.val_x.to(device), val_y=data.val_y.to(device))

        params, state = model.init(random.key(cfg.seed))
        arch, weights = partition(params_to(params, device), is_arch)
        state = params_to(state, device)
        b = cfg.bilevel
        groups: Groups = {"weights": weights, "arch": arch, "state": state,
                          "opt_w": b.weight_optimizer().init(weights),
                          "opt_a": b.arch_optimizer().init(arch)}
        start, stopped, stop_reason = 0, False, None
        history_path = run.path / HISTORY_FILE
        if resume and run.has_checkpoint("last"):
            expect = {k: groups[k] for k in ("weights", "arch", "state")}
            # load_checkpoint returns names in saved order as fresh aligned tensors, which a
            # bit-exact resume needs (sums such as the clipping norm depend on both).
            loaded, meta = run.load("last", expect=expect, device=str(device))
            groups = {k: loaded.get(k, {}) for k in groups}
            start, stopped = int(meta["step"]), bool(meta.get("stopped_early", False))
            # before stop_stable, the collapse guard was the only criterion
            stop_reason = meta.get("stop_reason", "collapse_guard" if stopped else None)
            if env.is_main:
                run.truncate_metrics(start)
        kept = _read_history(history_path, start)  # every rank: the stability criterion's past
        trail: list[Any] = [r.get("genotype") for r in kept]
        if env.is_main:
            atomic_write(history_path, "".join(json.dumps(r) + "\n" for r in kept).encode())

        def extra(step: int) -> Params:
            """The remedies' params entries of the supernet after ``step`` steps (those of the
            last step taken)."""
            return remedy_params(cfg, max(step - 1, 0), total, data.val_x)

        def genotypes(arch_params: Params) -> tuple[dict[str, Tensor], Genotype, Genotype]:
            w = arch_weights(arch_params)
            capped = derive_genotype(w, primitives=cfg.space, steps=cfg.nodes,
                                     multiplier=cfg.multiplier, skip_cap=cfg.skip_cap)
            return w, capped, derive_genotype(w, primitives=cfg.space, steps=cfg.nodes,
                                              multiplier=cfg.multiplier)

        def end_of_epoch(step: int, g: Groups) -> dict[str, float]:
            full = {**g["weights"], **g["arch"]}
            distributed.assert_in_sync(full, env, step)
            val_acc = supernet_accuracy(model, {**full, **extra(step)}, g["state"], data.val_x,
                                        data.val_y, batch_stats=True)
            w, genotype, uncapped = genotypes(g["arch"])
            epoch = math.ceil(step / per_epoch)
            if env.is_main:
                with open(history_path, "a") as f:
                    f.write(json.dumps(_history_record(epoch, step, w, genotype, uncapped, val_acc))
                            + "\n")
            trail.append(genotype.to_dict())
            skips = uncapped.skips("normal")
            if cfg.stop_skips is not None and skips >= cfg.stop_skips and step < total:
                raise _Stopped(step, g, {"kind": "collapse_guard", "step": step,
                                         "skips_normal": skips})
            if cfg.stop_stable and _stable_for(trail) >= cfg.stop_stable and step < total:
                raise _Stopped(step, g, {"kind": "stop_stable", "step": step,
                                         "epochs": cfg.stop_stable})
            return {"val_acc": val_acc, "skips_normal": skips,
                    "skips_reduce": uncapped.skips("reduce")}

        loop = LoopConfig(total_steps=total, checkpoint_every=per_epoch, validate_every=per_epoch,
                          log_every=max(1, per_epoch // 2), items_per_step=cfg.batch_size,
                          item_name="images", show_progress=show_progress and env.is_main,
                          write=env.is_main, description=f"search ({b.order} order)",
                          meta={"config": config, "world_size": env.world_size})
        done = start
        if not stopped and start < total:
            step_fn = make_search_step(model, cfg, batch, total, env, steps_per_epoch=per_epoch)
            try:
                groups = run_loop(run, groups, step_fn, loop, start_step=start,
                                  validate=end_of_epoch,
                                  after_validation=lambda _: write_curves(run.path))
                done = total
            except _Stopped as c:
                groups, done, stopped, stop_reason = c.groups, c.step, True, c.record["kind"]
                if env.is_main:
                    run.log(c.record)
                    run.save("last", groups, {"config": config, "step": done,
                                              "stopped_early": True, "stop_reason": stop_reason})
        w, argmax, _ = genotypes(groups["arch"])
        if not env.is_main:
            return SearchResult(argmax, done, stopped, float("nan"), 0.0, run.path, stop_reason)
        final = {**groups["weights"], **groups["arch"], **extra(done)}
        genotype = argmax
        if cfg.select == "perturbation":
            from ..nas.perturbation import perturbation_genotype

            genotype = perturbation_genotype(model, final, groups["state"], data.val_x,
                                             data.val_y, primitives=cfg.space,
                                             skip_cap=cfg.skip_cap)
        genotype.save(run.path / GENOTYPE_FILE)
        write_heatmap(run.path / HEATMAP_FILE, w, primitives=cfg.space, steps=cfg.nodes,
                      label="softmax(alpha) x edge weight" if cfg.edge_normalization
                      else "softmax(alpha)")
        val_acc = supernet_accuracy(model, final, groups["state"], data.val_x, data.val_y,
                                    batch_stats=True)
        seconds = time.perf_counter() - started
        summary = {"genotype": genotype.to_dict(), "steps_done": done, "steps": total,
                   "stopped_early": stopped, "stop_reason": stop_reason, "val_acc": val_acc,
                   "seconds": seconds, "skips_normal": genotype.skips("normal"),
                   "skips_reduce": genotype.skips("reduce"), "select": cfg.select,
                   "argmax_genotype": argmax.to_dict()}
        atomic_write(run.path / SUMMARY_FILE, json.dumps(summary, indent=2).encode())
        write_curves(run.path)
        return SearchResult(genotype, done, stopped, val_acc, seconds, run.path, stop_reason)
    finally:
        run.close()




__all__ = [
    "GENOTYPE_FILE",
    "HEATMAP_FILE",
    "HISTORY_FILE",
    "MODEL_PARAMS",
    "OWNED_PARAMS",
    "SUMMARY_FILE",
    "SearchPlan",
    "SearchResult",
    "glyph_halves",
    "model_network",
    "network_fields",
    "plan_search",
    "run_search",
]
