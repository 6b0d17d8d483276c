"""Settings search: what ``funcgraph tune`` runs, on Optuna.

``run`` starts a study and its workers (the budget, the locks, the lost worker);
``space`` reads and checks a space file; ``study`` opens the Optuna study and reads
its trials; ``identity`` ties a study to its directory and store; ``objective`` runs
one trial as an ordinary meta-train run; ``report`` renders ``tune show`` (the
trials, the front, the best command); ``confirm`` re-runs chosen trials on other
data or seeds. Optuna does the searching; these modules hold what is ours.
"""

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

__all__: list[str] = []
_MODULES = ("confirm", "identity", "objective", "report", "run", "space", "study")
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
