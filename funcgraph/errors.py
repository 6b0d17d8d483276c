"""The one family of user-facing errors.

Every mistake a user can make (a bad config, a bad task spec, a corrupt checkpoint, a wrong
shape, a missing key) raises a subclass of :class:`FuncgraphError`. The CLI catches exactly
this family and prints it in one line with exit code 2; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations


class FuncgraphError(Exception):
    """Base of every error funcgraph raises for a user mistake."""


class ConfigError(FuncgraphError, ValueError):
    """A configuration is invalid: a model's or layer's hyperparameter, a function's option, a
    run or CLI setting. The message names the config path, or the function and argument."""


class ArgumentTypeError(FuncgraphError, TypeError):
    """An argument is the wrong kind of object (a list where a Tensor or a Model belongs); a
    TypeError too, as Python's own for that mistake. A bad hyperparameter, of whatever type
    (``hidden="abc"``), is a ConfigError."""


class ShapeError(FuncgraphError, ValueError):
    """A tensor has a shape the function cannot accept; the message shows both shapes."""


class KeyMissingError(FuncgraphError, ValueError):
    """A function that needs randomness was called without a ``key``."""


class TaskSpecError(FuncgraphError, ValueError):
    """A task specification such as ``5way1shot`` could not be parsed or is impossible."""


class DataError(FuncgraphError, ValueError):
    """A dataset root or file is missing or malformed; the message names the path."""


class CheckpointError(FuncgraphError, ValueError):
    """A checkpoint is missing, corrupt or does not match the model it is loaded into."""


class DeviceError(FuncgraphError, ValueError):
    """A device string or placement plan is invalid or names a device that is absent."""


class ExportError(FuncgraphError, RuntimeError):
    """A model could not be exported, or an exported artifact got an input it cannot take."""


class TransformError(FuncgraphError, RuntimeError):
    """Model code does what a ``torch.func`` transform cannot run, such as a Python ``if`` on a
    tensor under ``vmap``; the first line names the funcgraph way, torch's message follows. A
    RuntimeError too, as torch's own error was."""


class DistributedError(FuncgraphError, RuntimeError):
    """A distributed run failed: a rank died, diverged or timed out."""


class RunDirectoryError(FuncgraphError, RuntimeError):
    """A run directory cannot be used: another process holds it, it holds unrelated files, it
    is a file, or it cannot be created; the message names the directory and the holder."""


class DivergedError(FuncgraphError, RuntimeError):
    """Training produced a non-finite loss; the message names the step and the checkpoint
    that was kept."""


class KeyTypeError(FuncgraphError, TypeError):
    """A ``key`` argument is not a funcgraph key (an ``int64`` tensor of shape ``(2,)``, made
    by ``funcgraph.random.key(seed)``): an int, a float tensor, a wrong shape. The message
    names the public function called and how to make a key."""


__all__ = [
    "ArgumentTypeError",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "DeviceError",
    "DistributedError",
    "DivergedError",
    "ExportError",
    "FuncgraphError",
    "KeyMissingError",
    "KeyTypeError",
    "RunDirectoryError",
    "ShapeError",
    "TaskSpecError",
    "TransformError",
]
