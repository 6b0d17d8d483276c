"""DARTS architecture search as pure functions: candidate ops, mixed ops, cells, the bilevel
step with exact hypergradients, the search step, genotype derivation and the discrete
network, over DARTS' eight ops or a search space of your own (op names and
``(name, factory)`` pairs, :func:`register_op`, :func:`load_space`). The run around a search
(epochs, collapse guard, files) is in :mod:`funcgraph.runs`."""

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
from .ops import (
    OPS,
    PRIMITIVES,
    REGISTERED_OPS,
    OpFactory,
    Primitive,
    factorized_reduce,
    known_ops,
    load_space,
    make_op,
    primitive_names,
    register_op,
)
from .perturbation import perturbation_genotype, select_by_perturbation
from .search import (
    BatchFn,
    ImageBatch,
    SearchConfig,
    SearchData,
    build_search_model,
    epoch_batches,
    make_search_step,
    supernet_accuracy,
)

__all__ = [
    "ARCH_PREFIX",
    "OPS",
    "PRIMITIVES",
    "REGISTERED_OPS",
    "BatchFn",
    "BilevelConfig",
    "Genotype",
    "ImageBatch",
    "LossFn",
    "OpFactory",
    "Primitive",
    "SearchConfig",
    "SearchData",
    "arch_gradient",
    "arch_weights",
    "build_search_model",
    "channel_shuffle",
    "clip_grad_norm",
    "derive_cell",
    "derive_genotype",
    "discrete_cell",
    "edge_inputs",
    "epoch_batches",
    "factorized_reduce",
    "first_order_gradient",
    "hypergradient",
    "is_arch",
    "known_ops",
    "layout",
    "load_space",
    "make_search_step",
    "make_op",
    "mixed_op",
    "network_from_genotype",
    "num_edges",
    "perturbation_genotype",
    "primitive_names",
    "random_genotype",
    "register_op",
    "search_cell",
    "search_network",
    "select_by_perturbation",
    "supernet_accuracy",
    "unrolled_weights",
    "weighted_sum",
]
