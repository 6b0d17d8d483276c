"""Parameters as meta tensors, quickly: what shape inference and parameter counts run on.

Only names, shapes and dtypes matter, but a layer's ``init`` draws random numbers, and
Threefry is dozens of integer ops per draw; on meta tensors each op goes through torch's
Python reference kernels. So the key stays on the CPU and small draws really run there,
while the counters of large draws (over ``BIG_DRAW`` elements) are created on meta, which
keeps time and memory bounded for any size (a 100000 x 100000 weight is a handful of meta
ops). Constant tensors a layer creates (a norm's ones) are small and stay real until the final
move to meta; also setting torch's default device to meta would catch them, but its per-op
dispatch costs more than they do, so only the checks that run one initialiser
(:func:`meta_draws`) use it. Measured with ``benchmarks/factory_meta_init.py`` (CPU seconds,
median of 3, one thread): ResNet-20 1.40 s with the key on meta, 0.11 s with a CPU key and
meta default device, 0.08 s here (17x); the DARTS supernet (C=2, 3 cells) 32.7 / 2.5 / 1.6 s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .. import random
from ..model import Model
from ..params import Params, State

BIG_DRAW = 2**20


class _BigDrawsOnMeta(TorchFunctionMode):
    """Create ``torch.arange`` counters of more than ``BIG_DRAW`` elements on meta."""

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.arange and args and isinstance(args[-1], int) and args[-1] > BIG_DRAW:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


@contextlib.contextmanager
def meta_draws() -> Iterator[random.Key]:
    """A context in which new tensors land on meta; yields the CPU key to draw with."""
    key = random.key(0)  # created before the device context: a CPU key
    with torch.device("meta"), _BigDrawsOnMeta():
        yield key


def _init_cheaply(model: Model) -> tuple[Params, State]:
    with _BigDrawsOnMeta():
        return model.init(random.key(0))


def to_meta(tensors: Params) -> Params:
    """Every tensor moved (without data) to the meta device."""
    return {n: t.to("meta") for n, t in tensors.items()}


def meta_init(model: Model) -> tuple[Params, State]:
    """``model.init`` giving meta tensors: names, shapes and dtypes, see the module docstring."""
    params, state = _init_cheaply(model)
    return to_meta(params), to_meta(state)


__all__ = ["BIG_DRAW", "meta_draws", "meta_init", "to_meta"]
