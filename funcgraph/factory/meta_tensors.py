"""Parameters as meta tensors, quickly: what shape inference and parameter counts run on.

Only names, shapes and dtypes matter, but a layer's ``init`` draws random numbers, and
Threefry is dozens of integer ops per draw and per split key; on meta tensors each op goes
through torch's Python reference kernels. So :func:`meta_init` runs ``init`` under
:func:`funcgraph.random.shapes_only`: every draw is one meta tensor of its shape and dtype and
keys are not hashed. The constants a layer or an init spec makes (a norm's ones, ``"bias":
"zeros"``) are created on the CPU when small, and on meta when they have more than
``BIG_DRAW`` elements, whatever device their call asks for. That keeps time and memory bounded
for any size: checking a model with a 10**12-wide layer allocates nothing for it, and a
100000 x 100000 weight is a handful of meta ops. Setting torch's default device to meta would
also catch the small constants, but its per-op dispatch costs more than they do, so only the
checks that run one initialiser (:func:`meta_draws`) use it. ``benchmarks/factory_meta_init.py``
times the ways (recorded in docs/results/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .. import random
from ..errors import ConfigError
from ..model import Model
from ..params import Params, State

BIG_DRAW = 2**17  # above this, filling a real tensor costs more than a meta op's dispatch
MAX_NUMEL = 2**63 - 1  # what a tensor's element count (an int64) can hold
_SIZED = (torch.zeros, torch.ones, torch.empty, torch.full, torch.rand, torch.randn)
_MOVES = (torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda)


def _numel(func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    """The elements a call of a tensor factory creates; 0 for other functions, and for sizes
    that are not plain ints (torch then checks them itself)."""
    if func is torch.arange:  # arange(end) or arange(start, end[, step])
        if not args or not all(isinstance(a, int) for a in args):
            return 0
        start, end, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
        return max(0, -((start - end) // step)) if step else 0
    dims: Any
    if func is torch.eye:  # eye(n) or eye(n, m)
        dims = (*args[:2], *args[:1])[:2]
    elif func not in _SIZED:
        return 0
    elif "size" in kwargs:
        dims = kwargs["size"]
    elif args and (func is torch.full or not isinstance(args[0], int)):  # one size argument
        dims = args[0]
    else:  # zeros(2, 3): the size as separate ints
        dims = args
    if not isinstance(dims, Sequence) or not all(isinstance(d, int) for d in dims):
        return 0
    return math.prod(dims)


class _BigOnMeta(TorchFunctionMode):
    """Create tensors of more than ``BIG_DRAW`` elements on meta (``torch.zeros``, ``ones``,
    ``empty``, ``full``, ``rand``, ``randn``, ``eye``, ``arange``), whatever device the call
    names, and keep a meta tensor on meta when it is moved (a placed model's ``init`` moves
    each tensor to its device; only the dtype of the move is kept); a size no tensor can have
    is a ConfigError rather than torch's overflow."""

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in _MOVES and args and getattr(args[0], "is_meta", False):
            if func is not torch.Tensor.to:
                return args[0]
            _, dtype, _, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            return args[0] if dtype is None else args[0].to(dtype=dtype)
        numel = _numel(func, args, kwargs)
        if numel > MAX_NUMEL:
            count = f"{numel:.3g}" if numel < 10**300 else f"about 2**{numel.bit_length() - 1}"
            raise ConfigError(f"needs a tensor of {count} elements; a torch tensor holds at "
                              f"most 2**63 - 1 ({MAX_NUMEL:.3g})")
        if numel > BIG_DRAW:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


@contextlib.contextmanager
def meta_draws() -> Iterator[random.Key]:
    """A context in which new tensors land on meta; yields the CPU key to draw with."""
    key = random.key(0)  # created before the device context: a CPU key
    with torch.device("meta"), _BigOnMeta():
        yield key


def _init_cheaply(model: Model) -> tuple[Params, State]:
    with _BigOnMeta(), random.shapes_only():
        return model.init(random.key(0))


def to_meta(tensors: Params) -> Params:
    """Every tensor moved (without data) to the meta device."""
    return {n: t.to("meta") for n, t in tensors.items()}


def meta_init(model: Model) -> tuple[Params, State]:
    """``model.init`` giving meta tensors: names, shapes and dtypes, see the module docstring.

    Raises:
        ConfigError: a tensor would have more elements than torch can count.
    """
    params, state = _init_cheaply(model)
    return to_meta(params), to_meta(state)


__all__ = ["BIG_DRAW", "MAX_NUMEL", "meta_draws", "meta_init", "to_meta"]
