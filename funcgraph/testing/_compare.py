"""Leaf-by-leaf comparison of nested outputs, shared by the assertion helpers.

Every helper reports *where* two results differ (``output[1]['weight'][0, 2]``) and by how
much, so a failing test says what broke without a debugger.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

import torch
import torch.utils._pytree as pytree
from torch import Tensor


def leaves_with_paths(tree: Any) -> list[tuple[str, Any]]:
    """``[(path, leaf)]`` with paths written like Python indexing: ``[0]['weight']``."""
    flat, _ = pytree.tree_flatten_with_path(tree)
    return [(pytree.keystr(path), leaf) for path, leaf in flat]


def same_values(a: Tensor, b: Tensor) -> bool:
    """Bitwise-equal values (NaN equals NaN), same shape and dtype."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


def index_of(flat_index: int, shape: torch.Size) -> str:
    """``"[i, j]"`` for a flat index into a tensor of ``shape`` (``""`` for a scalar)."""
    if not shape:
        return ""
    idx = []
    for size in reversed(shape):
        idx.append(flat_index % size)
        flat_index //= size
    return "[" + ", ".join(str(i) for i in reversed(idx)) + "]"


def describe_difference(got: Tensor, expected: Tensor, *, rtol: float, atol: float) -> str | None:
    """``None`` when close, else a one-line account of the worst element."""
    if got.shape != expected.shape:
        return f"shape {tuple(got.shape)} != expected {tuple(expected.shape)}"
    if got.numel() == 0:
        return None
    g = got.detach().to(torch.float64).cpu() if got.is_floating_point() else got.detach().cpu()
    e = expected.detach().to(g.dtype).cpu()
    if not g.is_floating_point():
        bad = g != e
        if not bool(bad.any()):
            return None
        i = int(bad.flatten().nonzero()[0])
        return f"at {index_of(i, got.shape) or 'the scalar'}: {g.flatten()[i]} != {e.flatten()[i]}"
    err = (g - e).abs()
    both_nan = torch.isnan(g) & torch.isnan(e)
    over = (err - (atol + rtol * e.abs())).masked_fill(both_nan, float("-inf"))
    over = torch.nan_to_num(over, nan=float("inf"))
    worst = int(over.flatten().argmax())
    if float(over.flatten()[worst]) <= 0:
        return None
    n_bad = int((over > 0).sum())
    return (
        f"{n_bad} of {got.numel()} elements differ; worst at "
        f"{index_of(worst, got.shape) or 'the scalar'}: got {float(g.flatten()[worst]):.6g}, "
        f"expected {float(e.flatten()[worst]):.6g} (abs err {float(err.flatten()[worst]):.3g}, "
        f"allowed {atol:g} + {rtol:g}*|expected|)"
    )


def compare_trees(got: Any, expected: Any, *, rtol: float, atol: float) -> list[str]:
    """Messages for every leaf where ``got`` and ``expected`` differ (empty when they agree)."""
    got_leaves = leaves_with_paths(got)
    exp_leaves = leaves_with_paths(expected)
    got_paths = [p for p, _ in got_leaves]
    exp_paths = [p for p, _ in exp_leaves]
    if got_paths != exp_paths:
        return [f"structure differs: got leaves {got_paths}, expected {exp_paths}"]
    problems = []
    for (path, g), (_, e) in zip(got_leaves, exp_leaves, strict=True):
        name = f"output{path}"
        if isinstance(g, Tensor) and isinstance(e, Tensor):
            msg = describe_difference(g, e, rtol=rtol, atol=atol)
            if msg is not None:
                problems.append(f"{name}: {msg}")
        elif isinstance(g, Tensor) != isinstance(e, Tensor) or g != e:
            problems.append(f"{name}: {g!r} != expected {e!r}")
    return problems


def fail(helper: str, problems: Sequence[str], hint: str = "") -> NoReturn:
    """Raise the AssertionError a helper reports: its name, the first problems, a hint."""
    shown = "\n  ".join(problems[:8])
    more = f"\n  ... and {len(problems) - 8} more" if len(problems) > 8 else ""
    raise AssertionError(f"{helper}: {shown}{more}" + (f"\n{hint}" if hint else ""))
