"""Prototypical networks (Snell et al., 2017) as a :class:`~funcgraph.meta.learner.MetaLearner`.

``embed(params, x)`` maps images to vectors (conv4 with ``ways=None``). A class prototype is
the mean embedding of its support examples; a query's logits are the negative squared
Euclidean distances to the prototypes, trained with cross-entropy. No inner loop: adaptation
is computing the prototypes. With task keys, the support embedding uses the key of support
step 0 and the query embedding the query key (see :mod:`funcgraph.meta.learner`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_int
from ..errors import ConfigError
from ..model import BoundApply
from ..params import Params
from ..random import Key
from .adapted import AdaptThenScore, Predict
from .binding import ModelLike
from .learner import (
    MetaLearner,
    Task,
    accuracy,
    call,
    check_apply,
    objective,
    query_key,
    support_keys,
    task_grad_of,
)
from .registry import TaskInfo
from .settings import ProtonetSettings


def prototypes(support: Tensor, labels: Tensor, ways: int) -> Tensor:
    """Per-class mean of ``support (S, D)`` for ``labels (S,)`` in ``[0, ways)``: ``(ways, D)``."""
    # A comparison, not F.one_hot: one_hot checks its labels' range, which vmap cannot run.
    onehot = (labels.unsqueeze(1) == torch.arange(ways, device=labels.device)).to(
        support.dtype)  # (S, ways)
    return (onehot.T @ support) / onehot.sum(0).unsqueeze(1)


def squared_distances(queries: Tensor, protos: Tensor) -> Tensor:
    """``|q_i - p_j|^2`` for ``queries (Q, D)`` and ``protos (N, D)``: ``(Q, N)``."""
    return (queries.unsqueeze(1) - protos.unsqueeze(0)).pow(2).sum(-1)


def protonet_logits(embed: BoundApply, params: Params, task: Task, ways: int) -> Tensor:
    """``(N*Q, ways)`` logits: minus squared distances of query embeddings to prototypes."""
    (support_key,) = support_keys(task.key, 1)
    protos = prototypes(call(embed, params, task.support_x, support_key), task.support_y, ways)
    return -squared_distances(call(embed, params, task.query_x, query_key(task.key)), protos)


def protonet(embed: ModelLike, *, ways: int) -> MetaLearner:
    """Prototypical networks over ``embed(params, x) -> (B, D)`` for ``ways``-way tasks (tasks
    with keys need ``embed`` to take ``key=``); ``embed`` may be a Model or ``nn.Module``,
    bound for training by the learner (:mod:`funcgraph.meta.binding`).

    Raises:
        ConfigError: ``ways`` is not an int >= 2.
    """
    check_int("protonet", "ways", ways, minimum=2)
    embed, uses_keys, model = check_apply(embed, "protonet")
    obj = objective("classification")

    def loss_fn(params: Params, task: Task) -> tuple[Tensor, Tensor]:
        logits = protonet_logits(embed, params, task, ways)
        return F.cross_entropy(logits, task.query_y), accuracy(logits, task.query_y)

    task_grad = task_grad_of(loss_fn)

    def eval_adapt(params: Params, x: Tensor, y: Tensor, key: Key | None) -> Predict:
        (support_key,) = support_keys(key, 1)
        protos = prototypes(call(embed, params, x, support_key), y, ways)
        qkey = query_key(key)
        return lambda q: -squared_distances(call(embed, params, q, qkey), protos)

    return MetaLearner("protonet", dict, task_grad, AdaptThenScore(eval_adapt, obj), obj,
                       ProtonetSettings(), uses_keys=uses_keys, model=model)


def build_protonet(embed: BoundApply, settings: ProtonetSettings, info: TaskInfo
                   ) -> MetaLearner:
    """The registry's builder: :func:`protonet` for ``info``'s ways."""
    if info.kind != "classification" or info.ways is None:
        raise ConfigError("--algo protonet needs a classification dataset (glyphs, omniglot)")
    return protonet(embed, ways=info.ways)


__all__ = ["build_protonet", "prototypes", "protonet", "protonet_logits", "squared_distances"]
