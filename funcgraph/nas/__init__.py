"""DARTS architecture search as pure functions: candidate ops, mixed ops, cells, the bilevel
step with exact hypergradients, genotype derivation and the discrete network."""

from .bilevel import (
    BilevelConfig,
    LossFn,
    arch_gradient,
    clip_grad_norm,
    first_order_gradient,
    hypergradient,
    unrolled_weights,
)
from .cell import (
    ARCH_PREFIX,
    arch_weights,
    edge_inputs,
    is_arch,
    layout,
    num_edges,
    search_cell,
    search_network,
)
from .genotype import Genotype, derive_cell, derive_genotype, random_genotype
from .mixed import channel_shuffle, mixed_op, weighted_sum
from .network import discrete_cell, network_from_genotype
from .ops import OPS, PRIMITIVES, factorized_reduce, make_op
from .search import SearchConfig, SearchData, SearchResult, accuracy, glyph_halves, run_search

__all__ = [
    "ARCH_PREFIX",
    "OPS",
    "PRIMITIVES",
    "BilevelConfig",
    "Genotype",
    "LossFn",
    "SearchConfig",
    "SearchData",
    "SearchResult",
    "accuracy",
    "arch_gradient",
    "arch_weights",
    "channel_shuffle",
    "clip_grad_norm",
    "derive_cell",
    "derive_genotype",
    "discrete_cell",
    "edge_inputs",
    "factorized_reduce",
    "first_order_gradient",
    "glyph_halves",
    "hypergradient",
    "is_arch",
    "layout",
    "make_op",
    "mixed_op",
    "network_from_genotype",
    "num_edges",
    "random_genotype",
    "run_search",
    "search_cell",
    "search_network",
    "unrolled_weights",
    "weighted_sum",
]
