"""The schedules and the regulariser of the DARTS remedies that the search step applies.

Each remedy is an option of :class:`~funcgraph.nas.SearchConfig`, off by default (docs/darts.md,
"Remedies"). What lives here is what the step computes from its index, so a resumed search
computes the same:

- **Beta-Decay** (Ye et al., "beta-DARTS", CVPR 2022): :func:`beta_decay`, the mean over the
  edges of both cells of ``logsumexp(alpha_edge)``, added to the architecture objective with the
  weight :func:`beta_decay_weight`.
- **Auxiliary skip** (Chu et al., "DARTS-", ICLR 2021): the coefficient
  :func:`aux_skip_coefficient` of the skip every stride-1 edge gets.

Edge normalisation is in the cell (:func:`~funcgraph.nas.search_network`), the warm-up in the
step (:func:`~funcgraph.nas.make_search_step`), the stability stop in the run
(:func:`funcgraph.runs.run_search`), selection by perturbation in :mod:`.perturbation`.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.func import grad

from ..params import Params
from .cell import ARCH_PREFIX, KINDS


def progress(step: int, total: int) -> float:
    """``step / (total - 1)``: 0 at the first step, 1 at the last (0 throughout a search of
    one step)."""
    return step / (total - 1) if total > 1 else 0.0


def beta_decay_weight(lam: float, step: int, total: int) -> float:
    """The Beta-Decay weight at ``step`` of ``total``: ``lam * progress``, rising linearly from 0
    at the first step to ``lam`` at the last. The authors' code raises it per epoch (``0.5 *
    epoch``, 24.5 at the last of 50 epochs, in ``optimizers/darts/architect.py``); here it rises
    per step and ``lam`` is its final value."""
    return lam * progress(step, total)


def aux_skip_coefficient(step: int, total: int) -> float:
    """DARTS-' auxiliary skip coefficient at ``step`` of ``total``: ``1 - progress``, decaying
    linearly from 1 at the first step to 0 at the last, so the searched supernet ends without
    it (the authors' code decays it per epoch; here per step)."""
    return 1.0 - progress(step, total)


def beta_decay(arch: Params) -> Tensor:
    """The Beta-Decay regulariser of the architecture logits ``arch`` (``arch.normal`` and
    ``arch.reduce``; edge logits are not regularised): the mean over the rows of both of
    ``logsumexp(alpha_row)``. Its gradient in a row is ``softmax(alpha_row) / rows``, ``rows``
    the number of rows of both cells."""
    return torch.cat([torch.logsumexp(arch[f"{ARCH_PREFIX}.{kind}"], dim=-1)
                      for kind in KINDS]).mean()


def beta_decay_gradient(arch: Params, weight: float) -> Params:
    """``weight * d beta_decay / d arch``, one entry per entry of ``arch`` (zero where the
    regulariser does not reach). It depends on the architecture alone, so it is the same term
    in the first- and in the second-order objective."""
    return {n: weight * g for n, g in grad(beta_decay)(arch).items()}


__all__ = ["aux_skip_coefficient", "beta_decay", "beta_decay_gradient", "beta_decay_weight",
           "progress"]
