"""Meta-training: what ``funcgraph meta-train`` runs.

``config`` is the frozen run config (every default and check, what the run
records); ``plan`` resolves it against the machine (model, strategy, memory, the
evaluation bound, what one step will cost); ``loop`` runs it (validation,
checkpoints, resume, the held-out test); ``compile_note`` reports whether the
meta-step compiled and what that took. Side by side, so that a run's settings can
be followed from the command to the step within one room.
"""

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

__all__: list[str] = []
_MODULES = ("compile_note", "config", "loop", "plan")
"""The submodules, each loaded on first use: all that ``dir()`` lists."""


def __dir__() -> list[str]:
    """The submodules; nothing else."""
    return sorted(_MODULES)


if not TYPE_CHECKING:  # type checkers see the submodules through their imports

    def __getattr__(name: str) -> ModuleType:
        """A submodule, imported on first use."""
        if name in _MODULES:
            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
