"""MAML and its family as pure functions over params: MAML, first-order MAML, Meta-SGD, ANIL.

One inner loop serves all four (Finn et al. 2017; Li et al. 2017; Raghu et al. 2020)::

    fast = params
    repeat steps:  fast = fast - lr * grad(loss(apply(fast, support_x), support_y))
    task loss = loss(apply(fast, query_x), query_y)

* MAML differentiates the task loss through the inner updates (second order).
* First-order MAML treats the inner gradients as constants: the same update with the
  second-order term (the Hessian-vector products) dropped.
* Meta-SGD learns one inner learning rate per parameter entry (``"inner_lr.<name>"`` in the
  meta-params), meta-trained with the weights.
* ANIL adapts only the parameters under a prefix (the ``"head"``) in the inner loop.

The inner gradient is ``torch.func.grad`` inside transforms (so an outer ``torch.func.grad``
gives the meta-gradient and ``vmap`` maps it over tasks) and plain autograd with
``create_graph`` outside them (the loop strategy): same numbers, less overhead.

**Rematerialised second order** (``remat=True``, :func:`remat_task_grad`): instead of keeping
the autograd graph of every inner step alive until the query loss is differentiated, run the
inner loop without a graph (storing only each step's params), differentiate the query loss at
the adapted params with a plain first-order backward, then walk the inner steps backwards,
each step's Jacobian ``I - lr * H`` applied as one Hessian-vector product on the support set
(its forward recomputed, with that step's key, so dropout draws the same masks). The
meta-gradient is the same to rounding; peak memory is one step's graph whatever the number of
inner steps, and the query pass, the large one, is first order, so it takes the fastest
kernels (native batch norm). It costs one more support forward and backward per inner step.

Tasks with keys give each inner step and the query pass their own key (the schedule is in
:mod:`funcgraph.meta.learner`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from ..checks import check_bool, check_int, check_rate
from ..errors import ConfigError
from ..model import BoundApply
from ..params import Params, partition, select
from ..random import Key
from ..train import Optimizer
from .adapted import AdaptThenScore, Predict, predicting
from .binding import ModelLike
from .learner import (
    LR_PREFIX,
    MetaLearner,
    Objective,
    Task,
    TaskGradFn,
    call,
    check_apply,
    grad_of,
    model_params,
    objective,
    query_key,
    support_keys,
    task_grad_of,
)
from .registry import TaskInfo
from .settings import MamlSettings


@dataclass(frozen=True)
class InnerLoop:
    """Inner-loop settings.

    Attributes:
        steps: SGD steps on the support set (>= 0).
        lr: the inner learning rate (Meta-SGD: the initial value of the learned rates).
        first_order: drop the second-order term (inner gradients become constants).
        adapt_prefix: adapt only params whose name starts with ``adapt_prefix + "."``
            (ANIL: ``"head"``); ``None`` adapts all.
    """

    steps: int = MamlSettings.inner_steps
    lr: float = MamlSettings.inner_lr
    first_order: bool = False
    adapt_prefix: str | None = None

    def __post_init__(self) -> None:
        check_int("InnerLoop", "steps", self.steps, minimum=0)
        check_rate("InnerLoop", "lr", self.lr)
        check_bool("InnerLoop", "first_order", self.first_order)
        if self.adapt_prefix is not None and not (isinstance(self.adapt_prefix, str)
                                                  and self.adapt_prefix):
            raise ConfigError(f"InnerLoop: adapt_prefix must be None or a non-empty param-name "
                              f"prefix such as 'head', got {self.adapt_prefix!r}")

    def adapts(self, name: str) -> bool:
        return self.adapt_prefix is None or name.startswith(self.adapt_prefix + ".")

    def adapted(self, params: Params) -> list[str]:
        """The names in ``params`` that adapt; a :class:`ConfigError` when there are none."""
        names = [n for n in params if self.adapts(n)]
        if not names:
            raise ConfigError(f"adapt: no parameter name starts with {self.adapt_prefix!r}.")
        return names


def adapt(
    apply: BoundApply,
    params: Params,
    x: Tensor,
    y: Tensor,
    *,
    loss: Callable[[Tensor, Tensor], Tensor],
    inner: InnerLoop,
    lrs: Params | None = None,
    key: Key | None = None,
    optimizer: Optimizer | None = None,
    minibatches: bool = False,
) -> Params:
    """Params after ``inner.steps`` SGD steps (or ``optimizer``'s) on ``loss(apply(params, x), y)``.

    Arguments:
        apply: ``f(params, x) -> prediction``; with a ``key``, ``f(params, x, key=...)``.
        params: the starting point (the meta-parameters of the model).
        x: the support inputs.
        y: the support targets.
        loss: ``loss(prediction, y) -> scalar``.
        inner: steps, learning rate, first order, which params adapt.
        lrs: per-parameter learning-rate tensors (Meta-SGD), used instead of ``inner.lr``.
        key: the task's key; step ``i`` forwards with ``support_keys(key, steps)[i]``.
        optimizer: another update rule than SGD (a pure :class:`~funcgraph.train.Optimizer`,
            e.g. Reptile's inner Adam), fresh per call; its steps are not differentiated
            through, so it needs ``inner.first_order``.
        minibatches: ``x`` and ``y`` hold one minibatch per row of their first dim, and step
            ``i`` fits row ``i`` modulo the rows (Reptile's inner loop over minibatches).
    Returns:
        A new dict with every name of ``params``; non-adapted entries are the same tensors.
    """
    _check_adapt(apply, params, loss, inner, minibatches)
    adapted = set(inner.adapted(params))
    fast, frozen = partition(params, adapted.__contains__)

    def support_loss(f: Params, step_key: Key | None, step: int) -> Tensor:
        if minibatches:
            row = step % x.shape[0]
            return loss(call(apply, {**frozen, **f}, x[row], step_key), y[row])
        return loss(call(apply, {**frozen, **f}, x, step_key), y)

    if optimizer is not None and not inner.first_order:
        raise ConfigError(f"adapt: the {optimizer.name} inner loop is first order only "
                          "(inner.first_order=True)")
    state = optimizer.init(fast) if optimizer is not None else None
    for step, step_key in enumerate(support_keys(key, inner.steps)):
        grads = grad_of(partial(support_loss, step_key=step_key, step=step), fast,
                        create_graph=not inner.first_order)
        if optimizer is not None:
            fast, state = optimizer.update(fast, grads, state)
            continue
        fast = {
            n: p - (lrs[n] if lrs is not None else inner.lr) * grads[n] for n, p in fast.items()
        }
    return {n: fast.get(n, p) for n, p in params.items()}


def _check_adapt(apply: object, params: object, loss: object, inner: object,
                 minibatches: object) -> None:
    """Refuse arguments of :func:`adapt` of the wrong kind before a step runs."""
    if not callable(apply) or not callable(loss):
        bad, value = ("apply", apply) if not callable(apply) else ("loss", loss)
        raise ConfigError(f"adapt: {bad} must be a function, got {value!r}")
    if not isinstance(params, dict) or not params:
        raise ConfigError(f"adapt: params must be a non-empty dict of tensors (a Params), got "
                          f"{type(params).__name__}")
    if not isinstance(inner, InnerLoop):
        raise ConfigError(f"adapt: inner must be an InnerLoop (steps, lr, first_order), got "
                          f"{inner!r}")
    check_bool("adapt", "minibatches", minibatches)


def task_loss(
    apply: BoundApply,
    meta_params: Params,
    task: Task,
    *,
    objective: Objective,
    inner: InnerLoop,
) -> tuple[Tensor, Tensor]:
    """``(query loss, query metric)`` of one task after adapting on its support set.

    ``meta_params`` may hold Meta-SGD rates under ``"inner_lr.<name>"``; they are then used
    as the per-parameter inner learning rates. Differentiate this (``torch.func.grad`` with
    ``has_aux``) for the meta-gradient. A task key gives every inner step and the query pass
    their own key (see :mod:`funcgraph.meta.learner`).
    """
    params, lrs = _split_rates(meta_params)
    fast = adapt(apply, params, task.support_x, task.support_y, loss=objective.loss,
                 inner=inner, lrs=lrs, key=task.key)
    return _query_score(apply, fast, task, objective)


def _query_score(apply: BoundApply, params: Params, task: Task,
                 objective: Objective) -> tuple[Tensor, Tensor]:
    """``(loss, metric)`` of ``params`` on the task's query set (with the query key)."""
    pred = call(apply, params, task.query_x, query_key(task.key))
    return objective.loss(pred, task.query_y), objective.metric(pred, task.query_y)


def _split_rates(meta_params: Params) -> tuple[Params, Params | None]:
    """``(model params, Meta-SGD rates by param name or None)``."""
    lrs = select(meta_params, LR_PREFIX)
    return model_params(meta_params), lrs or None


def remat_task_grad(
    apply: BoundApply,
    *,
    objective: Objective,
    inner: InnerLoop,
) -> TaskGradFn:
    """One task's meta-gradient with the inner loop rematerialised (see the module docs).

    For inner steps ``theta[k+1] = theta[k] - lr * g(theta[k])`` on the adapted params ``A``
    (``g`` the support-loss gradient), the reverse pass starts from ``v = dL_query/dtheta[K]``
    and applies, from the last step to the first, ``v <- v - d/dtheta (g_A(theta[k]) . (lr *
    v_A))``: the vector-Jacobian product of one step, a Hessian-vector product. Meta-SGD's
    rates get ``-sum_k g_A(theta[k]) * v_A`` (with ``v`` after step ``k``). First order skips
    the Hessian term. Each step's gradient is recomputed with that step's key. Equal to
    differentiating :func:`task_loss`, to rounding.
    """
    # The query pass is first order: plain autograd outside transforms, where it is cheapest.
    query_grad = task_grad_of(lambda p, t: _query_score(apply, p, t, objective))

    def task_grad(meta_params: Params, task: Task) -> tuple[Params, Tensor, Tensor]:
        params, lrs = _split_rates({n: p.detach() for n, p in meta_params.items()})
        adapted = inner.adapted(params)

        def support_grad(p: Params, key: Key | None, *, create_graph: bool = False) -> Params:
            fast, frozen = partition(p, inner.adapts)
            return grad_of(
                lambda f: objective.loss(call(apply, {**frozen, **f}, task.support_x, key),
                                         task.support_y),
                fast, create_graph=create_graph)

        def rate(n: str) -> Tensor | float:
            return lrs[n] if lrs is not None else inner.lr

        def hessian_vector(p: Params, u: Params, key: Key | None) -> Params:
            """``d/dtheta (g_A(p) . u)`` over every param: one step's second-order term."""
            return grad_of(lambda q: torch.stack(
                [(g * u[n]).sum() for n, g in support_grad(q, key, create_graph=True).items()]
            ).sum(), p)

        # Forward: the params before each inner step, its key and its gradient, no graph kept.
        trajectory: list[tuple[Params, Key | None, Params]] = []
        p = params
        for step_key in support_keys(task.key, inner.steps):
            g = support_grad(p, step_key)
            trajectory.append((p, step_key, g))
            p = {**p, **{n: p[n] - rate(n) * g[n] for n in adapted}}
        v, loss, metric = query_grad(p, task)
        # Reverse: v <- v - H(p_k) (rate * v_A), from the last step to the first.
        rate_grads = {n: torch.zeros_like(params[n]) for n in adapted} if lrs else {}
        for p, step_key, g in reversed(trajectory):
            for n in rate_grads:
                rate_grads[n] = rate_grads[n] - g[n] * v[n]
            if not inner.first_order:
                hvp = hessian_vector(p, {n: rate(n) * v[n] for n in adapted}, step_key)
                v = {n: v[n] - hvp[n] for n in v}
        grads = {**v, **{LR_PREFIX + n: t for n, t in rate_grads.items()}}
        return {n: grads[n] for n in meta_params}, loss, metric

    return task_grad


def maml(
    apply: ModelLike,
    *,
    kind: str = "classification",
    inner_steps: int = MamlSettings.inner_steps,
    inner_lr: float = MamlSettings.inner_lr,
    eval_steps: int | None = MamlSettings.eval_steps,
    first_order: bool = MamlSettings.first_order,
    learn_lr: bool = False,
    adapt_prefix: str | None = None,
    remat: bool = MamlSettings.remat,
    name: str | None = None,
) -> MetaLearner:
    """MAML (second order by default) as a :class:`MetaLearner`.

    Arguments:
        apply: ``f(params, x) -> prediction`` (``funcgraph.bind(model, state, train=True)``),
            or a funcgraph Model or ``nn.Module``, which the learner binds for training
            itself (:mod:`funcgraph.meta.binding`); tasks with keys need a function that
            takes ``key=``.
        kind: ``"classification"`` (cross-entropy, accuracy) or ``"regression"`` (MSE).
        inner_steps: steps of the inner loop used for meta-training.
        inner_lr: the learning rate of that inner loop.
        eval_steps: inner steps at evaluation (``None``: ``inner_steps``).
        first_order: first-order MAML.
        learn_lr: Meta-SGD (per-parameter learned inner rates, initialised to ``inner_lr``).
        adapt_prefix: adapt only params under this prefix (ANIL: ``"head"``).
        remat: rematerialise the inner loop (:func:`remat_task_grad`): same meta-gradient,
            peak memory of one inner step, first-order query pass.

    The defaults are :class:`~funcgraph.meta.settings.MamlSettings`'s, which
    ``funcgraph meta-train --algo maml`` uses too.

    Raises:
        ConfigError: an argument out of range or of the wrong type (naming it and the value).
    """
    check_bool("maml", "learn_lr", learn_lr)
    check_bool("maml", "first_order", first_order)
    default = "metasgd" if learn_lr else "anil" if adapt_prefix is not None else (
        "fomaml" if first_order else "maml")
    try:
        settings = MamlSettings(inner_steps, inner_lr,
                                inner_steps if eval_steps is None else eval_steps, first_order,
                                remat)
    except ConfigError as e:  # name the function the user called (fomaml, metasgd, anil)
        raise ConfigError(default + str(e).removeprefix(MamlSettings.OWNER)) from None
    if name is not None and not (isinstance(name, str) and name):
        raise ConfigError(f"maml: name must be None or a non-empty string, got {name!r}")
    apply, uses_keys, model = check_apply(apply, name or default)
    obj = objective(kind)
    train_inner = InnerLoop(inner_steps, inner_lr, first_order, adapt_prefix)
    # Evaluation never differentiates through the adaptation: first order is exact there.
    eval_inner = InnerLoop(settings.eval_steps, inner_lr, True, adapt_prefix)

    def init(params: Params) -> Params:
        if not learn_lr:
            return dict(params)
        rates = {LR_PREFIX + n: torch.full_like(p, inner_lr)
                 for n, p in params.items() if train_inner.adapts(n)}
        return {**params, **rates}

    def loss_fn(meta_params: Params, task: Task) -> tuple[Tensor, Tensor]:
        return task_loss(apply, meta_params, task, objective=obj, inner=train_inner)

    task_grad = (remat_task_grad(apply, objective=obj, inner=train_inner)
                 if remat else task_grad_of(loss_fn))

    def eval_adapt(meta_params: Params, x: Tensor, y: Tensor, key: Key | None) -> Predict:
        params, lrs = _split_rates(meta_params)
        fast = adapt(apply, params, x, y, loss=obj.loss, inner=eval_inner, lrs=lrs, key=key)
        return predicting(apply, fast, key)

    return MetaLearner(name or default, init, task_grad, AdaptThenScore(eval_adapt, obj),
                       obj, settings, uses_keys=uses_keys, model=model)


def fomaml(apply: ModelLike, **kw: object) -> MetaLearner:
    """First-order MAML: :func:`maml` with ``first_order=True``."""
    return maml(apply, first_order=True, **kw)  # type: ignore[arg-type]


def metasgd(apply: ModelLike, **kw: object) -> MetaLearner:
    """Meta-SGD: :func:`maml` with learned per-parameter inner learning rates."""
    return maml(apply, learn_lr=True, **kw)  # type: ignore[arg-type]


def anil(apply: ModelLike, *, head: str = "head", **kw: object) -> MetaLearner:
    """ANIL: :func:`maml` adapting only the params under ``head`` in the inner loop."""
    return maml(apply, adapt_prefix=head, **kw)  # type: ignore[arg-type]


def build_maml(apply: BoundApply, settings: MamlSettings, info: TaskInfo, *,
               name: str | None = None, learn_lr: bool = False,
               adapt_prefix: str | None = None) -> MetaLearner:
    """The registry's builder of the MAML family: :func:`maml` with ``settings`` for
    ``info``'s tasks (Meta-SGD: ``learn_lr``; ANIL: ``adapt_prefix``)."""
    return maml(apply, kind=info.kind, inner_steps=settings.inner_steps,
                inner_lr=settings.inner_lr, eval_steps=settings.eval_steps,
                first_order=settings.first_order, remat=settings.remat,
                name=name or type(settings).OWNER, learn_lr=learn_lr, adapt_prefix=adapt_prefix)


def build_metasgd(apply: BoundApply, settings: MamlSettings, info: TaskInfo) -> MetaLearner:
    """The registry's builder of Meta-SGD."""
    return build_maml(apply, settings, info, name="metasgd", learn_lr=True)


def build_anil(apply: BoundApply, settings: MamlSettings, info: TaskInfo) -> MetaLearner:
    """The registry's builder of ANIL (adapting the params under ``"head"``)."""
    return build_maml(apply, settings, info, name="anil", adapt_prefix="head")


__all__ = ["InnerLoop", "adapt", "anil", "build_anil", "build_maml", "build_metasgd", "fomaml",
           "maml", "metasgd", "remat_task_grad", "task_loss"]
