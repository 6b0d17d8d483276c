"""Supervised training and evaluation of any Model with funcgraph's pure optimisers.

:func:`train_step` builds ``step(params, state, opt_state, batch, key) -> (params, state,
opt_state, metrics)``: one ``torch.func.grad`` of the loss, one optimiser update, the model's
returned state kept. :func:`evaluate_batches` averages the loss and its metrics over batches in
evaluation mode. The model's output goes through a ``loss_fn(y, labels) -> (loss, metrics)``;
the default, :func:`classification_loss`, is cross-entropy on logits ``(B, C)`` (or on the
first element of a tuple output, as the early-exit CNN returns).

Stochastic-depth blocks report which of them ran in their returned state; the step adds
their summary (``blocks_ran``, see :func:`funcgraph.nn.ran_metrics`) to the metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError, DataError, ShapeError
from ..model import Model
from ..nn.stochastic_depth import ran_metrics
from ..params import Params, State, detach
from ..precision import check_precision, in_precision
from ..random import Key, randint
from .optim import Optimizer

Batch = tuple[Any, Tensor]
"""``(inputs, labels)``: inputs as the model takes them, labels ``(B,)`` int64."""
OutputLoss = Callable[[Any, Tensor], tuple[Tensor, Mapping[str, Tensor]]]
"""``loss_fn(model output, labels) -> (loss, metrics)``."""
TrainStep = Callable[..., tuple[Params, State, Params, dict[str, float]]]
"""What :func:`train_step` returns: ``step(params, state, opt_state, batch, key, *, lr=None)``."""


def logits_of(y: Any) -> Tensor:
    """The logits of a model output: ``y`` itself, or ``y[0]`` for a tuple output."""
    return y[0] if isinstance(y, tuple) else y


def classification_loss(y: Any, labels: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean cross-entropy of the logits against ``labels``, with ``accuracy`` as a metric."""
    logits = logits_of(y)
    loss = F.cross_entropy(logits, labels)
    accuracy = (logits.argmax(-1) == labels).float().mean()
    return loss, {"accuracy": accuracy}


def train_step(
    model: Model,
    optimizer: Optimizer,
    *,
    loss_fn: OutputLoss = classification_loss,
    sync: Callable[[Params], Params] | None = None,
    precision: str = "float32",
) -> TrainStep:
    """The pure training step of ``model`` under ``optimizer``.

    Returns ``step(params, state, opt_state, batch, key, *, lr=None)`` giving
    ``(params, state, opt_state, metrics)``; ``metrics`` holds ``loss``, the ``loss_fn``'s
    metrics and, for stochastic-depth models, ``blocks_ran``. ``key`` is the only randomness
    (derive it as ``fold_in(root, step)`` so runs resume bit-identically). ``sync``, when
    given, averages the gradients and the floating state (batch-norm running statistics)
    across data-parallel ranks before the update (:func:`funcgraph.distributed.all_reduce_mean`).
    ``precision="bf16"`` computes the forward and backward's convolutions and matmuls in
    bfloat16 (:mod:`funcgraph.precision`); params, gradients, state and the update stay
    float32.

    Example::

        step = train_step(resnet(20), adam(1e-3))
        params, state, opt_state, metrics = step(params, state, opt_state, (x, y), key)
    """

    def loss_of(params: Params, state: State, x: Any, labels: Tensor,
                key: Key) -> tuple[Tensor, tuple[State, Mapping[str, Tensor]]]:
        y, new_state = model.apply(params, state, x, key=key, train=True)
        loss, metrics = loss_fn(y, labels)
        return loss, (new_state, metrics)

    grad_fn = torch.func.grad_and_value(loss_of, has_aux=True)
    check_precision("train_step", precision)

    def step(params: Params, state: State, opt_state: Params, batch: Batch, key: Key, *,
             lr: float | None = None) -> tuple[Params, State, Params, dict[str, float]]:
        x, labels = batch
        device = next(iter(params.values())).device.type if params else "cpu"
        run = in_precision(grad_fn, precision, device)
        grads, (loss, (new_state, metrics)) = run(params, state, x, labels, key)
        if sync is not None:
            grads = sync(grads)
            floating = {n: t for n, t in new_state.items() if t.is_floating_point()}
            new_state = {**new_state, **sync(floating)}
        kwargs = {} if lr is None else {"lr": lr}
        new_params, new_opt = optimizer.update(params, grads, opt_state, **kwargs)
        out = {"loss": float(loss), **{k: float(v) for k, v in metrics.items()}}
        out.update(ran_metrics(new_state))
        return detach(new_params), detach(new_state), detach(new_opt), out

    return step


def class_split(images: Tensor, *, num_classes: int | None = None,
                val_per_class: int = 4) -> tuple[Batch, Batch]:
    """A classification set from a class-indexed image tensor (a ``ClassDataset.images``).

    Arguments:
        images: ``(num_classes, per_class, C, H, W)``.
        num_classes: keep the first this many classes (``None``: all).
        val_per_class: the last this many examples of every class form the validation set.
    Returns:
        ``(train, val)``, each ``(inputs (N, C, H, W), labels (N,))`` with label = class index.
    """
    if images.dim() != 5:
        raise ShapeError(f"class_split: images must be (classes, per_class, C, H, W), "
                         f"got {tuple(images.shape)}")
    total, per_class = int(images.shape[0]), int(images.shape[1])
    keep = total if num_classes is None else num_classes
    if not 2 <= keep <= total:
        raise ConfigError(f"class_split: num_classes must be in [2, {total}], got {keep}")
    if not 1 <= val_per_class < per_class:
        raise ConfigError(
            f"class_split: val_per_class must be in [1, {per_class - 1}], got {val_per_class}"
        )
    images = images[:keep]
    labels = torch.arange(keep).unsqueeze(1).expand(keep, per_class)  # (classes, per_class)
    cut = per_class - val_per_class

    def flat(part: slice) -> Batch:
        return images[:, part].flatten(0, 1), labels[:, part].flatten(0, 1)

    return flat(slice(0, cut)), flat(slice(cut, None))


def sample_batch(key: Key, data: Batch, batch_size: int) -> Batch:
    """``batch_size`` examples of ``data = (inputs, labels)`` drawn uniformly with replacement
    from ``key`` (inputs may be a tensor or a tuple of tensors sharing the leading dim)."""
    labels = data[1]
    idx = randint(key, (batch_size,), 0, int(labels.shape[0])).to(labels.device)
    return take_rows(data[0], idx), labels[idx]


def batches(data: Batch, batch_size: int) -> Iterator[Batch]:
    """``data`` in order, in batches of ``batch_size`` (the last one may be smaller)."""
    n = int(data[1].shape[0])
    for start in range(0, n, batch_size):
        idx = torch.arange(start, min(start + batch_size, n), device=data[1].device)
        yield take_rows(data[0], idx), data[1][idx]


def take_rows(inputs: Any, idx: Tensor) -> Any:
    """Rows ``idx`` of ``inputs``: a tensor, or each tensor of a tuple (tokens and mask)."""
    if isinstance(inputs, tuple):
        return tuple(t[idx] for t in inputs)
    return inputs[idx]


def evaluate_batches(
    model: Model,
    params: Params,
    state: State,
    batches: Iterable[Batch],
    *,
    loss_fn: OutputLoss = classification_loss,
) -> dict[str, float]:
    """Loss and metrics of ``model`` in evaluation mode, averaged over examples of ``batches``.

    Evaluation is deterministic (no key); the state is used, never updated.
    """
    totals: dict[str, float] = {}
    count = 0
    with torch.no_grad():
        for x, labels in batches:
            y, _ = model.apply(params, state, x, train=False)
            loss, metrics = loss_fn(y, labels)
            n = int(labels.shape[0])
            for k, v in {"loss": loss, **metrics}.items():
                totals[k] = totals.get(k, 0.0) + float(v) * n
            count += n
    if count == 0:
        raise DataError("evaluate_batches: no batches to evaluate (an empty validation set?)")
    return {k: v / count for k, v in totals.items()}


def batch_slice(data: Batch, n: int) -> Batch:
    """The first ``n`` examples of ``data``."""
    return take_rows(data[0], torch.arange(min(n, int(data[1].shape[0])),
                                       device=data[1].device)), data[1][:n]


__all__ = [
    "Batch",
    "OutputLoss",
    "TrainStep",
    "batch_slice",
    "batches",
    "class_split",
    "classification_loss",
    "evaluate_batches",
    "logits_of",
    "sample_batch",
    "take_rows",
    "train_step",
]
