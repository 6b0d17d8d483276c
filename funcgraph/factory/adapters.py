"""Config-facing constructors for library pieces whose Python signature takes objects a config
cannot write (a :class:`~funcgraph.nn.stochastic_depth.Warmup`), imported lazily by the
registry so a missing module never breaks ``import funcgraph.factory``."""

from __future__ import annotations

from typing import Literal

from ..model import Model
from ..nn.stochastic_depth import Warmup, stochastic_depth


def stochastic_depth_block(
    body: Model,
    drop_prob: float,
    shortcut: Model | None = None,
    post: Model | None = None,
    mode: Literal["batch", "row"] = "batch",
    warmup_steps: int | None = None,
    warmup_start_scale: float = 0.0,
) -> Model:
    """A residual block whose body is skipped with ``drop_prob`` in training (stochastic depth);
    params ``body.*``, ``shortcut.*``, ``post.*``; ``warmup_steps`` ramps the drop probability."""
    warmup = Warmup(warmup_steps, warmup_start_scale) if warmup_steps else None
    return stochastic_depth(body, drop_prob, shortcut=shortcut, post=post, mode=mode,
                            warmup=warmup)


__all__ = ["stochastic_depth_block"]
