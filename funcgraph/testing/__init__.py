"""Test helpers for funcgraph models and for any pure function over parameter dicts.

Assertions (torch only)::

    from funcgraph.testing import assert_pure, assert_vmap_matches_loop

Hypothesis strategies (need ``hypothesis``, the ``test`` extra)::

    from funcgraph.testing import strategies as fst

The pytest fixtures (``key``, ``keys``) come from :mod:`funcgraph.testing.plugin`, which
pytest loads automatically once funcgraph is installed. See ``docs/testing.md``.
"""

from typing import TYPE_CHECKING

from .._exports import lazy_exports
from .assertions import (
    assert_grad_matches_finite_differences,
    assert_pure,
    assert_vmap_matches_loop,
)
from .branches import BranchRecord, assert_branches_covered, record_branches
from .module_match import assert_matches_module

if not TYPE_CHECKING:  # type checkers see the names and submodules through the imports
    __getattr__, __dir__ = lazy_exports(__name__, submodules=(
        "assertions", "branches", "module_match", "plugin", "strategies"))


__all__ = [
    "BranchRecord",
    "assert_branches_covered",
    "assert_grad_matches_finite_differences",
    "assert_matches_module",
    "assert_pure",
    "assert_vmap_matches_loop",
    "record_branches",
]
