"""DARTS architecture search as pure functions: candidate ops, mixed ops, cells, the bilevel
step with exact hypergradients, the search step, genotype derivation and the discrete
network, over DARTS' eight ops or a search space of your own (op names and
``(name, factory)`` pairs, :func:`register_op`, :func:`load_space`), and the known remedies
(:mod:`.remedies`, :mod:`.perturbation`, options of :class:`SearchConfig`). The run around a
search (epochs, collapse guard, files) is in :mod:`funcgraph.runs`."""

from typing import TYPE_CHECKING

from .._exports import lazy_exports
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
    AUX_SKIP,
    CellArch,
    arch_weights,
    edge_inputs,
    edge_softmax,
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
from .remedies import (
    aux_skip_coefficient,
    beta_decay,
    beta_decay_gradient,
    beta_decay_weight,
    progress,
)
from .search import (
    SELECTIONS,
    BatchFn,
    ImageBatch,
    SearchConfig,
    SearchData,
    Select,
    build_search_model,
    epoch_batches,
    make_search_step,
    remedy_params,
    supernet_accuracy,
)

if not TYPE_CHECKING:  # type checkers see the names and submodules through the imports
    __getattr__, __dir__ = lazy_exports(__name__, submodules=(
        "bilevel", "cell", "genotype", "mixed", "network", "ops", "perturbation", "remedies",
        "search"))


__all__ = [
    "ARCH_PREFIX",
    "AUX_SKIP",
    "OPS",
    "PRIMITIVES",
    "REGISTERED_OPS",
    "SELECTIONS",
    "BatchFn",
    "BilevelConfig",
    "CellArch",
    "Genotype",
    "ImageBatch",
    "LossFn",
    "OpFactory",
    "Primitive",
    "SearchConfig",
    "SearchData",
    "Select",
    "arch_gradient",
    "arch_weights",
    "aux_skip_coefficient",
    "beta_decay",
    "beta_decay_gradient",
    "beta_decay_weight",
    "build_search_model",
    "channel_shuffle",
    "clip_grad_norm",
    "derive_cell",
    "derive_genotype",
    "discrete_cell",
    "edge_inputs",
    "edge_softmax",
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
    "progress",
    "random_genotype",
    "register_op",
    "remedy_params",
    "search_cell",
    "search_network",
    "select_by_perturbation",
    "supernet_accuracy",
    "unrolled_weights",
    "weighted_sum",
]
