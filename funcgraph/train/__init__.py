"""Training machinery shared by every command: optimisers, checkpoints, run dirs, the loop."""

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
