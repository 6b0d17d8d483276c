"""Assertion helpers for testing pure functions and models.

Each helper runs the function under test against a reference (itself a second time, a Python
loop, central finite differences, the equivalent ``nn.Module``) and raises ``AssertionError``
with a message that names what broke and where: which argument was mutated, which output
element differs and by how much, which parameter entry has the wrong gradient. They need only
torch (no hypothesis), so they work in any test runner.
"""

from __future__ import annotations

import random as py_random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch import Tensor

from ..checks import check_int, check_number, check_rate
from ..errors import ArgumentTypeError, ConfigError, ShapeError
from ..params import Params
from ._compare import (
    compare_trees,
    index_of,
    leaves_with_paths,
    same_values,
)
from ._compare import (
    fail as _fail,
)


def _check_fn(helper: str, fn: object) -> None:
    if not callable(fn):
        raise ArgumentTypeError(f"{helper}: fn must be a function, got {type(fn).__name__}")


def _check_tolerances(helper: str, **tolerances: object) -> None:
    for name, value in tolerances.items():
        if value is not None:
            check_number(helper, name, value)


def _rng_states() -> dict[str, Any]:
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "random": py_random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["torch.cuda"] = torch.cuda.get_rng_state_all()
    return states


def _rng_changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    changed = []
    for name, old in before.items():
        new = after[name]
        if name == "torch":
            same = torch.equal(old, new)
        elif name == "torch.cuda":
            same = all(torch.equal(a, b) for a, b in zip(old, new, strict=True))
        elif name == "numpy":
            same = all(
                np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
                for a, b in zip(old, new, strict=True)
            )
        else:
            same = old == new
        if not same:
            changed.append(name)
    return changed


def assert_pure(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Check that ``fn(*args, **kwargs)`` behaves as a pure function, and return its output.

    Three properties are checked, in this order:

    1. no global random generator is used (torch's CPU and CUDA generators, Python's
       ``random``, NumPy's legacy global state): randomness must come from a ``key`` argument;
    2. no argument is mutated: every tensor in ``args``/``kwargs`` (nested in dicts, lists and
       tuples too) keeps its values and its in-place version counter, and no dict or list
       gains, loses or reassigns an entry;
    3. the same arguments give the same output: a second call is compared bitwise.

    Example::

        y = assert_pure(model.apply, params, state, x, key=random.key(0), train=True)

    Raises:
        AssertionError: naming the broken property and the argument or output path involved.
    """
    _check_fn("assert_pure", fn)
    inputs = (args, kwargs)
    snapshot = [
        (path, t, t._version, t.detach().clone())
        for path, t in leaves_with_paths(inputs)
        if isinstance(t, Tensor)
    ]
    paths_before = [path for path, _ in leaves_with_paths(inputs)]
    rng_before = _rng_states()
    first = fn(*args, **kwargs)
    changed = _rng_changed(rng_before, _rng_states())
    if changed:
        _fail("assert_pure", [f"fn used the global random generator ({', '.join(changed)})"],
              "Draw randomness from an explicit key: funcgraph.random.normal(key, shape), "
              "with the key passed as an argument.")
    mutated = []
    now = dict(leaves_with_paths(inputs))
    if list(now) != paths_before:
        added = [_argument_name(p) for p in now if p not in paths_before]
        removed = [_argument_name(p) for p in paths_before if p not in now]
        mutated.append(f"fn changed the arguments' containers (added {added}, removed {removed})")
    for path, t, version, old in snapshot:
        where = _argument_name(path)
        if path in now and now[path] is not t:
            mutated.append(f"fn replaced {where} with another tensor (assigned into a container)")
        elif not same_values(t.detach(), old):
            mutated.append(f"fn mutated {where} in place (values changed)")
        elif t._version != version:
            mutated.append(f"fn mutated {where} in place (in-place op, values unchanged)")
    if mutated:
        _fail("assert_pure", mutated, "Return new tensors/dicts instead of updating arguments.")
    second = fn(*args, **kwargs)
    problems = compare_trees(second, first, rtol=0.0, atol=0.0)
    if problems:
        _fail("assert_pure", [f"two calls with the same arguments differ: {p}" for p in problems],
              "fn depends on hidden state (a counter, a cache, a global) or unkeyed randomness.")
    return first


def _argument_name(path: str) -> str:
    """``"[0][1]['w']"`` (args, kwargs) -> ``"args[1]['w']"`` / ``"kwargs['key']"``."""
    head, _, rest = path[1:].partition("]")
    return ("args" if head == "0" else "kwargs") + rest


def _batch_size(args: Sequence[Any], dims: Sequence[int | None]) -> int:
    sizes = {
        leaf.shape[d]
        for a, d in zip(args, dims, strict=True)
        if d is not None
        for _, leaf in leaves_with_paths(a)
        if isinstance(leaf, Tensor)
    }
    if len(sizes) != 1:
        raise ShapeError(
            f"assert_vmap_matches_loop: batched arguments need one common batch size along "
            f"in_dims, got sizes {sorted(sizes)}"
        )
    return sizes.pop()


def assert_vmap_matches_loop(
    fn: Callable[..., Any],
    *args: Any,
    in_dims: int | None | Sequence[int | None] = 0,
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> Any:
    """Check ``torch.func.vmap(fn, in_dims)(*args)`` against a Python loop over the batch.

    The loop calls ``fn`` once per batch index with each batched argument indexed along its
    ``in_dims`` entry (``None`` = passed whole to every call) and stacks the outputs along dim
    0. A function with hidden state, a batch-mixing bug or Python control flow on tensor values
    fails here. Returns the vmapped output.

    Example::

        assert_vmap_matches_loop(lambda p, x: bind(model, state)(p, x), params, xs,
                                 in_dims=(None, 0))
    """
    _check_fn("assert_vmap_matches_loop", fn)
    _check_tolerances("assert_vmap_matches_loop", rtol=rtol, atol=atol)
    dims = list(in_dims) if isinstance(in_dims, Sequence) else [in_dims] * len(args)
    if not all(d is None or (isinstance(d, int) and not isinstance(d, bool)) for d in dims):
        raise ConfigError(f"assert_vmap_matches_loop: in_dims must be an int, None or one of "
                          f"them per argument, got {in_dims!r}")
    if len(dims) != len(args):
        raise ConfigError(
            f"assert_vmap_matches_loop: in_dims needs one entry per argument ({len(args)}), got "
            f"{len(dims)}: {in_dims!r}"
        )
    try:
        batched = torch.func.vmap(fn, in_dims=tuple(dims))(*args)
    except Exception as e:  # any failure under vmap is the finding we report
        _fail("assert_vmap_matches_loop", [f"fn failed under vmap: {type(e).__name__}: {e}"],
              "Python `if` on a tensor value, .item() and in-place updates of captured tensors "
              "cannot be vmapped; branch with funcgraph.cond or torch.where.")
    n = _batch_size(args, dims)
    outputs = []
    for i in range(n):
        call = [
            a if d is None else pytree.tree_map(lambda t, d=d, i=i: t.select(d, i), a)
            for a, d in zip(args, dims, strict=True)
        ]
        outputs.append(fn(*call))
    looped = pytree.tree_map(lambda *ts: torch.stack(ts), outputs[0], *outputs[1:])
    problems = compare_trees(batched, looped, rtol=rtol, atol=atol)
    if problems:
        _fail("assert_vmap_matches_loop", [f"vmap vs loop: {p}" for p in problems],
              "The first index of the worst element is the batch index. fn treats elements "
              "of the batch differently under vmap: hidden state, or mixing across the batch.")
    return batched


def _default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return (1e-6, 1e-8) if dtype == torch.float64 else (2e-2, 1e-3)


_FD = "assert_grad_matches_finite_differences"


@dataclass(frozen=True)
class _FdTolerance:
    """How central differences are taken and how far autograd may be from them (see
    :func:`assert_grad_matches_finite_differences`).

    Attributes:
        dtype: the dtype everything is cast to; its ``eps`` sets the step and the rounding.
        step: the step given, else ``None`` for ``eps ** (1/3) * max(1, |p|)``.
        rtol: relative tolerance, against ``|fd|``.
        atol: absolute tolerance.
    """

    dtype: torch.dtype
    step: float | None
    rtol: float
    atol: float

    def step_at(self, value: float) -> float:
        """The step for an entry of ``value``: the one given, else the one that balances
        truncation against rounding error."""
        if self.step is not None:
            return self.step
        return torch.finfo(self.dtype).eps ** (1 / 3) * max(1.0, abs(value))

    def exceeded(self, analytic: float, numeric: float, base: float, step: float) -> bool:
        """Whether ``|analytic - numeric|`` is over ``atol + rtol * |numeric|`` plus the
        rounding error of a difference of ``fn`` near ``base`` over ``step``."""
        rounding = 10 * torch.finfo(self.dtype).eps * abs(base) / step
        return abs(analytic - numeric) > self.atol + rounding + self.rtol * abs(numeric)


def _checked_fd_tolerance(
    fn: object, params: object, dtype: torch.dtype, step: float | None, rtol: float | None,
    atol: float | None, max_entries: int,
) -> _FdTolerance:
    """The tolerance to check with (the dtype's defaults where none is given), after refusing
    a ``fn`` that is not callable, another dtype, bad numbers, and params that are not
    floating-point tensors."""
    _check_fn(_FD, fn)
    if dtype not in (torch.float32, torch.float64):
        raise ConfigError(f"{_FD}: dtype must be torch.float64 or torch.float32, got "
                          f"{dtype!r}")
    _check_tolerances(_FD, rtol=rtol, atol=atol)
    if step is not None:
        check_rate(_FD, "step", step)
    check_int(_FD, "max_entries", max_entries)
    tensors = [params] if isinstance(params, Tensor) else (
        list(params.values()) if isinstance(params, Mapping) else None)
    if tensors is None or not all(isinstance(t, Tensor) and t.is_floating_point()
                                  for t in tensors):
        raise ArgumentTypeError(f"{_FD}: params must be a floating-point tensor or a dict "
                                f"of them, got {type(params).__name__}")
    default_rtol, default_atol = _default_tolerance(dtype)
    return _FdTolerance(dtype, step, default_rtol if rtol is None else rtol,
                        default_atol if atol is None else atol)


def _as_scalar_of_dict(
    fn: Callable[..., Tensor], single: bool, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Callable[[Params], Tensor]:
    """``fn`` as a function of a params dict (``{"": tensor}`` when ``single``), with its
    other arguments bound; it refuses an output that is not a scalar and returns shape ``()``."""

    def scalar(q: Params) -> Tensor:
        """``fn`` at the params ``q``, as a 0-d tensor."""
        out = fn(q[""] if single else q, *args, **kwargs)
        if not isinstance(out, Tensor) or out.numel() != 1:
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ShapeError(f"{_FD}: fn must return a scalar, got {got}")
        return out.reshape(())

    return scalar


def _autograd_grads(scalar: Callable[[Params], Tensor], p: Params) -> Params:
    """The gradient of ``scalar`` at ``p`` by ``torch.autograd.grad``, zeros for an unused
    entry. Marks ``p``'s floating tensors as requiring grad (they are the helper's own
    copies)."""
    leaves = {n: t.requires_grad_(t.is_floating_point()) for n, t in p.items()}
    trainable = {n: t for n, t in leaves.items() if t.requires_grad}
    found = torch.autograd.grad(scalar(leaves), list(trainable.values()), allow_unused=True)
    return {n: torch.zeros_like(t) if g is None else g
            for (n, t), g in zip(trainable.items(), found, strict=True)}


def _central_difference(
    scalar: Callable[[Params], Tensor], p: Params, name: str, i: int, step: float
) -> float:
    """``(f(p + step e_i) - f(p - step e_i)) / (2 step)`` for entry ``i`` of ``p[name]``
    (flattened)."""
    value = p[name]
    flat = value.flatten()
    diffs = []
    for sign in (1.0, -1.0):
        bumped = flat.clone()
        bumped[i] += sign * step
        diffs.append(scalar({**p, name: bumped.reshape(value.shape)}))
    return float((diffs[0] - diffs[1]) / (2 * step))


def _fd_problems(
    scalar: Callable[[Params], Tensor], p: Params, grads: Params, tolerance: _FdTolerance,
    max_entries: int, single: bool,
) -> list[str]:
    """One line for every checked entry where autograd and central differences disagree:
    at most ``max_entries`` evenly spaced entries of each floating tensor of ``p``."""
    problems = []
    with torch.no_grad():
        base = float(scalar(p))
        for name, value in p.items():
            if not value.is_floating_point() or value.numel() == 0:
                continue
            flat = value.flatten()
            picks = torch.linspace(0, flat.numel() - 1, min(max_entries, flat.numel()))
            for i in sorted({int(j) for j in picks.round().long()}):
                h = tolerance.step_at(float(flat[i]))
                numeric = _central_difference(scalar, p, name, i, h)
                analytic = float(grads[name].flatten()[i])
                if tolerance.exceeded(analytic, numeric, base, h):
                    where = ("params" if single else f"params[{name!r}]") + index_of(
                        i, value.shape
                    )
                    problems.append(
                        f"d fn / d {where}: autograd {analytic:.6g}, central difference "
                        f"{numeric:.6g} (step {h:.2g}, {tolerance.dtype})"
                    )
    return problems


def assert_grad_matches_finite_differences(
    fn: Callable[..., Tensor],
    params: Mapping[str, Tensor] | Tensor,
    *args: Any,
    dtype: torch.dtype = torch.float64,
    step: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    max_entries: int = 32,
    **kwargs: Any,
) -> Params | Tensor:
    """Check the autograd gradient of ``fn`` w.r.t. ``params`` against central differences.

    ``fn(params, *args, **kwargs)`` must return a scalar. Floating tensors in ``params`` and
    ``args`` (dicts included, such as a model's state) are cast to ``dtype`` (float64 by
    default, where central differences are accurate to about 1e-10); pass the data and the
    state as ``args`` rather than capturing them in ``fn``, or they keep their dtype (a
    float32 batch-norm state captured in ``fn`` meets float64 inputs and torch refuses).
    The step for an entry ``p`` is ``eps(dtype) ** (1/3) * max(1,
    |p|)`` (about 6e-6 in float64), the step that balances truncation against rounding error;
    pass ``step`` to override. At most ``max_entries`` evenly spaced entries of each tensor are
    checked (two evaluations of ``fn`` each). The gradient comes from ``torch.autograd.grad``,
    so ``fn`` may use custom autograd Functions and ``torch.func`` transforms inside. An entry
    passes when ``|autograd - fd| <= atol + rtol * |fd| + 10 * eps * |fn| / step`` (the last
    term is the rounding error of the difference). Default tolerances: ``rtol=1e-6,
    atol=1e-8`` in float64, ``rtol=2e-2, atol=1e-3`` in float32.

    Returns the autograd gradient (a dict like ``params``, or a tensor).

    Example::

        loss = lambda p, s, x, y: F.cross_entropy(bind(model, s)(p, x), y)
        assert_grad_matches_finite_differences(loss, params, state, x, y)
    """
    tolerance = _checked_fd_tolerance(fn, params, dtype, step, rtol, atol, max_entries)

    def cast(t: Any) -> Any:
        """A floating tensor detached and in ``dtype``; anything else as it is."""
        return t.detach().to(dtype) if isinstance(t, Tensor) and t.is_floating_point() else t

    single = isinstance(params, Tensor)
    p: Params = {"": cast(params)} if single else {n: cast(t) for n, t in params.items()}  # type: ignore[union-attr]
    scalar = _as_scalar_of_dict(fn, single, pytree.tree_map(cast, args), kwargs)
    grads = _autograd_grads(scalar, p)
    problems = _fd_problems(scalar, p, grads, tolerance, max_entries, single)
    if problems:
        _fail(_FD, problems,
              f"Allowed |autograd - fd| <= {tolerance.atol:g} + {tolerance.rtol:g}*|fd| + "
              "rounding. A custom backward, a detach() or an in-place op on the path is the "
              "usual cause.")
    return grads[""] if single else grads


__all__ = [
    "assert_grad_matches_finite_differences",
    "assert_pure",
    "assert_vmap_matches_loop",
]
