"""Settings search: what ``funcgraph tune`` runs, on Optuna.

``run`` starts a study and its workers (the budget, the locks, the lost worker);
``space`` reads and checks a space file; ``study`` opens the Optuna study and reads
its trials; ``identity`` ties a study to its directory and store; ``objective`` runs
one trial as an ordinary meta-train run; ``report`` renders ``tune show`` (the
trials, the front, the best command); ``confirm`` re-runs chosen trials on other
data or seeds. Optuna does the searching; these modules hold what is ours.
"""

from typing import TYPE_CHECKING

from ..._exports import lazy_exports

__all__: list[str] = []


if not TYPE_CHECKING:  # type checkers see the names and submodules through the imports
    __getattr__, __dir__ = lazy_exports(__name__, __all__, submodules=(
        "confirm", "identity", "objective", "report", "run", "space", "study"))
