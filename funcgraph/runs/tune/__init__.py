"""Settings search: what ``funcgraph tune`` runs, on Optuna.

``run`` starts a study and its workers (the budget, the locks, the lost worker);
``space`` reads and checks a space file; ``study`` opens the Optuna study and reads
its trials; ``identity`` ties a study to its directory and store; ``objective`` runs
one trial as an ordinary meta-train run; ``report`` renders ``tune show`` (the
trials, the front, the best command); ``confirm`` re-runs chosen trials on other
data or seeds. Optuna does the searching; these modules hold what is ours.
"""
