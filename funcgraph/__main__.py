"""``python -m funcgraph`` runs the CLI (what ``torchrun -m funcgraph`` needs)."""

from .cli import main

main()
