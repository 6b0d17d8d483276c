"""What ``funcgraph search`` runs: a DARTS search over a run directory, epoch by epoch.

:func:`run_search` runs a plan (:func:`funcgraph.runs.search_plan.plan_search`): it drives
:func:`funcgraph.train.run_loop` with the bilevel step (:func:`funcgraph.nas.make_search_step`)
and, at the end of every epoch, records ``softmax(alpha)`` (``alpha_history.jsonl``), derives
the genotype, reports its skip connections and applies the collapse guard: when the normal
cell derived without any cap holds ``stop_skips`` or more skip connections, the search stops
early (the DARTS+ criterion, Liang et al., 2019). With ``stop_stable`` it also stops when the
derived genotype has been the same for that many consecutive epoch ends (DARTS+' stability
criterion). At the end it writes ``genotype.json`` (DARTS' derivation, or DARTS-PT's selection
by perturbation with ``select="perturbation"``), ``alphas.png`` (a heat map of the final
weights) and ``search.json`` (a summary).
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
from ..files import atomic_write
from ..model import Model
from ..nas import (
    BatchFn,
    Genotype,
    SearchConfig,
    SearchData,
    arch_weights,
    derive_genotype,
    is_arch,
    make_search_step,
    remedy_params,
    supernet_accuracy,
)
from ..params import Params, partition
from ..params import to as params_to
from ..placement import cpu_threads
from ..train import Groups, LoopConfig, Run, run_loop
from ..train.ownership import CONFIG_FILE
from .curves import write_curves
from .heatmap import write_heatmap
from .search_plan import plan_search

HISTORY_FILE = "alpha_history.jsonl"
GENOTYPE_FILE = "genotype.json"
HEATMAP_FILE = "alphas.png"
SUMMARY_FILE = "search.json"


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
class _Progress:
    """Where a search stands: its groups after ``step`` steps, and whether (by which
    criterion, ``stop_reason``) it stopped early."""

    groups: Groups
    step: int
    stopped: bool = False
    stop_reason: str | None = None


@dataclass(frozen=True)
class _Search:
    """A search under way: what its epoch ends and its final report read. ``data`` is on the
    search's device; ``trail`` holds the genotypes derived at the epoch ends so far, those
    before a resume included (the stability criterion's past)."""

    run: Run
    model: Model
    data: SearchData
    cfg: SearchConfig
    per_epoch: int
    total: int
    env: distributed.DistEnv
    trail: list[Any]

    def extra(self, step: int) -> Params:
        """The remedies' params entries of the supernet after ``step`` steps (those of the
        last step taken)."""
        return remedy_params(self.cfg, max(step - 1, 0), self.total, self.data.val_x)

    def genotypes(self, arch_params: Params) -> tuple[dict[str, Tensor], Genotype, Genotype]:
        """The architecture weights, and the genotypes derived from them with and without
        ``cfg.skip_cap``."""
        cfg, w = self.cfg, arch_weights(arch_params)
        capped = derive_genotype(w, primitives=cfg.space, steps=cfg.nodes,
                                 multiplier=cfg.multiplier, skip_cap=cfg.skip_cap,
                                 edge_order=cfg.edge_order)
        return w, capped, derive_genotype(w, primitives=cfg.space, steps=cfg.nodes,
                                          multiplier=cfg.multiplier, edge_order=cfg.edge_order)

    def end_of_epoch(self, step: int, g: Groups) -> dict[str, float]:
        """Validates the supernet after ``step`` steps, appends the epoch to the history
        (rank 0) and raises :class:`_Stopped` when a stopping criterion fires before the last
        step; else the metrics to log."""
        cfg, env, data, total = self.cfg, self.env, self.data, self.total
        full = {**g["weights"], **g["arch"]}
        distributed.assert_in_sync(full, env, step)
        val_acc = supernet_accuracy(self.model, {**full, **self.extra(step)}, g["state"],
                                    data.val_x, data.val_y, batch_stats=True)
        w, genotype, uncapped = self.genotypes(g["arch"])
        epoch = math.ceil(step / self.per_epoch)
        if env.is_main:
            with open(self.run.path / HISTORY_FILE, "a") as f:
                f.write(json.dumps(_history_record(epoch, step, w, genotype, uncapped, val_acc))
                        + "\n")
        self.trail.append(genotype.to_dict())
        skips = uncapped.skips("normal")
        if cfg.stop_skips is not None and skips >= cfg.stop_skips and step < total:
            raise _Stopped(step, g, {"kind": "collapse_guard", "step": step,
                                     "skips_normal": skips})
        if cfg.stop_stable and _stable_for(self.trail) >= cfg.stop_stable and step < total:
            raise _Stopped(step, g, {"kind": "stop_stable", "step": step,
                                     "epochs": cfg.stop_stable})
        return {"val_acc": val_acc, "skips_normal": skips,
                "skips_reduce": uncapped.skips("reduce")}


def _start(run: Run, model: Model, cfg: SearchConfig, *, resume: bool,
           device: str | torch.device, env: distributed.DistEnv) -> _Progress:
    """The search's groups at its first step: fresh from ``cfg.seed``, or with ``resume``
    those of the run's last checkpoint (its metrics cut back to that step by rank 0)."""
    params, state = model.init(random.key(cfg.seed))
    arch, weights = partition(params_to(params, device), is_arch)
    state = params_to(state, device)
    b = cfg.bilevel
    groups: Groups = {"weights": weights, "arch": arch, "state": state,
                      "opt_w": b.weight_optimizer().init(weights),
                      "opt_a": b.arch_optimizer().init(arch)}
    if not (resume and run.has_checkpoint("last")):
        return _Progress(groups, 0)
    expect = {k: groups[k] for k in ("weights", "arch", "state")}
    # load_checkpoint returns names in saved order as fresh aligned tensors, which a
    # bit-exact resume needs (sums such as the clipping norm depend on both).
    loaded, meta = run.load("last", expect=expect, device=str(device))
    start, stopped = int(meta["step"]), bool(meta.get("stopped_early", False))
    # before stop_stable, the collapse guard was the only criterion
    stop_reason = meta.get("stop_reason", "collapse_guard" if stopped else None)
    if env.is_main:
        run.truncate_metrics(start)
    return _Progress({k: loaded.get(k, {}) for k in groups}, start, stopped, stop_reason)


def _kept_history(run: Run, upto_step: int, env: distributed.DistEnv) -> list[Any]:
    """The genotypes of the epoch ends up to ``upto_step`` in the run's history, read by every
    rank; rank 0 rewrites the history to hold those alone (a resume drops the epoch ends past
    its checkpoint)."""
    path = run.path / HISTORY_FILE
    kept = _read_history(path, upto_step)
    if env.is_main:
        atomic_write(path, "".join(json.dumps(r) + "\n" for r in kept).encode())
    return [r.get("genotype") for r in kept]


def _run_epochs(search: _Search, start: _Progress, batch: BatchFn, config: dict[str, Any],
                show_progress: bool) -> _Progress:
    """Runs the search from ``start`` to its step budget or to a stopping criterion, which
    rank 0 logs and checkpoints with its reason. A run that had stopped, or had taken every
    step, is left as it was."""
    if start.stopped or start.step >= search.total:
        return start
    cfg, env, run, per_epoch = search.cfg, search.env, search.run, search.per_epoch
    loop = LoopConfig(total_steps=search.total, checkpoint_every=per_epoch,
                      validate_every=per_epoch, log_every=max(1, per_epoch // 2),
                      items_per_step=cfg.batch_size, item_name="images",
                      show_progress=show_progress and env.is_main, write=env.is_main,
                      description=f"search ({cfg.bilevel.order} order)",
                      meta={"config": config, "world_size": env.world_size})
    step_fn = make_search_step(search.model, cfg, batch, search.total, env,
                               steps_per_epoch=per_epoch)
    try:
        groups = run_loop(run, start.groups, step_fn, loop, start_step=start.step,
                          validate=search.end_of_epoch,
                          after_validation=lambda _step, _val: write_curves(run.path))
    except _Stopped as c:
        reason = c.record["kind"]
        if env.is_main:
            run.log(c.record)
            run.save("last", c.groups, {"config": config, "step": c.step,
                                        "stopped_early": True, "stop_reason": reason})
        return _Progress(c.groups, c.step, True, reason)
    return replace(start, groups=groups, step=search.total)


def _report(search: _Search, end: _Progress, started: float) -> SearchResult:
    """The search's result; rank 0 selects the genotype (``cfg.select``) and writes it, the
    heat map, the summary and the curves. Other ranks return DARTS' derivation, unscored."""
    cfg, model, data, path = search.cfg, search.model, search.data, search.run.path
    groups, done = end.groups, end.step
    w, argmax, _ = search.genotypes(groups["arch"])
    if not search.env.is_main:
        return SearchResult(argmax, done, end.stopped, float("nan"), 0.0, path, end.stop_reason)
    final = {**groups["weights"], **groups["arch"], **search.extra(done)}
    genotype = argmax
    if cfg.select == "perturbation":
        from ..nas.perturbation import perturbation_genotype

        genotype = perturbation_genotype(model, final, groups["state"], data.val_x,
                                         data.val_y, primitives=cfg.space,
                                         skip_cap=cfg.skip_cap)
    genotype.save(path / GENOTYPE_FILE)
    write_heatmap(path / HEATMAP_FILE, w, primitives=cfg.space, steps=cfg.nodes,
                  label="softmax(alpha) x edge weight" if cfg.edge_normalization
                  else "softmax(alpha)")
    val_acc = supernet_accuracy(model, final, groups["state"], data.val_x, data.val_y,
                                batch_stats=True)
    seconds = time.perf_counter() - started
    summary = {"genotype": genotype.to_dict(), "steps_done": done, "steps": search.total,
               "stopped_early": end.stopped, "stop_reason": end.stop_reason,
               "val_acc": val_acc, "seconds": seconds, "skips_normal": genotype.skips("normal"),
               "skips_reduce": genotype.skips("reduce"), "select": cfg.select,
               "argmax_genotype": argmax.to_dict()}
    atomic_write(path / SUMMARY_FILE, json.dumps(summary, indent=2).encode())
    write_curves(path)
    return SearchResult(genotype, done, end.stopped, val_acc, seconds, path, end.stop_reason)


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
    threads: int = 0,
) -> SearchResult:
    """Search in run directory ``out`` (``resume=True`` continues the run there).

    ``threads``: CPU threads for torch (0: the process's count). The run records the count it
    ran with in ``config.json``, a resume given 0 takes the recorded one (the rounding of a
    step depends on it), and another count may be given on resume.

    With a distributed ``env`` the ranks share every step (see :func:`make_search_step`); all
    ranks evaluate the epoch ends (identical params give identical decisions, so the collapse
    guard stops them together) and rank 0 alone writes. Second order is single-process: its
    unrolled weight step would need the whole training batch on every rank. Selection by
    perturbation (``cfg.select``) runs on rank 0 alone, after the search; the other ranks'
    results carry DARTS' derivation."""
    if resume and not threads and (Path(out) / CONFIG_FILE).is_file():
        threads = int(Run.open(out).config.get("threads") or 0)
    with cpu_threads(threads):
        extra = {**(extra_config or {}), "threads": torch.get_num_threads()}
        return _run_search(out, data, cfg, resume=resume, device=device,
                           show_progress=show_progress, extra_config=extra, env=env,
                           tensorboard=tensorboard)


def _run_search(out: str | Path, data: SearchData, cfg: SearchConfig, *, resume: bool,
                device: str | torch.device, show_progress: bool,
                extra_config: Mapping[str, Any], env: distributed.DistEnv | None,
                tensorboard: bool) -> SearchResult:
    """:func:`run_search` at the run's thread count (``extra_config["threads"]``)."""
    env = env or distributed.DistEnv()
    if env.active and cfg.bilevel.order != "first":
        raise ConfigError("search: --order second runs in one process (the unrolled step "
                          "needs the whole batch); use --order first with --nproc")
    started = time.perf_counter()
    plan = plan_search(data, cfg, extra_config, device=device)
    config = _as_stored(plan.config, Path(out)) if resume else plan.config
    run = Run.create(out, config, resume=resume, may_change=("steps", "epochs", "threads"),
                     env=env, tensorboard=tensorboard, added={"edge_order": "input"})
    try:
        data = replace(data, train_x=data.train_x.to(device), train_y=data.train_y.to(device),
                       val_x=data.val_x.to(device), val_y=data.val_y.to(device))
        start = _start(run, plan.model, cfg, resume=resume, device=device, env=env)
        search = _Search(run, plan.model, data, cfg, plan.per_epoch, plan.total, env,
                         _kept_history(run, start.step, env))
        end = _run_epochs(search, start, plan.batch, config, show_progress)
        return _report(search, end, started)
    finally:
        run.close()


__all__ = [
    "GENOTYPE_FILE",
    "HEATMAP_FILE",
    "HISTORY_FILE",
    "SUMMARY_FILE",
    "SearchResult",
    "run_search",
]
