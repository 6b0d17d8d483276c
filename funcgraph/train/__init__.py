"""Training machinery shared by every command: optimisers, checkpoints."""

from .checkpoint import checkpoint_exists, load_checkpoint, save_checkpoint
from .optim import Optimizer, adam, cosine_lr, sgd

__all__ = [
    "Optimizer",
    "adam",
    "checkpoint_exists",
    "cosine_lr",
    "load_checkpoint",
    "save_checkpoint",
    "sgd",
]
