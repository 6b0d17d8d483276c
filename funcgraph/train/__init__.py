"""Training machinery shared by every command: optimisers, checkpoints, run dirs, the loop."""

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from .checkpoint import checkpoint_exists, load_checkpoint, save_checkpoint
from .divergence import DIVERGENCE_BOUND, check_diverged
from .loop import Groups, LoopConfig, StepFn, run_loop
from .optim import Optimizer, adam, cosine_lr, sgd
from .run_dir import Run

__all__ = [
    "DIVERGENCE_BOUND",
    "check_diverged",
    "Groups",
    "LoopConfig",
    "Optimizer",
    "Run",
    "StepFn",
    "adam",
    "checkpoint_exists",
    "cosine_lr",
    "load_checkpoint",
    "run_loop",
    "save_checkpoint",
    "sgd",
]


_MODULES = ("checkpoint", "divergence", "events", "loop", "optim", "ownership", "run_dir",
            "supervised")
"""The submodules the docs cite: with ``__all__``, all that ``dir()`` lists."""


def __dir__() -> list[str]:
    """The public names and the documented submodules; nothing else."""
    return sorted({*__all__, *_MODULES})


if not TYPE_CHECKING:  # type checkers see the submodules through their imports

    def __getattr__(name: str) -> ModuleType:
        """A documented submodule this package does not import itself, on first use:
        ``supervised``."""
        if name in _MODULES:
            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
