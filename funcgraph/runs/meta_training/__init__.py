"""Meta-training: what ``funcgraph meta-train`` runs.

``config`` is the frozen run config (every default and check, what the run
records); ``plan`` resolves it against the machine (model, strategy, memory, the
evaluation bound, what one step will cost); ``loop`` runs it (validation,
checkpoints, resume, the held-out test); ``compile_note`` reports whether the
meta-step compiled and what that took. Side by side, so that a run's settings can
be followed from the command to the step within one room.
"""

from typing import TYPE_CHECKING

from ..._exports import lazy_exports

__all__: list[str] = []


if not TYPE_CHECKING:  # type checkers see the names and submodules through the imports
    __getattr__, __dir__ = lazy_exports(__name__, __all__, submodules=(
        "compile_note", "config", "loop", "plan"))
