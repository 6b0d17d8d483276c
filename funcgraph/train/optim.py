"""Optimisers as pure functions over Params, matching ``torch.optim`` step for step.

An :class:`Optimizer` is ``init(params) -> opt_state`` and
``update(params, grads, opt_state, *, lr=None) -> (params, opt_state)``. The optimiser state
is itself a flat dict of tensors (``"exp_avg.fc.weight"``, ``"step"``), so it checkpoints to
safetensors beside the params and vmaps like them. ``lr`` may be overridden per step, which is
how schedules are applied (see :func:`cosine_lr`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..checks import check_bool, check_fraction, check_int, check_number, check_rate
from ..errors import ArgumentTypeError, ConfigError, ShapeError
from ..params import Params, add_prefix, select


@dataclass(frozen=True)
class Optimizer:
    """A pure optimiser; see the module docstring."""

    init: Callable[[Params], Params]
    update: Callable[..., tuple[Params, Params]]
    name: str
    hparams: dict[str, Any] = field(default_factory=dict)


def _check_params(fn: str, params: object) -> Params:
    """``params`` if it is a dict of floating-point tensors, else an ArgumentTypeError."""
    if not isinstance(params, dict) or not all(
            isinstance(t, Tensor) and t.is_floating_point() for t in params.values()):
        got = type(params).__name__ if not isinstance(params, dict) else "a dict holding " + (
            ", ".join(sorted({type(t).__name__ if not isinstance(t, Tensor) else str(t.dtype)
                              for t in params.values()})))
        raise ArgumentTypeError(f"{fn}: params must be a dict of floating-point tensors "
                                f"(model.init's params), got {got}")
    return params


def _check_update(fn: str, params: object, grads: object, opt_state: object, lr: object
                  ) -> Params:
    """The arguments of an optimiser's ``update``: params and grads as :func:`_check_grads`
    wants them, a dict state and a rate that is a finite number >= 0."""
    _check_params(fn, params)
    if not isinstance(opt_state, dict):
        raise ArgumentTypeError(f"{fn}: opt_state must be the dict optimizer.init(params) "
                                f"returned, got {type(opt_state).__name__}")
    check_number(fn, "lr", lr)
    return _check_grads(fn, params, grads)  # type: ignore[arg-type]


def _check_grads(fn: str, params: Params, grads: object) -> Params:
    """``grads`` if it is a dict of tensors with the names and shapes of ``params``.

    The usual way a wrong value gets here is a swapped unpacking of
    ``torch.func.grad_and_value`` (it returns ``(grads, value)``), which hands the optimiser a
    scalar loss; without this check torch fails deep inside the update with an index error.
    """
    if not isinstance(grads, dict):
        raise ArgumentTypeError(
            f"{fn}: grads must be a dict of tensors with the names of params (as "
            f"torch.func.grad returns it; grad_and_value returns (grads, value)), got "
            f"{type(grads).__name__}")
    missing = sorted(set(params) - set(grads))
    if missing:
        raise ArgumentTypeError(
            f"{fn}: grads must hold a tensor for every name in params; missing {missing[:5]}")
    for n, p in params.items():
        g = grads[n]
        if not isinstance(g, Tensor) or g.shape != p.shape:
            got = tuple(g.shape) if isinstance(g, Tensor) else type(g).__name__
            raise ShapeError(
                f"{fn}: grads[{n!r}] must have the shape of params[{n!r}], "
                f"{tuple(p.shape)}, got {got}")
    return grads


def _step(opt_state: Params, like: Tensor) -> Tensor:
    return opt_state.get("step", torch.zeros((), dtype=torch.int64, device=like.device)) + 1


def sgd(
    lr: float, *, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False
) -> Optimizer:
    """SGD with optional momentum/Nesterov and L2 weight decay, as ``torch.optim.SGD``.

    The arguments are checked here: a rate that is not a finite number >= 0 (0 freezes the
    params), a momentum outside [0, 1) (at 1 or more the buffer never forgets and the steps
    grow without bound), a negative weight decay, or Nesterov without momentum is a
    ConfigError."""
    check_number("sgd", "lr", lr)
    check_number("sgd", "momentum", momentum)
    if momentum >= 1:
        raise ConfigError(f"sgd: momentum must be in [0, 1) (0.9 is usual), got {momentum}")
    check_number("sgd", "weight_decay", weight_decay)
    check_bool("sgd", "nesterov", nesterov)
    if nesterov and momentum == 0:
        raise ConfigError("sgd: nesterov needs momentum > 0, got momentum=0.0")

    def init(params: Params) -> Params:
        _check_params("sgd.init", params)
        if momentum == 0.0:
            return {}
        return add_prefix({n: torch.zeros_like(p) for n, p in params.items()}, "momentum_buffer")

    def update(
        params: Params, grads: Params, opt_state: Params, *, lr: float = lr
    ) -> tuple[Params, Params]:
        _check_update("sgd.update", params, grads, opt_state, lr)
        bufs = select(opt_state, "momentum_buffer")
        new_params: Params = {}
        new_bufs: Params = {}
        for n, p in params.items():
            g = grads[n]
            if weight_decay:
                g = g + weight_decay * p
            if momentum:
                # torch.optim.SGD starts the buffer at the first gradient (no dampening).
                first = opt_state.get("step") is None
                b = g if first else momentum * bufs[n] + g
                new_bufs[n] = b
                g = g + momentum * b if nesterov else b
            new_params[n] = p - lr * g
        new_state = add_prefix(new_bufs, "momentum_buffer")
        if momentum:
            new_state["step"] = _step(opt_state, next(iter(params.values())))
        return new_params, new_state

    return Optimizer(init, update, "sgd", {"lr": lr, "momentum": momentum,
                                            "weight_decay": weight_decay, "nesterov": nesterov})


def adam(
    lr: float = 1e-3,
    *,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    decoupled: bool = False,
) -> Optimizer:
    """Adam (L2 weight decay, as ``torch.optim.Adam``) or AdamW (``decoupled=True``).

    The arguments are checked here: ``lr`` finite and >= 0 (0 freezes the params), ``eps``
    finite and > 0, each beta in ``[0, 1)``, ``weight_decay`` >= 0 (a ConfigError
    otherwise)."""
    fn = "adamw" if check_bool("adam", "decoupled", decoupled) else "adam"
    check_number(fn, "lr", lr)
    check_rate(fn, "eps", eps)
    check_number(fn, "weight_decay", weight_decay)
    if not isinstance(betas, tuple | list) or len(betas) != 2:
        raise ConfigError(f"{fn}: betas must be a pair (beta1, beta2), got {betas!r}")
    for i, beta in enumerate(betas):
        check_fraction(fn, f"betas[{i}]", beta)
    b1, b2 = betas
    name = "adamw" if decoupled else "adam"

    def init(params: Params) -> Params:
        _check_params(f"{name}.init", params)

        def zeros() -> Params:
            return {n: torch.zeros_like(p) for n, p in params.items()}

        return {**add_prefix(zeros(), "exp_avg"), **add_prefix(zeros(), "exp_avg_sq")}

    def update(
        params: Params, grads: Params, opt_state: Params, *, lr: float = lr
    ) -> tuple[Params, Params]:
        _check_update(f"{name}.update", params, grads, opt_state, lr)
        step = _step(opt_state, next(iter(params.values())))
        t = float(step)
        m_all, v_all = select(opt_state, "exp_avg"), select(opt_state, "exp_avg_sq")
        new_params: Params = {}
        new_m: Params = {}
        new_v: Params = {}
        for n, p in params.items():
            g = grads[n]
            if weight_decay and decoupled:
                p = p * (1 - lr * weight_decay)
            elif weight_decay:
                g = g + weight_decay * p
            m = b1 * m_all[n] + (1 - b1) * g
            v = b2 * v_all[n] + (1 - b2) * g * g
            denom = (v / (1 - b2**t)).sqrt() + eps
            new_params[n] = p - (lr / (1 - b1**t)) * m / denom
            new_m[n], new_v[n] = m, v
        new_state = {**add_prefix(new_m, "exp_avg"), **add_prefix(new_v, "exp_avg_sq"),
                     "step": step}
        return new_params, new_state

    return Optimizer(init, update, name, {"lr": lr, "betas": betas, "eps": eps,
                                           "weight_decay": weight_decay})


def cosine_lr(base_lr: float, step: int, total_steps: int, *, min_lr: float = 0.0) -> float:
    """Cosine annealing from ``base_lr`` at step 0 to ``min_lr`` at ``total_steps`` (each
    argument checked: a finite rate >= 0, a step >= 0, a length >= 1, a floor >= 0 and not
    above ``base_lr``, so swapped rates are an error rather than a schedule that climbs)."""
    check_number("cosine_lr", "base_lr", base_lr)
    check_int("cosine_lr", "step", step, minimum=0)
    check_int("cosine_lr", "total_steps", total_steps)
    check_number("cosine_lr", "min_lr", min_lr)
    if min_lr > base_lr:
        raise ConfigError(f"cosine_lr: min_lr ({min_lr}) must not exceed base_lr ({base_lr}): "
                          "the schedule anneals from base_lr down to min_lr")
    progress = min(max(step / max(total_steps, 1), 0.0), 1.0)
    return min_lr + 0.5 * (base_lr - min_lr) * (1 + math.cos(math.pi * progress))


__all__ = ["Optimizer", "adam", "cosine_lr", "sgd"]
