"""Test helpers for funcgraph models and for any pure function over parameter dicts.

Assertions (torch only)::

    from funcgraph.testing import assert_pure, assert_vmap_matches_loop

Hypothesis strategies (need ``hypothesis``, the ``test`` extra)::

    from funcgraph.testing import strategies as fst

The pytest fixtures (``key``, ``keys``) come from :mod:`funcgraph.testing.plugin`, which
pytest loads automatically once funcgraph is installed. See ``docs/testing.md``.
"""

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from .assertions import (
    assert_grad_matches_finite_differences,
    assert_pure,
    assert_vmap_matches_loop,
)
from .branches import BranchRecord, assert_branches_covered, record_branches
from .module_match import assert_matches_module

__all__ = [
    "BranchRecord",
    "assert_branches_covered",
    "assert_grad_matches_finite_differences",
    "assert_matches_module",
    "assert_pure",
    "assert_vmap_matches_loop",
    "record_branches",
]


_MODULES = ("assertions", "branches", "module_match", "plugin", "strategies")
"""The submodules the docs cite: with ``__all__``, all that ``dir()`` lists."""


def __dir__() -> list[str]:
    """The public names and the documented submodules; nothing else."""
    return sorted({*__all__, *_MODULES})


if not TYPE_CHECKING:  # type checkers see the submodules through their imports

    def __getattr__(name: str) -> ModuleType:
        """A documented submodule this package does not import itself, on first use:
        ``plugin``, ``strategies``."""
        if name in _MODULES:
            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
