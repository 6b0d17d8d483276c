"""Config-facing constructors for library pieces whose Python signature takes objects a config
cannot write (a :class:`~funcgraph.nn.stochastic_depth.Warmup`, a DARTS ``Genotype``). The
registry names them lazily, and each imports its module when called, so a missing module
never breaks ``import funcgraph.factory``."""

from __future__ import annotations

from typing import Any, Literal

from ..model import Model


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
    from ..nn.stochastic_depth import Warmup, stochastic_depth

    warmup = Warmup(warmup_steps, warmup_start_scale) if warmup_steps else None
    return stochastic_depth(body, drop_prob, shortcut=shortcut, post=post, mode=mode,
                            warmup=warmup)


def darts_network(
    genotype: dict[str, Any],
    C: int,  # noqa: N803 - DARTS' name for the initial cell width, as network_from_genotype
    layers: int,
    num_classes: int,
    in_channels: int = 1,
    stem_multiplier: int = 3,
    drop_path_prob: float = 0.0,
) -> Model:
    """The discrete DARTS network of a genotype written inline in the config (the JSON form of
    :class:`~funcgraph.nas.Genotype`: ``{"normal": [[op, input], ...], "normal_concat": ...}``)."""
    from ..nas import Genotype, network_from_genotype

    return network_from_genotype(Genotype.from_dict(genotype), C=C, layers=layers,
                                 num_classes=num_classes, in_channels=in_channels,
                                 stem_multiplier=stem_multiplier, drop_path_prob=drop_path_prob)


__all__ = ["darts_network", "stochastic_depth_block"]
