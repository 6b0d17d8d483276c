"""Training machinery shared by every command: optimisers, checkpoints, run dirs, the loop."""

from typing import TYPE_CHECKING

from .._exports import lazy_exports
from .checkpoint import checkpoint_exists, load_checkpoint, save_checkpoint
from .divergence import DIVERGENCE_BOUND, check_diverged
from .loop import Groups, LoopConfig, StepFn, run_loop
from .optim import Optimizer, adam, cosine_lr, sgd
from .run_dir import Run

if not TYPE_CHECKING:  # type checkers see the names and submodules through the imports
    __getattr__, __dir__ = lazy_exports(__name__, submodules=(
        "checkpoint", "divergence", "events", "loop", "optim", "ownership", "run_dir",
        "supervised"))


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
