"""One DARTS search step and what it runs on: the data halves, the batches, the supernet.

:func:`make_search_step` gives the ``step(step, groups) -> (groups, metrics)`` that
:func:`funcgraph.train.run_loop` drives: an architecture step on a validation batch, then a
weight step on a training batch (Liu et al., 2019). :func:`epoch_batches` reshuffles both
halves every epoch from a key folded with the epoch, so a resumed search sees the same
batches; :func:`supernet_accuracy` scores the supernet. The run around it (epochs, the
collapse guard, the files it writes) is :func:`funcgraph.runs.run_search`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import grad

from .. import distributed, random
from ..errors import ConfigError, ShapeError
from ..model import Model
from ..params import Params, State
from ..train import Groups, StepFn, cosine_lr
from .bilevel import BilevelConfig, LossFn, arch_gradient, clip_grad_norm
from .cell import search_network
from .ops import PRIMITIVES


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


@dataclass(frozen=True)
class SearchConfig:
    """One search. Defaults are the CPU proxy of ``funcgraph search`` (see docs/darts.md):
    a 5-cell, C=8 supernet on 16x16 glyphs; the paper's is 8 cells, C=16, 50 epochs.

    ``primitives`` names the search space's ops (built-in or registered with
    :func:`~funcgraph.nas.register_op`, as :func:`~funcgraph.nas.load_space` returns them);
    ``None`` is DARTS' eight (:data:`~funcgraph.nas.PRIMITIVES`), and :attr:`space` resolves
    it. Names only, so the config stays JSON and a resumed run can compare it."""

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
    primitives: tuple[str, ...] | None = None

    @property
    def space(self) -> tuple[str, ...]:
        """The op names of the search space: ``primitives``, or PRIMITIVES when unset."""
        return PRIMITIVES if self.primitives is None else tuple(self.primitives)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


ImageBatch = tuple[Tensor, Tensor]
"""``(images (B, C, H, W), labels (B,))``."""
BatchFn = Callable[[int], tuple[ImageBatch, ImageBatch]]
"""``batch(step) -> (train batch, validation batch)``."""


def epoch_batches(data: SearchData, batch_size: int, seed: int) -> tuple[int, BatchFn]:
    """``steps_per_epoch`` and ``batch(step) -> (train_batch, val_batch)``, reshuffled every
    epoch from a key folded with the epoch number (so a resumed run sees the same batches)."""
    n_train, n_val = data.train_x.shape[0], data.val_x.shape[0]
    if batch_size > min(n_train, n_val):
        raise ConfigError(f"search: batch_size ({batch_size}) exceeds the smaller half "
                          f"({min(n_train, n_val)} examples)")
    per_epoch = n_train // batch_size
    root = random.fold_in(random.key(seed), 1)

    def batch(step: int) -> tuple[ImageBatch, ImageBatch]:
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
    def loss(weights: Params, arch: Params, batch: ImageBatch) -> Tensor:
        x, y = batch
        logits, _ = model.apply({**weights, **arch}, state, x, train=True)
        return F.cross_entropy(logits, y)

    return loss


def _own_rows(batch: ImageBatch, env: distributed.DistEnv) -> ImageBatch:
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


def supernet_accuracy(model: Model, params: Params, state: State, x: Tensor, y: Tensor,
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


def build_search_model(cfg: SearchConfig, data: SearchData) -> Model:
    """The supernet ``cfg`` and ``data`` call for."""
    return search_network(cfg.C, cfg.layers, data.num_classes,
                          in_channels=int(data.train_x.shape[1]),
                          partial_channels=cfg.partial_channels, primitives=cfg.space)


__all__ = [
    "BatchFn",
    "ImageBatch",
    "SearchConfig",
    "SearchData",
    "build_search_model",
    "epoch_batches",
    "make_search_step",
    "supernet_accuracy",
]
