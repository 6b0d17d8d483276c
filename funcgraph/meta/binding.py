"""What a learner accepts as its model: a bound function, a funcgraph Model or an nn.Module.

Every learner constructor (``maml``, ``fomaml``, ``metasgd``, ``anil``, ``mamlpp``,
``imaml``, ``reptile``, ``protonet``) takes its model through :func:`check_apply`, once, when
the learner is built:

* a function ``f(params, x)`` (``funcgraph.bind(model, state, train=True)``, or any plain
  function of a params dict) is used as it is: the long path, where the caller owns the
  params, the state and the binding;
* a :class:`~funcgraph.model.Model` is bound for training by the learner itself
  (:func:`bind_for_training`);
* an ``nn.Module`` is first converted with :func:`funcgraph.from_module` (its default
  ``init="reset"``: params drawn from a key as the module's ``reset_parameters`` would; pass
  ``from_module(module, init="copy")`` to start from the module's own values), then bound
  like a Model, without a ``key`` argument: a converted module ignores keys (its dropout
  draws from torch's generator), so its tasks need none and no forward derives one.

**Where the params come from.** A learner built from a Model or a module keeps that Model as
:attr:`~funcgraph.meta.learner.MetaLearner.model`, so its initial params are
``learner.model.init(key)``; :class:`~funcgraph.meta.trainer.MetaTrainer` draws them so in
its ``init(key)``. The learner's own ``init`` keeps its meaning (model params ->
meta-params, adding what the learner learns beside them), so nothing of the long path
changes meaning. A learner built from a function has ``model=None``: its caller has the
params.

**Batch norm.** Meta-learning normalises every forward with its own batch's statistics
(transductive, as in MAML), which is what ``train=True`` does; a model whose batch norm keeps
running statistics, bound with ``train=False``, would adapt with those statistics instead,
so such a bound function is refused with the fix.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .. import random
from ..errors import ConfigError
from ..model import BoundApply, BoundInfo, Model, bind
from ..nn.torch_module import from_module
from ..params import Params, State
from ..random import Key

ModelLike = BoundApply | Model | torch.nn.Module
"""What a learner constructor accepts as its model (see the module docstring)."""


class CheckedApply(NamedTuple):
    """What :func:`check_apply` gives a learner: the function it calls, whether that takes
    keys, and the Model it bound itself (``None`` when it was given a function)."""

    apply: BoundApply
    uses_keys: bool
    model: Model | None


def accepts_key(apply: Callable[..., Any]) -> bool:
    """Whether ``apply`` can be called with ``key=`` (a ``key`` parameter or ``**kwargs``).

    A callable whose signature cannot be read (a builtin) counts as accepting: a call with a
    key then fails, if at all, with the callable's own error.
    """
    try:
        params = inspect.signature(apply).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is p.VAR_KEYWORD
               or (p.name == "key" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
               for p in params)


def bind_for_training(model: Model, *, keys: bool = True) -> BoundApply:
    """``model`` bound with ``train=True`` to its initial state, the state following the
    params to their device; ``f(params, x, *, key=None)``, or ``f(params, x)`` with
    ``keys=False`` (a model that ignores keys: tasks then need none).

    The state is ``model.init(random.key(0))``'s. Batch norm's initial running statistics do
    not depend on the key (zeros and ones), and in training mode each forward normalises with
    its own batch's statistics, so those values reach no output: the bound function equals
    ``bind(model, state, train=True)`` for the state of any key. The state is moved to the
    device of the params it is called with (once per device), so the learner works wherever
    the params live.
    """
    _, state = model.init(random.key(0))
    bound: dict[torch.device, BoundApply] = {}

    def on(device: torch.device) -> BoundApply:
        if device not in bound:
            moved: State = {n: t.to(device) for n, t in state.items()}
            if torch.compiler.is_compiling():  # kept, the moved state would leave the graph
                return bind(model, moved, train=True)  # as an output: moved in the graph
            bound[device] = bind(model, moved, train=True)
        return bound[device]

    for t in state.values():  # the state's own device, bound now (before any compiled call)
        on(t.device)
        break

    def f(params: Params, x: Any, *, key: Key | None = None) -> Any:
        first = next(iter(params.values()), None)
        device = first.device if isinstance(first, Tensor) else torch.device("cpu")
        return on(device)(params, x, key=key)  # type: ignore[call-arg]

    def keyless(params: Params, x: Any) -> Any:
        return f(params, x)

    out = f if keys else keyless
    out.funcgraph_bound = BoundInfo(model.name, True,  # type: ignore[attr-defined]
                                    any(n.endswith("running_mean") for n in state))
    return out


def check_apply(apply: ModelLike, who: str) -> CheckedApply:
    """``(apply, uses_keys, model)`` for the learner ``who``, from one look at what it was
    given when the learner is built (not per call); see the module docstring.

    An ``nn.Module`` converts with ``from_module`` and a Model is bound for training
    (:func:`bind_for_training`); ``model`` is then that Model. An ``apply`` taking ``key=``
    comes back as is, with ``uses_keys`` true. A plain ``f(params, x)`` comes back wrapped:
    key-free tasks call it unchanged, and a task that carries a key raises a
    :class:`ConfigError` naming ``who`` rather than a ``TypeError`` deep inside the inner loop.

    Raises:
        ConfigError: ``apply`` is not callable, or it is a model with running statistics
            bound for evaluation (``train=False``).
    """
    model: Model | None = None
    if isinstance(apply, torch.nn.Module):  # it ignores keys (it draws from torch's generator)
        model = from_module(apply)
        apply = bind_for_training(model, keys=False)
    elif isinstance(apply, Model):
        model = apply
        apply = bind_for_training(model)
    if not callable(apply):
        raise ConfigError(f"{who}: apply must be a function f(params, x) -> prediction (e.g. "
                          f"funcgraph.bind(model, state, train=True)), a funcgraph Model or a "
                          f"torch.nn.Module, got {apply!r}")
    bound = getattr(apply, "funcgraph_bound", None)
    if bound is not None and bound.running_stats and not bound.train:
        raise ConfigError(f"{who}: {bound.model!r} is bound for evaluation (train=False), so "
                          "its batch norm would adapt with running statistics instead of each "
                          "task's own; pass funcgraph.bind(model, state, train=True), or the "
                          "Model itself (the learner then binds it for training)")
    if accepts_key(apply):
        return CheckedApply(apply, True, model)
    name = getattr(apply, "__qualname__", type(apply).__name__)
    plain = apply

    def keyless(params: Params, x: Tensor, *, key: Key | None = None) -> Tensor:
        if key is not None:
            raise ConfigError(
                f"{who}: the tasks carry keys (Task.key) but apply {name!r} takes no key= "
                "argument; pass funcgraph.bind(model, state, train=True), give the function a "
                "key=None keyword, or use tasks without keys")
        return plain(params, x)

    return CheckedApply(keyless, False, model)


__all__ = ["CheckedApply", "ModelLike", "accepts_key", "bind_for_training", "check_apply"]
