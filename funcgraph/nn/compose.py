"""Building composite models: children under name prefixes, one key per child.

:func:`composite` is the one mechanism every combinator (``serial``, ``residual``,
``parallel``) and every reference model uses: it prefixes child params and state with the
child's name (so names match the equivalent ``nn.Module``), splits the key once per child,
threads ``train``, and collects each child's new state. A child that is not called keeps its
state unchanged, which is what stochastic depth and early exit need. A Python ``if`` on a
tensor under ``vmap`` in a forward (or in a child it runs) raises a
:class:`~funcgraph.errors.TransformError` that names ``funcgraph.cond``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from .. import random
from ..control import vmap_hint
from ..errors import ArgumentTypeError, ConfigError
from ..model import Model
from ..params import Params, State, add_prefix, select
from ..random import Key


class Children:
    """The handle a composite's forward function uses to run its children.

    ``children(name, x)`` runs the child ``name`` on ``x`` with its own params, state and key
    and returns its output. ``children.own_key`` is a key for the composite's own randomness
    (``None`` when called without a key), ``children.params`` the full params (for tensors the
    composite owns itself), ``children.train`` the mode.
    """

    def __init__(
        self,
        models: Mapping[str, Model],
        params: Params,
        state: State,
        key: Key | None,
        train: bool,
        own_key: Key | None = None,
    ) -> None:
        self._models = models
        self.params = params
        self._state = state
        self._keys = dict(zip(models, random.split(key, len(models)), strict=True)) if (
            key is not None and models
        ) else {}
        self.own_key = own_key
        self.train = train
        self.new_state: State = dict(state)
        self.calls: dict[str, int] = {}

    def __call__(self, name: str, x: Any) -> Any:
        model = self._models[name]
        n = self.calls.get(name, 0)
        self.calls[name] = n + 1
        child_key = self._keys.get(name)
        if child_key is not None and n > 0:
            child_key = random.fold_in(child_key, n)
        y, child_state = model.apply(
            select(self.params, name),
            select(self._state, name),
            x,
            key=child_key,
            train=self.train,
        )
        self.new_state.update(add_prefix(child_state, name))
        return y

    def evaluation(self) -> Children:
        """A fresh handle on the same children in evaluation, with no key: what it runs is
        recorded in it, not here. A ``cond`` branch, which must not change state from outside
        it, runs its children through one it makes."""
        return Children(self._models, self.params, self._state, None, False)


Forward = Callable[[Children, Any], Any]


def composite(
    name: str,
    children: Mapping[str, Model],
    forward: Forward,
    *,
    own_init: Callable[[Key], tuple[Params, State]] | None = None,
    **meta: Any,
) -> Model:
    """A Model whose ``apply`` is ``forward(children, x)``.

    Arguments:
        name: the model's display name.
        children: child models by name; their params live under ``"<name>.<param>"``.
        forward: ``forward(children, x) -> y``; run a child with ``children("conv", x)``.
        own_init: optional ``key -> (params, state)`` for tensors the composite owns itself
            (not in a child); ``forward`` reads them from ``children.params``.
    """
    names = list(children)

    def init(key: Key) -> tuple[Params, State]:
        keys = random.split(key, len(names) + 1)
        params: Params = {}
        state: State = {}
        for child_name, k in zip(names, keys, strict=False):
            p, s = children[child_name].init(k)
            params.update(add_prefix(p, child_name))
            state.update(add_prefix(s, child_name))
        if own_init is not None:
            p, s = own_init(keys[-1])
            params.update(p)
            state.update(s)
        return params, state

    def apply(
        params: Params, state: State, x: Any, *, key: Key | None = None, train: bool = False
    ) -> tuple[Any, State]:
        child_key, own_key = (None, None) if key is None else tuple(random.split(key, 2))
        handle = Children(children, params, state, child_key, train, own_key)
        try:
            y = forward(handle, x)
        except RuntimeError as e:  # a Python `if` on a tensor under vmap gets funcgraph's fix
            hint = vmap_hint(e)
            if hint is None:
                raise
            raise hint from e
        return y, handle.new_state

    return Model(init, apply, name, {"children": names, **meta})


def _named(fn: str, layers: tuple[Model | Mapping[str, Model], ...]) -> dict[str, Model]:
    """Children by name: one mapping as given, or positional models named "0", "1", ..."""
    only = layers[0] if len(layers) == 1 else None
    items: dict[str, object] = (
        dict(only) if isinstance(only, Mapping) else {str(i): m for i, m in enumerate(layers)}
    )
    named = {n: m for n, m in items.items() if isinstance(m, Model)}
    if len(named) < len(items):
        wrong = [f"{n!r} ({type(m).__name__})" for n, m in items.items() if n not in named]
        raise ArgumentTypeError(
            f"{fn}: expected Models, or a single dict of name -> Model; got these that are not "
            f"Models: {', '.join(wrong)}"
        )
    return named


def serial(*layers: Model | Mapping[str, Model], name: str = "serial") -> Model:
    """Run layers one after another, like ``nn.Sequential``.

    ``serial(a, b)`` names children ``"0"``, ``"1"``; ``serial({"conv": a, "norm": b})``
    uses the given names. Each child gets its own key.
    """
    children = _named("serial", layers)

    def forward(run: Children, x: Any) -> Any:
        for child in children:
            x = run(child, x)
        return x

    return composite(name, children, forward)


def residual(
    body: Model,
    shortcut: Model | None = None,
    *,
    names: tuple[str, str] = ("body", "shortcut"),
    name: str = "residual",
) -> Model:
    """``y = body(x) + shortcut(x)`` (identity shortcut when ``shortcut`` is None)."""
    children = {names[0]: body} if shortcut is None else {names[0]: body, names[1]: shortcut}

    def forward(run: Children, x: Tensor) -> Tensor:
        skip = x if shortcut is None else run(names[1], x)
        return run(names[0], x) + skip

    return composite(name, children, forward)


def parallel(
    *branches: Model | Mapping[str, Model],
    combine: str | Callable[[list[Any]], Any] = "concat",
    dim: int = 1,
    name: str = "parallel",
) -> Model:
    """Run branches on the same input and combine: ``"concat"`` (along ``dim``), ``"sum"``,
    ``"stack"`` (new ``dim``), ``"tuple"``, or a function of the list of outputs."""
    children = _named("parallel", branches)
    combiners: dict[str, Callable[[list[Any]], Any]] = {
        "concat": lambda ys: torch.cat(ys, dim=dim),
        "sum": lambda ys: torch.stack(ys).sum(0),
        "stack": lambda ys: torch.stack(ys, dim=dim),
        "tuple": tuple,
    }
    if isinstance(combine, str):
        if combine not in combiners:
            raise ConfigError(
                f"parallel: combine must be one of {sorted(combiners)} or a function, "
                f"got {combine!r}"
            )
        join = combiners[combine]
    else:
        join = combine

    def forward(run: Children, x: Any) -> Any:
        return join([run(child, x) for child in children])

    return composite(name, children, forward)


__all__ = ["Children", "composite", "parallel", "residual", "serial"]
