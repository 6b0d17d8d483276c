"""CLI commands, one module per command (or command group); :mod:`funcgraph.cli` mounts them.

Each module defines ``register(app: typer.Typer) -> None``. Commands stay thin: parse, build
a frozen config, call the library, render progress and results. Heavy imports (torch) go
inside the command function so ``funcgraph --help`` imports no torch (the rule and how registry
choices keep to it: :mod:`funcgraph.commands.common`).
"""
