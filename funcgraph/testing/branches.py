"""Branch coverage for data-dependent control flow: which way did each decision go?

A dynamic model decides with tensor values: ``if x.sum() > 0:``, an early exit when the
confidence is high enough, ``funcgraph.cond(pred, ...)``. In eager mode every such decision
turns a one-element tensor into a Python bool (``Tensor.__bool__``). :func:`record_branches`
watches those conversions with a ``TorchFunctionMode`` and files each outcome under its
*decision site*, the ``file:line`` of the code that branched (frames inside torch, the
implementation of ``funcgraph.cond`` and this package are skipped, so a ``cond`` call is
filed under the line that called it). :func:`assert_branches_covered` runs a function over
inputs and fails when some site only ever went one way.

Not observed: ``torch.cond`` in eager mode (torch compiles it; nothing reaches Python), a
decision taken on ``x.item()`` (a Python number, not a tensor), a ``cond`` under ``vmap``
with a batched predicate (both branches run), and per-sample decisions made with masks or
gathers (report those through ``decisions=``). Use ``funcgraph.cond`` and test eagerly.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode


def _plumbing_paths() -> tuple[str, ...]:
    """Files whose frames are skipped when locating a decision site."""
    paths = [os.path.dirname(torch.__file__) + os.sep, os.path.dirname(__file__) + os.sep]
    try:
        paths.append(str(importlib.import_module("funcgraph.control").__file__))
    except ImportError:  # funcgraph.control is optional for this module
        pass
    return tuple(paths)


@dataclass
class BranchRecord:
    """Outcomes per decision site: ``taken[site][outcome]`` lists the input indices.

    ``site`` reads ``"path/to/file.py:12 in forward"``; ``outcome`` is ``True``/``False``.
    ``input_index`` is the index of the input being run (set by
    :func:`assert_branches_covered`; ``-1`` outside it).
    """

    taken: dict[str, dict[bool, list[int]]] = field(default_factory=dict)
    input_index: int = -1

    def add(self, site: str, outcome: bool) -> None:
        per_site = self.taken.setdefault(site, {})
        indices = per_site.setdefault(outcome, [])
        if not indices or indices[-1] != self.input_index:
            indices.append(self.input_index)

    def one_sided(self) -> dict[str, bool]:
        """Sites that only went one way, with the only outcome seen."""
        return {s: next(iter(o)) for s, o in self.taken.items() if len(o) == 1}


class _Recorder(TorchFunctionMode):
    def __init__(self, record: BranchRecord, skip: tuple[str, ...]) -> None:
        super().__init__()
        self.record = record
        self.skip = skip

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.__bool__ and not torch.compiler.is_compiling():
            self.record.add(self._site(sys._getframe(1)), bool(out))
        return out

    def _site(self, frame: FrameType | None) -> str:
        while frame is not None and frame.f_code.co_filename.startswith(self.skip):
            frame = frame.f_back
        if frame is None:
            return "<unknown>"
        return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


@contextmanager
def record_branches() -> Iterator[BranchRecord]:
    """Record every eager data-dependent decision made inside the ``with`` block.

    Example::

        with record_branches() as record:
            model.apply(params, state, x)
        print(record.taken)  # {"model.py:40 in forward": {True: [-1]}}
    """
    record = BranchRecord()
    with _Recorder(record, _plumbing_paths()):
        yield record


def assert_branches_covered(
    fn: Callable[[Any], Any],
    inputs: Iterable[Any],
    *,
    decisions: Callable[[Any], Mapping[str, Tensor | bool]] | None = None,
    sites: Callable[[str], bool] | None = None,
) -> BranchRecord:
    """Run ``fn(x)`` for each input and check every decision went both ways.

    Decisions come from two sources: every line that branched on a tensor value (observed,
    see the module docstring), and, when given, ``decisions(fn(x))``: a dict from a name to a
    bool or a bool tensor whose every element is one decision. The second form covers models
    that decide per sample without a Python branch, such as an early-exit model that gathers
    the continuing samples (``decisions=lambda y: {"exit": y.exited}``). The check fails when
    no decision was seen at all, or when some site saw only ``True`` or only ``False`` over
    all inputs: that branch is untested. ``sites``, a predicate on the site string, limits
    the check to the sites it accepts (for example, to leave out an input-validation
    ``if (x < 0).any(): raise`` that should never fire). Pass several arguments through a
    lambda: ``assert_branches_covered(lambda x: f(params, x), xs)``.

    Returns the :class:`BranchRecord`, whose ``taken[site][outcome]`` lists the indices of
    the inputs that went each way, for checking behaviour per branch.

    Example::

        record = assert_branches_covered(double_or_halve, [torch.ones(3), -torch.ones(3)])
    """
    items = list(inputs)
    with record_branches() as record:
        for i, x in enumerate(items):
            record.input_index = i
            y = fn(x)
            for name, taken in ({} if decisions is None else decisions(y)).items():
                values = taken.flatten().tolist() if isinstance(taken, Tensor) else [taken]
                for outcome in {bool(v) for v in values}:
                    record.add(name, outcome)
        record.input_index = -1
    if not record.taken:
        raise AssertionError(
            f"assert_branches_covered: fn made no data-dependent decision over {len(items)} "
            "inputs. Decisions are seen when a tensor becomes a Python bool (funcgraph.cond, "
            "`if x.sum() > 0:`) or through decisions=; torch.cond in eager mode is compiled "
            "and cannot be seen."
        )
    missing = [
        f"{site}: only {outcome} was taken over {len(items)} inputs; "
        f"the {not outcome} branch never ran"
        for site, outcome in record.one_sided().items()
        if sites is None or sites(site)
    ]
    if missing:
        raise AssertionError(
            "assert_branches_covered: " + "\n  ".join(missing)
            + "\nAdd inputs that take the missing branch (or check the predicate)."
        )
    return record


__all__ = ["BranchRecord", "assert_branches_covered", "record_branches"]
