"""A whole DARTS search over a run directory: data halves, the step, per-epoch derivation.

:func:`run_search` drives :func:`funcgraph.train.run_loop` with the bilevel step and, at the
end of every epoch, records ``softmax(alpha)`` (``alpha_history.jsonl``), derives the genotype,
reports its skip connections and applies the collapse guard: when the normal cell derived
without any cap holds ``stop_skips`` or more skip connections, the search stops early (the
DARTS+ criterion, Liang et al., 2019). At the end it writes ``genotype.json``,
``alphas.png`` (a heat map of the final weights) and ``search.json`` (a summary).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import grad

from .. import distributed, random
from ..errors import ConfigError, ShapeError
from ..model import Model
from ..params import Params, State, partition
from ..params import to as params_to
from ..train import LoopConfig, Run, cosine_lr, run_loop
from ..train.checkpoint import atomic_write
from ..train.loop import Groups, StepFn
from .bilevel import BilevelConfig, LossFn, arch_gradient, clip_grad_norm
from .cell import arch_weights, edge_inputs, is_arch, search_network
from .genotype import Genotype, derive_genotype
from .ops import PRIMITIVES

HISTORY_FILE = "alpha_history.jsonl"
GENOTYPE_FILE = "genotype.json"
HEATMAP_FILE = "alphas.png"
SUMMARY_FILE = "search.json"


@dataclass(frozen=True)
class SearchData:
    """Search inputs: ``train_*`` fit the weights, ``val_*`` the architecture.

    ``*_x (N, C, H, W)`` float, ``*_y (N,)`` int64 class indices in ``[0, num_classes)``.
    """

    train_x: Tensor
    train_y: Tensor
    val_x: Tensor
    val_y: Tensor
    num_classes: int
    name: str = "data"

    def __post_init__(self) -> None:
        for split in ("train", "val"):
            x, y = getattr(self, f"{split}_x"), getattr(self, f"{split}_y")
            if x.dim() != 4 or y.shape != (x.shape[0],):
                raise ShapeError(f"SearchData: {split}_x must be (N, C, H, W) with {split}_y (N,), "
                                 f"got {tuple(x.shape)} and {tuple(y.shape)}")
            if x.shape[-1] % 4 or x.shape[-2] % 4:
                raise ShapeError(f"SearchData: H and W must be divisible by 4 (two reduction "
                                 f"cells), got {tuple(x.shape[-2:])}")


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


@dataclass(frozen=True)
class SearchConfig:
    """One search. Defaults are the CPU proxy of ``funcgraph search`` (see docs/darts.md):
    a 5-cell, C=8 supernet on 16x16 glyphs; the paper's is 8 cells, C=16, 50 epochs."""

    C: int = 8
    layers: int = 5
    epochs: int = 10
    steps: int | None = None
    batch_size: int = 32
    partial_channels: int = 1
    skip_cap: int | None = None
    stop_skips: int | None = 4
    seed: int = 0
    bilevel: BilevelConfig = field(default_factory=BilevelConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Batch = tuple[Tensor, Tensor]
BatchFn = Callable[[int], tuple[Batch, Batch]]


def _batches(data: SearchData, batch_size: int, seed: int) -> tuple[int, BatchFn]:
    """``steps_per_epoch`` and ``batch(step) -> (train_batch, val_batch)``, reshuffled every
    epoch from a key folded with the epoch number (so a resumed run sees the same batches)."""
    n_train, n_val = data.train_x.shape[0], data.val_x.shape[0]
    if batch_size > min(n_train, n_val):
        raise ConfigError(f"search: batch_size ({batch_size}) exceeds the smaller half "
                          f"({min(n_train, n_val)} examples)")
    per_epoch = n_train // batch_size
    root = random.fold_in(random.key(seed), 1)

    def batch(step: int) -> tuple[Batch, Batch]:
        epoch, b = divmod(step, per_epoch)
        kt, kv = random.split(random.fold_in(root, epoch))
        ti = random.permutation(kt, n_train)[b * batch_size:(b + 1) * batch_size]
        vi = random.permutation(kv, n_val)[:n_val - n_val % batch_size].reshape(-1, batch_size)
        vi = vi[b % vi.shape[0]]
        device = data.train_x.device
        ti, vi = ti.to(device), vi.to(device)
        return (data.train_x[ti], data.train_y[ti]), (data.val_x[vi], data.val_y[vi])

    return per_epoch, batch


def _loss(model: Model, state: State) -> LossFn:
    def loss(weights: Params, arch: Params, batch: Batch) -> Tensor:
        x, y = batch
        logits, _ = model.apply({**weights, **arch}, state, x, train=True)
        return F.cross_entropy(logits, y)

    return loss


def _own_rows(batch: Batch, env: distributed.DistEnv) -> Batch:
    rows = distributed.shard(batch[1].shape[0], env)
    return batch[0][rows.start:rows.stop], batch[1][rows.start:rows.stop]


def make_search_step(
    model: Model,
    cfg: SearchConfig,
    batch: BatchFn,
    total_steps: int,
    env: distributed.DistEnv | None = None,
) -> StepFn:
    """``step(step, groups) -> (groups, metrics)`` for :func:`run_loop`: an architecture step
    on the validation batch, then a weight step (gradient clipped) on the training batch.
    Groups: ``weights``, ``arch``, ``state`` (batch-norm statistics), ``opt_w``, ``opt_a``.

    With a distributed ``env`` (first order only) each rank takes its slice of both batches and
    the architecture gradient, the weight gradient and the batch-norm running statistics are
    averaged over ranks before their updates. Batch norm normalises each rank's slice with that
    slice's statistics (as data parallelism without synchronised batch norm does), so the
    search is not the single-process search of the whole batch, only the usual approximation
    of it."""
    b = cfg.bilevel
    w_opt, a_opt = b.weight_optimizer(), b.arch_optimizer()
    env = env or distributed.DistEnv()

    def mean(tensors: Params) -> Params:
        return distributed.all_reduce_mean(tensors, env) if env.active else tensors

    def step(i: int, g: Groups) -> tuple[Groups, Mapping[str, float]]:
        lr = cosine_lr(b.w_lr, i, total_steps, min_lr=b.w_lr_min)
        train_batch, val_batch = batch(i)
        if env.active:
            train_batch, val_batch = _own_rows(train_batch, env), _own_rows(val_batch, env)
        w, a, state = g["weights"], g["arch"], g["state"]
        ga = mean(arch_gradient(_loss(model, state), w, a, train_batch, val_batch, config=b,
                                opt_state=g["opt_w"], lr=lr))
        a, opt_a = a_opt.update(a, ga, g["opt_a"])

        def train_loss(w_: Params) -> tuple[Tensor, tuple[State, Tensor]]:
            x, y = train_batch
            logits, new_state = model.apply({**w_, **a}, state, x, train=True)
            return F.cross_entropy(logits, y), (new_state, logits)

        gw, (new_state, logits) = grad(train_loss, has_aux=True)(w)
        gw = mean(gw)
        new_state = {**new_state, **mean({n: t for n, t in new_state.items()
                                          if t.is_floating_point()})}
        gw, _ = clip_grad_norm(gw, b.grad_clip)
        w, opt_w = w_opt.update(w, gw, g["opt_w"], lr=lr)
        loss = F.cross_entropy(logits, train_batch[1])
        acc = (logits.argmax(-1) == train_batch[1]).float().mean()
        groups = {"weights": w, "arch": a, "state": new_state, "opt_w": opt_w, "opt_a": opt_a}
        return groups, {"loss": float(loss), "acc": float(acc), "lr": lr}

    return step


def accuracy(model: Model, params: Params, state: State, x: Tensor, y: Tensor,
             *, batch_size: int = 256, batch_stats: bool = False) -> float:
    """Accuracy of ``model`` on ``(x, y)`` in chunks of ``batch_size``: evaluation mode, or
    with ``batch_stats=True`` batch-norm statistics of each chunk (state left unchanged).

    The search reports its supernet with batch statistics, as the architecture step sees it:
    in a search of a few dozen steps the running statistics still carry much of their
    initial variance of 1 (0.9**18 = 15% after 18 steps), which for the small activations
    of a fresh supernet is far off, so evaluation mode would report chance accuracy.
    """
    correct = 0
    with torch.no_grad():
        for s in range(0, x.shape[0], batch_size):
            logits, _ = model.apply(params, state, x[s:s + batch_size], train=batch_stats)
            correct += int((logits.argmax(-1) == y[s:s + batch_size]).sum())
    return correct / max(x.shape[0], 1)


class _Collapsed(Exception):
    """Raised at an epoch end when the collapse guard fires (caught by :func:`run_search`)."""

    def __init__(self, step: int, groups: Groups, skips: int) -> None:
        super().__init__(f"collapse guard at step {step}: {skips} skip connections")
        self.step, self.groups, self.skips = step, groups, skips


@dataclass(frozen=True)
class SearchResult:
    genotype: Genotype
    steps_done: int
    stopped_early: bool
    val_acc: float
    seconds: float
    path: Path


def build_search_model(cfg: SearchConfig, data: SearchData) -> Model:
    """The supernet ``cfg`` and ``data`` call for."""
    return search_network(cfg.C, cfg.layers, data.num_classes,
                          in_channels=int(data.train_x.shape[1]),
                          partial_channels=cfg.partial_channels)


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
) -> SearchResult:
    """Search in run directory ``out`` (``resume=True`` continues the run there).

    With a distributed ``env`` the ranks share every step (see :func:`make_search_step`); all
    ranks evaluate the epoch ends (identical params give identical decisions, so the collapse
    guard stops them together) and rank 0 alone writes. Second order is single-process: its
    unrolled weight step would need the whole training batch on every rank."""
    env = env or distributed.DistEnv()
    if env.active and cfg.bilevel.order != "first":
        raise ConfigError("search: --order second runs in one process (the unrolled step "
                          "needs the whole batch); use --order first with --nproc")
    started = time.perf_counter()
    model = build_search_model(cfg, data)
    per_epoch, batch = _batches(data, cfg.batch_size, cfg.seed)
    total = cfg.steps if cfg.steps is not None else cfg.epochs * per_epoch
    if total < 1:
        raise ConfigError(f"search: need at least one step, got steps={total}")
    config = {"command": "search", "data": data.name, **cfg.to_dict(), **(extra_config or {}),
              "steps": total}
    run = Run.create(out, config, resume=resume, may_change=("steps", "epochs"), env=env)
    data = replace(data, train_x=data.train_x.to(device), train_y=data.train_y.to(device),
                   val_x=data.val_x.to(device), val_y=data.val_y.to(device))

    params, state = model.init(random.key(cfg.seed))
    arch, weights = partition(params_to(params, device), is_arch)
    state = params_to(state, device)
    b = cfg.bilevel
    groups: Groups = {"weights": weights, "arch": arch, "state": state,
                      "opt_w": b.weight_optimizer().init(weights),
                      "opt_a": b.arch_optimizer().init(arch)}
    start, stopped = 0, False
    history_path = run.path / HISTORY_FILE
    if resume and run.has_checkpoint("last"):
        expect = {k: groups[k] for k in ("weights", "arch", "state")}
        # load_checkpoint returns names in saved order as fresh aligned tensors, which a
        # bit-exact resume needs (sums such as the clipping norm depend on both).
        loaded, meta = run.load("last", expect=expect, device=str(device))
        groups = {k: loaded.get(k, {}) for k in groups}
        start, stopped = int(meta["step"]), bool(meta.get("stopped_early", False))
        if env.is_main:
            run.truncate_metrics(start)
    if env.is_main:
        kept = _read_history(history_path, start)
        atomic_write(history_path, "".join(json.dumps(r) + "\n" for r in kept).encode())

    def genotypes(arch_params: Params) -> tuple[dict[str, Tensor], Genotype, Genotype]:
        w = arch_weights(arch_params)
        return w, derive_genotype(w, skip_cap=cfg.skip_cap), derive_genotype(w)

    def end_of_epoch(step: int, g: Groups) -> dict[str, float]:
        full = {**g["weights"], **g["arch"]}
        distributed.assert_in_sync(full, env, step)
        val_acc = accuracy(model, full, g["state"], data.val_x, data.val_y, batch_stats=True)
        w, genotype, uncapped = genotypes(g["arch"])
        epoch = math.ceil(step / per_epoch)
        if env.is_main:
            with open(history_path, "a") as f:
                f.write(json.dumps(_history_record(epoch, step, w, genotype, uncapped, val_acc))
                        + "\n")
        skips = uncapped.skips("normal")
        if cfg.stop_skips is not None and skips >= cfg.stop_skips and step < total:
            raise _Collapsed(step, g, skips)
        return {"val_acc": val_acc, "skips_normal": skips, "skips_reduce": uncapped.skips("reduce")}

    loop = LoopConfig(total_steps=total, checkpoint_every=per_epoch, validate_every=per_epoch,
                      log_every=max(1, per_epoch // 2), items_per_step=cfg.batch_size,
                      item_name="images", show_progress=show_progress and env.is_main,
                      write=env.is_main, description=f"search ({b.order} order)",
                      meta={"config": config, "world_size": env.world_size})
    done = start
    if not stopped and start < total:
        try:
            groups = run_loop(run, groups, make_search_step(model, cfg, batch, total, env),
                              loop, start_step=start, validate=end_of_epoch)
            done = total
        except _Collapsed as c:
            groups, done, stopped = c.groups, c.step, True
            if env.is_main:
                run.log({"kind": "collapse_guard", "step": done, "skips_normal": c.skips})
                run.save("last", groups, {"config": config, "step": done,
                                          "stopped_early": True})
    w, genotype, _ = genotypes(groups["arch"])
    if not env.is_main:
        return SearchResult(genotype, done, stopped, float("nan"), 0.0, run.path)
    genotype.save(run.path / GENOTYPE_FILE)
    write_heatmap(run.path / HEATMAP_FILE, w)
    val_acc = accuracy(model, {**groups["weights"], **groups["arch"]}, groups["state"],
                       data.val_x, data.val_y, batch_stats=True)
    seconds = time.perf_counter() - started
    summary = {"genotype": genotype.to_dict(), "steps_done": done, "steps": total,
               "stopped_early": stopped, "val_acc": val_acc, "seconds": seconds,
               "skips_normal": genotype.skips("normal"), "skips_reduce": genotype.skips("reduce")}
    atomic_write(run.path / SUMMARY_FILE, json.dumps(summary, indent=2).encode())
    return SearchResult(genotype, done, stopped, val_acc, seconds, run.path)


def write_heatmap(path: str | Path, weights: Mapping[str, Tensor],
                  primitives: tuple[str, ...] = PRIMITIVES) -> None:
    """A PNG heat map of ``softmax(alpha)``: one panel per cell kind, edges x ops."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{j}->{n}" for n, j in edge_inputs()]
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.5), constrained_layout=True)
    for ax, kind in zip(axes, ("normal", "reduce"), strict=True):
        im = ax.imshow(weights[kind].cpu().numpy(), cmap="viridis", aspect="auto")
        ax.set_title(f"{kind} cell: softmax(alpha)")
        ax.set_xticks(range(len(primitives)), primitives, rotation=45, ha="right")
        ax.set_yticks(range(len(labels)), labels)
        ax.set_ylabel("edge (input -> node)")
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.savefig(path, dpi=100)
    plt.close(fig)


__all__ = [
    "GENOTYPE_FILE",
    "HEATMAP_FILE",
    "HISTORY_FILE",
    "SUMMARY_FILE",
    "SearchConfig",
    "SearchData",
    "SearchResult",
    "accuracy",
    "build_search_model",
    "glyph_halves",
    "make_search_step",
    "run_search",
    "write_heatmap",
]
