"""The funcgraph version, in a module that imports nothing.

``funcgraph --version`` and ``funcgraph --help`` read it from here, so printing them never
loads torch (the package's core names do, on first use)."""

__version__ = "0.1.0"
