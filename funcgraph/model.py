"""The one Model record, binding state away, and conversion from ``nn.Module``.

A :class:`Model` is a pair of pure functions::

    params, state = model.init(key)
    y, new_state = model.apply(params, state, x, key=None, train=False)

``params`` and ``state`` are flat dotted dicts named like ``nn.Module.state_dict()``; ``state``
holds non-trained tensors (batch-norm running statistics) and is returned, never mutated.
Hyperparameters are Python values closed over by the constructor; only tensors flow through
the arguments, so ``torch.func.grad``/``vmap``/``functional_call`` compose freely.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from .params import Params, State
from .random import Key


class InitFn(Protocol):
    def __call__(self, key: Key) -> tuple[Params, State]: ...


class ApplyFn(Protocol):
    def __call__(
        self, params: Params, state: State, x: Any, *, key: Key | None = None, train: bool = False
    ) -> tuple[Any, State]: ...


@dataclass(frozen=True)
class Model:
    """A model as two pure functions; see the module docstring for the contract.

    Attributes:
        init: ``key -> (params, state)``.
        apply: ``(params, state, x, *, key=None, train=False) -> (y, state)``.
        name: a short human-readable name (used in graphs and error messages).
        meta: free-form hyperparameters for inspection (never read by ``apply``).
    """

    init: InitFn
    apply: ApplyFn
    name: str = "model"
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __call__(
        self, params: Params, state: State, x: Any, *, key: Key | None = None, train: bool = False
    ) -> tuple[Any, State]:
        return self.apply(params, state, x, key=key, train=train)


class BoundApply(Protocol):
    """``f(params, x) -> y``: a model with its state and mode bound away (what :func:`bind`
    returns and what the meta-learners take).

    The protocol promises only ``f(params, x)``, so any plain function of ``(params, x)`` is
    one. The functions :func:`bind` makes also take ``key=`` (the randomness of dropout or
    stochastic depth for that call); callers that have a key pass it only to functions that
    accept one (see :func:`funcgraph.meta.learner.call`).
    """

    def __call__(self, params: Params, x: Any, /) -> Any: ...


def bind(
    model: Model, state: State, *, train: bool = False, key: Key | None = None
) -> BoundApply:
    """A plain ``f(params, x, *, key=None) -> y`` with ``state`` and ``train`` fixed.

    A ``key`` given at call time is used, else the bound ``key``: bind the mode once and pass
    a fresh key per call (what meta-learners do per task and inner step). The state the model
    returns is dropped, which is what meta-learning with batch statistics (transductive batch
    norm) and evaluation want. Use ``model.apply`` to keep it.
    """
    bound = key

    def f(params: Params, x: Any, *, key: Key | None = None) -> Any:
        y, _ = model.apply(params, state, x, key=bound if key is None else key, train=train)
        return y

    return f


def stateless(
    name: str,
    init: Callable[[Key], Params],
    fn: Callable[[Params, Any], Any],
    **meta: Any,
) -> Model:
    """A Model from a params-only init and a deterministic ``fn(params, x)``."""

    def init_(key: Key) -> tuple[Params, State]:
        return init(key), {}

    def apply(
        params: Params, state: State, x: Any, *, key: Key | None = None, train: bool = False
    ) -> tuple[Any, State]:
        return fn(params, x), state

    return Model(init_, apply, name, dict(meta))


def from_module(module: nn.Module, name: str | None = None) -> Model:
    """A pure Model running ``module`` through ``torch.func.functional_call``.

    ``init`` returns copies of the module's parameters (tied weights appear once, under their
    first name, and stay tied) and buffers (the state). ``apply`` never mutates the module's
    tensors or the passed state: buffers are cloned before the call, the module's in-place
    running-statistics updates land on the clones, and the clones are returned as new state.
    The module's ``train()``/``eval()`` mode is set for the call and restored afterwards.
    The ``key`` is ignored: modules draw from torch's global generator (e.g. ``nn.Dropout``).
    """

    def init(key: Key) -> tuple[Params, State]:
        params = {n: p.detach().clone() for n, p in module.named_parameters()}
        state = {n: b.detach().clone() for n, b in module.named_buffers()}
        return params, state

    def apply(
        params: Params, state: State, x: Any, *, key: Key | None = None, train: bool = False
    ) -> tuple[Any, State]:
        new_state = {n: t.clone() for n, t in state.items()}
        was_training = module.training
        module.train(train)
        try:
            y = torch.func.functional_call(module, (params, new_state), (x,), tie_weights=True)
        finally:
            module.train(was_training)
        return y, new_state

    return Model(init, apply, name or type(module).__name__, {"module": type(module).__name__})


__all__ = ["ApplyFn", "BoundApply", "InitFn", "Model", "bind", "from_module", "stateless"]
