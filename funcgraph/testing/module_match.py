"""``assert_matches_module``: a funcgraph Model against the ``torch.nn`` module it stands for.

Outputs, new state (running statistics) and parameter gradients compared on the same input,
with the module's ``state_dict`` names; see the function's docstring.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from .. import random
from ..model import Model
from ..params import Params, State
from ._compare import compare_trees, describe_difference, leaves_with_paths
from ._compare import fail as _fail


def assert_matches_module(
    model: Model,
    module: nn.Module,
    x: Any,
    *,
    params: Params | None = None,
    state: State | None = None,
    train: bool = False,
    grads: bool = True,
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> None:
    """Check a funcgraph Model against the equivalent ``nn.Module``, name for name.

    The Model's params and state (from ``model.init(funcgraph.random.key(0))`` unless given)
    must have exactly the module's ``state_dict()`` names and shapes. They are loaded into a
    copy of ``module`` (the original is untouched); then the outputs on ``x``, the new state
    when ``train=True`` (running statistics), and with ``grads=True`` the parameter gradients
    of a fixed random projection of the output are compared. The model is applied without a
    key, so compare stochastic layers in evaluation mode.

    Example::

        assert_matches_module(fg.nn.linear(3, 2), torch.nn.Linear(3, 2), torch.randn(4, 3))
    """
    helper = "assert_matches_module"
    if params is None or state is None:
        init_params, init_state = model.init(random.key(0))
        params = init_params if params is None else params
        state = init_state if state is None else state
    reference = copy.deepcopy(module)
    expected_names = reference.state_dict()
    ours = {**params, **state}
    missing = sorted(set(expected_names) - set(ours))
    extra = sorted(set(ours) - set(expected_names))
    if missing or extra:
        _fail(helper, [f"names differ from module.state_dict(): missing {missing}, "
                       f"extra {extra}"])
    shapes = [f"{n}: {tuple(ours[n].shape)} != module {tuple(t.shape)}"
              for n, t in expected_names.items() if ours[n].shape != t.shape]
    if shapes:
        _fail(helper, shapes)
    reference.load_state_dict({n: t.detach() for n, t in ours.items()}, strict=True)
    reference.train(train)
    module_params = dict(reference.named_parameters())
    expected = reference(x)
    got, new_state = model.apply(params, state, x, train=train)
    problems = compare_trees(got, expected, rtol=rtol, atol=atol)
    if train:
        buffers = dict(reference.named_buffers())
        problems += [
            f"state[{n!r}] after a training call: {msg}"
            for n in buffers
            if (msg := describe_difference(new_state[n], buffers[n], rtol=rtol, atol=atol))
        ]
    if grads and not problems:
        problems += _gradient_problems(model, reference, module_params, params, state, x, train,
                                       expected, rtol=rtol, atol=atol)
    if problems:
        _fail(helper, problems)


def _gradient_problems(
    model: Model,
    reference: nn.Module,
    module_params: dict[str, nn.Parameter],
    params: Params,
    state: State,
    x: Any,
    train: bool,
    expected: Any,
    *,
    rtol: float,
    atol: float,
) -> list[str]:
    outputs = [t for _, t in leaves_with_paths(expected) if isinstance(t, Tensor)]
    projections = [
        random.normal(random.fold_in(random.key(1), i), t.shape, dtype=t.dtype)
        for i, t in enumerate(outputs)
    ]

    def project(y: Any) -> Tensor:
        ys = [t for _, t in leaves_with_paths(y) if isinstance(t, Tensor)]
        return sum(((t * w).sum() for t, w in zip(ys, projections, strict=True)),
                   torch.zeros(()))

    trainable = {n: p for n, p in module_params.items() if p.requires_grad}
    ref = torch.autograd.grad(project(expected), list(trainable.values()), allow_unused=True)
    ref_grads = {n: torch.zeros_like(p) if g is None else g
                 for (n, p), g in zip(trainable.items(), ref, strict=True)}
    leaves = {n: params[n].detach().requires_grad_() for n in trainable}
    y, _ = model.apply({**params, **leaves}, state, x, train=train)
    found = torch.autograd.grad(project(y), list(leaves.values()), allow_unused=True)
    ours = {n: torch.zeros_like(p) if g is None else g
            for (n, p), g in zip(leaves.items(), found, strict=True)}
    return [
        f"gradient of params[{n!r}]: {msg}"
        for n in trainable
        if (msg := describe_difference(ours[n], ref_grads[n], rtol=rtol * 10, atol=atol * 10))
    ]


__all__ = ["assert_matches_module"]
