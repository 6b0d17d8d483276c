"""Helpers over flat parameter dicts.

A ``Params`` (and a ``State``) is a ``dict[str, Tensor]`` whose dotted names are exactly the
``nn.Module.state_dict()`` names of the equivalent module (``"block1.conv.weight"``). Every
helper returns a new dict; none mutates its argument.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeAlias

import torch
from torch import Tensor

from .errors import ConfigError, ShapeError

Params: TypeAlias = dict[str, Tensor]
State: TypeAlias = dict[str, Tensor]


def tree_map(fn: Callable[[Tensor], Tensor], params: Mapping[str, Tensor]) -> Params:
    """Apply ``fn`` to every tensor: ``{name: fn(t)}``."""
    return {name: fn(t) for name, t in params.items()}


def zip_map(
    fn: Callable[..., Tensor], first: Mapping[str, Tensor], *rest: Mapping[str, Tensor]
) -> Params:
    """Apply ``fn`` name by name over several dicts with the same names.

    Example: an SGD step is ``zip_map(lambda p, g: p - lr * g, params, grads)``.
    Raises ConfigError naming the differing names when the dicts differ.
    """
    names = list(first)
    for i, other in enumerate(rest, start=1):
        if set(other) != set(names):
            missing = sorted(set(names) - set(other))
            extra = sorted(set(other) - set(names))
            raise ConfigError(
                f"zip_map: every dict needs the names of the first; dict {i} has missing "
                f"{missing}, extra {extra}"
            )
    return {n: fn(first[n], *(other[n] for other in rest)) for n in names}


def select(params: Mapping[str, Tensor], prefix: str, *, strip: bool = True) -> Params:
    """The entries under ``prefix`` (a dotted scope such as ``"block1"``).

    With ``strip=True`` the prefix and its dot are removed from the names, giving the child's
    own params: ``select({"a.w": w, "b.w": v}, "a") == {"w": w}``.
    """
    scope = prefix.rstrip(".") + "." if prefix else ""
    out: Params = {}
    for name, t in params.items():
        if name.startswith(scope):
            out[name[len(scope) :] if strip else name] = t
    return out


def add_prefix(params: Mapping[str, Tensor], prefix: str) -> Params:
    """Put every name under ``prefix``: the inverse of ``select(..., strip=True)``."""
    if not prefix:
        return dict(params)
    return {f"{prefix}.{name}": t for name, t in params.items()}


def partition(
    params: Mapping[str, Tensor], predicate: Callable[[str], bool]
) -> tuple[Params, Params]:
    """Split into ``(matching, rest)`` by a predicate on the name.

    Example: ``arch, weights = partition(params, lambda n: n.startswith("arch."))``.
    """
    yes: Params = {}
    no: Params = {}
    for name, t in params.items():
        (yes if predicate(name) else no)[name] = t
    return yes, no


def merge(*dicts: Mapping[str, Tensor]) -> Params:
    """Union of dicts that share no name (a name in two of them is an error)."""
    out: Params = {}
    for d in dicts:
        clash = set(out) & set(d)
        if clash:
            raise ConfigError(f"merge: dicts must not share names; names present in more than "
                              f"one dict: {sorted(clash)}")
        out.update(d)
    return out


def count(params: Mapping[str, Tensor]) -> int:
    """Total number of scalar entries."""
    return sum(t.numel() for t in params.values())


def nbytes(params: Mapping[str, Tensor]) -> int:
    """Total bytes the tensors' entries take (their dtypes' sizes), as a memory estimate
    counts them."""
    return sum(t.numel() * t.element_size() for t in params.values())


def to(
    params: Mapping[str, Tensor],
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Params:
    """Move to a device and/or cast floating tensors to ``dtype`` (integer buffers keep theirs)."""

    def move(t: Tensor) -> Tensor:
        target = dtype if dtype is not None and t.is_floating_point() else None
        return t.to(device=device, dtype=target)

    return tree_map(move, params)


def detach(params: Mapping[str, Tensor]) -> Params:
    """Detached copies sharing storage: cut the autograd history of every tensor."""
    return tree_map(Tensor.detach, params)


def allclose(
    a: Mapping[str, Tensor], b: Mapping[str, Tensor], *, rtol: float = 1e-5, atol: float = 1e-8
) -> bool:
    """True when both dicts have the same names and every pair of tensors is close."""
    if set(a) != set(b):
        return False
    return all(
        a[n].shape == b[n].shape and torch.allclose(a[n], b[n], rtol=rtol, atol=atol) for n in a
    )


def stack(dicts: list[Mapping[str, Tensor]]) -> Params:
    """Stack a list of dicts along a new leading dim: the input ``vmap`` expects."""
    if not dicts:
        raise ConfigError("stack: need a non-empty list of dicts, got an empty list")
    return zip_map(lambda *ts: torch.stack(ts), *dicts)


def unstack(params: Mapping[str, Tensor]) -> list[Params]:
    """Inverse of :func:`stack`: one dict per index of the leading dim."""
    sizes = {t.shape[0] for t in params.values()}
    if len(sizes) != 1:
        raise ShapeError(f"unstack: every tensor needs the same leading dim, got leading dims "
                         f"{sorted(sizes)}")
    (n,) = sizes
    return [{name: t[i] for name, t in params.items()} for i in range(n)]


__all__ = [
    "Params",
    "State",
    "add_prefix",
    "allclose",
    "count",
    "detach",
    "merge",
    "nbytes",
    "partition",
    "select",
    "stack",
    "to",
    "tree_map",
    "unstack",
    "zip_map",
]
