"""Counting the calls of one torch function while code runs.

A path that a model takes only under some condition (a fused kernel for wide layers, a
fallback outside transforms) shows itself by the functions it calls: ``count_calls``
counts them through a :class:`torch.overrides.TorchFunctionMode`, so nothing in the model
changes to be observed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.overrides import TorchFunctionMode


class count_calls(TorchFunctionMode):  # noqa: N801 - used as a function, in ``with``
    """Count the calls of ``func`` (a ``torch`` or ``torch.nn.functional`` function) made
    inside the ``with`` block; the count is ``.count``.

    Example::

        with count_calls(torch.nn.functional.unfold) as unfolds:
            model.apply(params, state, x)
        assert unfolds.count == 1
    """

    def __init__(self, func: Callable[..., Any]) -> None:
        super().__init__()
        self.func = func
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func is self.func
        return func(*args, **(kwargs or {}))


__all__ = ["count_calls"]
