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
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import grad

from .. import distributed, random
from ..checks import check_int, check_number
from ..errors import ConfigError, ShapeError
from ..model import Model
from ..params import Params, State, zip_map
from ..train import Groups, StepFn, cosine_lr
from .bilevel import BilevelConfig, LossFn, arch_gradient, clip_grad_norm
from .cell import AUX_SKIP, STEPS, search_network
from .genotype import EDGE_ORDERS, SKIP, EdgeOrder
from .ops import PRIMITIVES
from .remedies import aux_skip_coefficient, beta_decay_gradient, beta_decay_weight

Select = Literal["argmax", "perturbation"]
SELECTIONS = ("argmax", "perturbation")


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


NETWORK_FIELDS = {"C": "c", "layers": "layers", "nodes": "steps", "multiplier": "multiplier",
                  "stem_multiplier": "stem_multiplier", "arch_init_scale": "arch_init_scale"}
"""The fields of :class:`SearchConfig` that shape the supernet around the cells, each with
the :func:`~funcgraph.nas.search_network` argument it sets (which is also its key in a
``funcgraph search --model`` config)."""


def check_network_value(where: str, name: str, value: object) -> int | float:
    """A macro-network value (one of :data:`NETWORK_FIELDS`, or the ``search_network``
    argument it sets) checked: ``arch_init_scale`` a finite number > 0 (at 0 every logit
    starts at 0, nothing drawn), every other one an int >= 1."""
    if name != "arch_init_scale":
        return check_int(where, name, value)
    if isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
        raise ConfigError(f"{where}: {name} must be a finite number > 0, got {value!r}")
    return check_number(where, name, value)  # the rest: not a number, NaN, infinite


@dataclass(frozen=True)
class SearchConfig:
    """One search. Defaults are the CPU proxy of ``funcgraph search`` (see docs/darts.md):
    a 5-cell, C=8 supernet on 16x16 glyphs; the paper's is 8 cells, C=16, 50 epochs.

    The macro network around the cells (what ``funcgraph search --model`` sets, with ``C``
    and ``layers``): ``nodes`` intermediate nodes per cell (``search_network``'s ``steps``;
    not to be confused with the step budget ``steps``), of which the last ``multiplier``
    (None: all of them) make the cell's output, a stem ``stem_multiplier * C`` wide, and the
    architecture logits drawn ``arch_init_scale * N(0, 1)``. The defaults are DARTS' (4
    nodes, all 4 concatenated, a stem of 3C, 1e-3).

    ``primitives`` names the search space's ops (built-in or registered with
    :func:`~funcgraph.nas.register_op`, as :func:`~funcgraph.nas.load_space` returns them);
    ``None`` is DARTS' eight (:data:`~funcgraph.nas.PRIMITIVES`), and :attr:`space` resolves
    it. Names only, so the config stays JSON and a resumed run can compare it.

    The remedies (docs/darts.md, "Remedies"), each off by default:

    - ``warmup_epochs``: the first N epochs update the weights only (PC-DARTS, P-DARTS).
    - ``beta_reg``: Beta-Decay (beta-DARTS) with this final weight, rising linearly from 0
      (:func:`~funcgraph.nas.remedies.beta_decay_weight`).
    - ``aux_skip``: DARTS-' auxiliary skip on every stride-1 edge, its coefficient decaying
      linearly from 1 to 0 (:func:`~funcgraph.nas.remedies.aux_skip_coefficient`).
    - ``edge_normalization``: PC-DARTS' edge logits and edge weights (derivation ranks edges
      by ``softmax(alpha) * edge weight``).
    - ``stop_stable``: stop at an epoch end when the derived genotype has been the same for
      this many consecutive epoch ends (DARTS+; 0 = off).
    - ``select``: ``"perturbation"`` (DARTS-PT; the default) or ``"argmax"`` (DARTS'
      derivation) for the final genotype. Perturbation is the default because with it the
      default search beat random cells of the same space on both proxies (every seed above
      the random median; docs/results/darts.md), where DARTS' argmax collapsed into pooling
      cells on glyphs.
    - ``edge_order``: how the argmax derivation lists a node's two edges: ``"input"`` (lower
      input first) or ``"strength"`` (stronger edge first, as DARTS' code does); the same cell
      either way (:func:`~funcgraph.nas.genotype.derive_genotype`).
    """

    C: int = 8
    layers: int = 5
    nodes: int = STEPS
    multiplier: int | None = None
    stem_multiplier: int = 3
    arch_init_scale: float = 1e-3
    epochs: int = 10
    steps: int | None = None
    batch_size: int = 32
    partial_channels: int = 1
    skip_cap: int | None = None
    stop_skips: int | None = 4
    seed: int = 0
    bilevel: BilevelConfig = field(default_factory=BilevelConfig)
    primitives: tuple[str, ...] | None = None
    warmup_epochs: int = 0
    beta_reg: float = 0.0
    aux_skip: bool = False
    edge_normalization: bool = False
    stop_stable: int = 0
    select: Select = "perturbation"
    edge_order: EdgeOrder = "input"

    def __post_init__(self) -> None:
        where = "SearchConfig"
        for name in NETWORK_FIELDS:
            if name != "multiplier" or self.multiplier is not None:  # None: every node
                check_network_value(where, name, getattr(self, name))
        if self.multiplier is not None and self.multiplier > self.nodes:
            raise ConfigError(f"{where}: multiplier ({self.multiplier}) must be at most nodes "
                              f"({self.nodes}): a cell concatenates its last `multiplier` nodes")
        check_int(where, "warmup_epochs", self.warmup_epochs, minimum=0)
        check_number(where, "beta_reg", self.beta_reg)
        for name in ("aux_skip", "edge_normalization"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{where}: {name} must be a bool, got "
                                  f"{getattr(self, name)!r}")
        if check_int(where, "stop_stable", self.stop_stable, minimum=0) == 1:
            raise ConfigError(f"{where}: stop_stable must be 0 (off) or >= 2 (one epoch end "
                              "always agrees with itself), got 1")
        if self.select not in SELECTIONS:
            raise ConfigError(f"{where}: select must be one of {list(SELECTIONS)}, got "
                              f"{self.select!r}")
        if self.edge_order not in EDGE_ORDERS:
            raise ConfigError(f"{where}: edge_order (--edge-order) must be one of "
                              f"{list(EDGE_ORDERS)}, got {self.edge_order!r}")
        if self.edge_order != "input" and self.select != "argmax":
            raise ConfigError(f"{where}: edge_order (--edge-order) {self.edge_order!r} lists "
                              "the argmax derivation's edges; select (--select) "
                              f"{self.select!r} chooses them by perturbation: add "
                              "select='argmax' (--select argmax)")
        check_int(where, "partial_channels", self.partial_channels)
        if self.C % self.partial_channels or (self.C // self.partial_channels) % 2:
            raise ConfigError(f"{where}: partial_channels (--partial-channels) "
                              f"{self.partial_channels} must divide C {self.C} (-C, or c in "
                              "--model) into an even width (the strided skip op halves it)")
        if self.bilevel.order == "first" and self.bilevel.hypergradient != "exact":
            raise ConfigError(f"{where}: bilevel.hypergradient (--hypergradient) "
                              f"{self.bilevel.hypergradient!r} approximates the second-order "
                              "architecture gradient and has no role in order 'first'; use "
                              "order 'second' (--order second) or leave it at 'exact'")
        if self.skip_cap is not None and SKIP not in self.space:
            raise ConfigError(f"{where}: skip_cap (--skip-cap) {self.skip_cap} bounds "
                              f"{SKIP} ops, which the search space {list(self.space)} does not "
                              "have; drop it or add the op")

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


def remedy_params(cfg: SearchConfig, step: int, total_steps: int, like: Tensor) -> Params:
    """The entries the search adds to the supernet's params at ``step``: with ``aux_skip``
    DARTS-' coefficient under :data:`~funcgraph.nas.AUX_SKIP` (a 0-dim tensor of ``like``'s
    dtype and device), otherwise none. They come from the step index alone, so a resumed
    search computes the same, and sit outside every group, so no optimiser sees them."""
    if not cfg.aux_skip:
        return {}
    return {AUX_SKIP: torch.tensor(aux_skip_coefficient(step, total_steps), dtype=like.dtype,
                                   device=like.device)}


def _loss(model: Model, state: State, extra: Params) -> LossFn:
    def loss(weights: Params, arch: Params, batch: ImageBatch) -> Tensor:
        x, y = batch
        logits, _ = model.apply({**weights, **arch, **extra}, state, x, train=True)
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
    *,
    steps_per_epoch: int | None = None,
) -> StepFn:
    """``step(step, groups) -> (groups, metrics)`` for :func:`run_loop`: an architecture step
    on the validation batch, then a weight step (gradient clipped) on the training batch.
    Groups: ``weights``, ``arch``, ``state`` (batch-norm statistics), ``opt_w``, ``opt_a``.

    The remedies of ``cfg``: during the first ``warmup_epochs`` epochs (of
    ``steps_per_epoch`` steps, which the warm-up needs) there is no architecture step, the
    architecture and its optimiser state stay as they are; ``beta_reg`` adds the Beta-Decay
    gradient to the architecture gradient of either order; ``aux_skip`` gives the supernet
    its coefficient at this step (:func:`remedy_params`) in both halves of the step. With
    every remedy off the step is the plain DARTS step. The metrics add the Beta-Decay weight
    (``beta_reg``) and the auxiliary skip coefficient (``aux_skip``) when those are on.

    With a distributed ``env`` (first order only) each rank takes its slice of both batches and
    the architecture gradient, the weight gradient and the batch-norm running statistics are
    averaged over ranks before their updates. Batch norm normalises each rank's slice with that
    slice's statistics (as data parallelism without synchronised batch norm does), so the
    search is not the single-process search of the whole batch, only the usual approximation
    of it."""
    b = cfg.bilevel
    w_opt, a_opt = b.weight_optimizer(), b.arch_optimizer()
    env = env or distributed.DistEnv()
    if cfg.warmup_epochs and steps_per_epoch is None:
        raise ConfigError("make_search_step: warmup_epochs needs steps_per_epoch, the steps of "
                          "an epoch")
    warmup = cfg.warmup_epochs * (steps_per_epoch or 0)

    def mean(tensors: Params) -> Params:
        return distributed.all_reduce_mean(tensors, env) if env.active else tensors

    def step(i: int, g: Groups) -> tuple[Groups, Mapping[str, float]]:
        lr = cosine_lr(b.w_lr, i, total_steps, min_lr=b.w_lr_min)
        train_batch, val_batch = batch(i)
        if env.active:
            train_batch, val_batch = _own_rows(train_batch, env), _own_rows(val_batch, env)
        w, a, state, opt_a = g["weights"], g["arch"], g["state"], g["opt_a"]
        extra = remedy_params(cfg, i, total_steps, train_batch[0])
        metrics: dict[str, float] = {}
        if i >= warmup:
            ga = mean(arch_gradient(_loss(model, state, extra), w, a, train_batch, val_batch,
                                    config=b, opt_state=g["opt_w"], lr=lr))
            if cfg.beta_reg:
                weight = metrics["beta_reg"] = beta_decay_weight(cfg.beta_reg, i, total_steps)
                ga = zip_map(torch.add, ga, beta_decay_gradient(a, weight))
            a, opt_a = a_opt.update(a, ga, opt_a)
        if AUX_SKIP in extra:
            metrics["aux_skip"] = float(extra[AUX_SKIP])

        def train_loss(w_: Params) -> tuple[Tensor, tuple[State, Tensor]]:
            x, y = train_batch
            logits, new_state = model.apply({**w_, **a, **extra}, state, x, train=True)
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
        return groups, {"loss": float(loss), "acc": float(acc), "lr": lr, **metrics}

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
    network = {arg: getattr(cfg, name) for name, arg in NETWORK_FIELDS.items()}
    return search_network(**network, num_classes=data.num_classes,
                          in_channels=int(data.train_x.shape[1]),
                          partial_channels=cfg.partial_channels, primitives=cfg.space,
                          edge_normalization=cfg.edge_normalization, aux_skip=cfg.aux_skip)


__all__ = [
    "NETWORK_FIELDS",
    "SELECTIONS",
    "BatchFn",
    "ImageBatch",
    "SearchConfig",
    "SearchData",
    "Select",
    "build_search_model",
    "check_network_value",
    "epoch_batches",
    "make_search_step",
    "remedy_params",
    "supernet_accuracy",
]
