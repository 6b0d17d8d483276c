"""The bilevel DARTS update: architecture on validation data, weights on training data.

DARTS solves ``min_a L_val(w*(a), a)`` with ``w*(a) = argmin_w L_train(w, a)`` by alternating
one step on each. The architecture gradient is either

- **first order**: ``d/da L_val(w, a)`` at the current weights, or
- **second order**: the gradient through one unrolled weight step,
  ``w'(a) = opt_step(w, grad_w L_train(w, a))``, i.e. ``d/da L_val(w'(a), a)``, which is
  ``grad_a L_val(w', a) + (dw'/da)^T grad_w' L_val(w', a)``. The second term is the unrolled
  (implicit) term; with ``hypergradient="exact"`` it is a ``torch.func.vjp`` through the
  inner gradient (a mixed second derivative, computed exactly); with ``"finite-difference"``
  it is the paper's approximation
  ``-lr * (grad_a L_train(w+, a) - grad_a L_train(w-, a)) / (2 eps)``, ``w+- = w +- eps v``,
  ``v = grad_w' L_val``, ``eps = fd_radius / ||v||``, which on DARTS' ReLU and max-pool ops
  is far from the exact value at the paper's radius (:func:`hypergradient`).

All functions take a plain ``loss_fn(weights, arch, batch) -> loss`` (contract 3): a DARTS
supernet is one such function, a hand-written one over a dict is another.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor
from torch.func import grad, vjp

from ..checks import check_number
from ..errors import ConfigError
from ..params import Params, zip_map
from ..train.optim import Optimizer, adam, sgd

LossFn = Callable[[Params, Params, Any], Tensor]
"""``loss_fn(weights, arch, batch) -> scalar loss``."""

Order = Literal["first", "second"]
Hypergradient = Literal["exact", "finite-difference"]


@dataclass(frozen=True)
class BilevelConfig:
    """Optimiser settings of the search (DARTS section 3 / appendix A.1.1).

    The paper runs 50 epochs of 391 steps; :meth:`paper` gives its values. The defaults are
    the same recipe scaled for the CPU proxy's 60 steps. Adam moves each architecture logit by
    at most about ``lr`` per step, so the paper's budget is ~3e-4 x 19,550 = 5.9 logit units;
    the proxy uses 0.02 x 60 = 1.2, enough to separate the ops without saturating the softmax
    in a search 300x shorter. The weights' cosine schedule starts at twice the paper's rate so
    the supernet's weights learn within the short budget. Momentum, weight decay, betas and
    gradient clipping are the paper's.

    ``order="second"`` differentiates through one unrolled weight step, by ``hypergradient``:
    ``"exact"`` (a vjp) or the paper's ``"finite-difference"`` at ``fd_radius``, an
    approximation that DARTS' ReLU and max-pool ops put far off (:func:`hypergradient`).
    """

    w_lr: float = 0.05
    w_lr_min: float = 0.001
    w_momentum: float = 0.9
    w_weight_decay: float = 3e-4
    grad_clip: float = 5.0
    arch_lr: float = 0.02
    arch_betas: tuple[float, float] = (0.5, 0.999)
    arch_weight_decay: float = 1e-3
    order: Order = "first"
    hypergradient: Hypergradient = "exact"
    fd_radius: float = 0.01

    def __post_init__(self) -> None:
        """Check the rates when the config is built, not at the search's first step: the
        optimisers' own checks, and the schedule's floor not above its start."""
        self.weight_optimizer()
        self.arch_optimizer()
        check_number("BilevelConfig", "w_lr_min", self.w_lr_min)
        if self.w_lr_min > self.w_lr:
            raise ConfigError(f"BilevelConfig: w_lr_min ({self.w_lr_min}) must not exceed w_lr "
                              f"({self.w_lr}): the weights' cosine schedule anneals down to it")

    @classmethod
    def paper(cls, **overrides: Any) -> BilevelConfig:
        """The paper's values: SGD 0.025 (cosine to 0.001), Adam 3e-4."""
        return cls(**{"w_lr": 0.025, "arch_lr": 3e-4, **overrides})

    def weight_optimizer(self) -> Optimizer:
        return sgd(self.w_lr, momentum=self.w_momentum, weight_decay=self.w_weight_decay)

    def arch_optimizer(self) -> Optimizer:
        return adam(self.arch_lr, betas=self.arch_betas, weight_decay=self.arch_weight_decay)


def unrolled_weights(
    loss_fn: LossFn,
    weights: Params,
    arch: Params,
    batch: Any,
    *,
    optimizer: Optimizer,
    opt_state: Params,
    lr: float,
) -> Params:
    """``w'`` after one (virtual) step of the weight optimiser on ``batch``: the optimiser's own
    update, so momentum and weight decay enter as in the real step (DARTS does the same)."""
    g = grad(loss_fn, argnums=0)(weights, arch, batch)
    new_weights, _ = optimizer.update(weights, g, opt_state, lr=lr)
    return new_weights


def first_order_gradient(loss_fn: LossFn, weights: Params, arch: Params, val_batch: Any) -> Params:
    """``grad_a L_val(w, a)``: the first-order architecture gradient."""
    return grad(loss_fn, argnums=1)(weights, arch, val_batch)


def hypergradient(
    loss_fn: LossFn,
    weights: Params,
    arch: Params,
    train_batch: Any,
    val_batch: Any,
    *,
    optimizer: Optimizer,
    opt_state: Params,
    lr: float,
    method: Hypergradient = "exact",
    fd_radius: float = 0.01,
) -> Params:
    """``d/da L_val(w'(a), a)`` through one unrolled step of ``optimizer`` at rate ``lr``.

    ``method="exact"`` differentiates through the inner gradient with ``torch.func.vjp``: the
    derivative itself, to rounding. On ops with kinks (ReLU, max pool) the unrolled step holds
    their step-function derivatives, so ``L_val(w'(a), a)`` jumps where a pre-activation
    changes sign or a pool's argmax moves; the exact value is the derivative of the smooth
    piece ``a`` lies on.

    ``"finite-difference"`` is the paper's central difference of ``grad_a L_train`` between
    ``w +- eps v`` (``eps = fd_radius / ||v||``, the module docstring). Its formula holds only
    for updates whose Jacobian in the gradient is ``-lr * I`` (SGD with momentum and L2
    decay, not Adam), and even then it is an approximation (exact only where
    ``grad_a L_train`` is linear in ``w``, as for a quadratic loss): on smooth ops its error
    falls as ``fd_radius ** 2``, but on DARTS' ReLU and max-pool ops ``grad_a L_train`` jumps
    wherever a sign or an argmax differs between ``w+`` and ``w-``, and a difference quotient
    across a jump grows as the radius shrinks. ``benchmarks/darts_fd.py`` measures
    both on a small float64 supernet (docs/darts.md, "The finite-difference hypergradient,
    measured"): with DARTS' ops the error grows from a third of the hypergradient's largest
    entry at radius 1e-1 to several times it at 1e-4; with SiLU and average pooling it falls
    as the radius squared. The difference converges on DARTS' ops only at radii below the
    nearest kink (``examples/darts_hypergradient.py``).
    """
    if method == "exact":
        def step(a: Params) -> Params:
            return unrolled_weights(loss_fn, weights, a, train_batch, optimizer=optimizer,
                                    opt_state=opt_state, lr=lr)

        w_prime, pullback = vjp(step, arch)[:2]
        g_w, g_a = grad(loss_fn, argnums=(0, 1))(_detach(w_prime), arch, val_batch)
        (implicit,) = pullback(g_w)
        return zip_map(torch.add, g_a, implicit)
    if method != "finite-difference":
        raise ConfigError(f"hypergradient: method must be 'exact' or 'finite-difference', "
                          f"got {method!r}")
    w_prime = unrolled_weights(loss_fn, weights, arch, train_batch, optimizer=optimizer,
                               opt_state=opt_state, lr=lr)
    g_w, g_a = grad(loss_fn, argnums=(0, 1))(w_prime, arch, val_batch)
    norm = math.sqrt(sum(float((g * g).sum()) for g in g_w.values()))
    eps = fd_radius / max(norm, 1e-12)
    grad_a = grad(loss_fn, argnums=1)
    plus = grad_a(zip_map(lambda w, v: w + eps * v, weights, g_w), arch, train_batch)
    minus = grad_a(zip_map(lambda w, v: w - eps * v, weights, g_w), arch, train_batch)
    return zip_map(lambda g, p, m: g - lr * (p - m) / (2 * eps), g_a, plus, minus)


def _detach(params: Params) -> Params:
    return {n: t.detach() for n, t in params.items()}


def arch_gradient(
    loss_fn: LossFn,
    weights: Params,
    arch: Params,
    train_batch: Any,
    val_batch: Any,
    *,
    config: BilevelConfig,
    opt_state: Params,
    lr: float,
) -> Params:
    """The architecture gradient ``config.order`` asks for (``lr``: the weights' current rate,
    the unrolled step's size)."""
    if config.order == "first":
        return first_order_gradient(loss_fn, weights, arch, val_batch)
    if config.order != "second":
        raise ConfigError(f"arch_gradient: order must be 'first' or 'second', got {config.order!r}")
    return hypergradient(loss_fn, weights, arch, train_batch, val_batch,
                         optimizer=config.weight_optimizer(), opt_state=opt_state, lr=lr,
                         method=config.hypergradient, fd_radius=config.fd_radius)


def clip_grad_norm(grads: Params, max_norm: float) -> tuple[Params, Tensor]:
    """Scale ``grads`` so their global L2 norm is at most ``max_norm`` (as
    ``torch.nn.utils.clip_grad_norm_``); returns the clipped grads and the original norm."""
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g)
                                                 for g in grads.values()]))
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    return {n: g * scale for n, g in grads.items()}, norm


__all__ = [
    "BilevelConfig",
    "LossFn",
    "arch_gradient",
    "clip_grad_norm",
    "first_order_gradient",
    "hypergradient",
    "unrolled_weights",
]
