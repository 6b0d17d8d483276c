"""MAML++ (Antoniou et al., "How to train your MAML", ICLR 2019) as a :class:`MetaLearner`.

MAML's inner loop and second-order meta-gradient (:mod:`funcgraph.meta.maml_family`) with the
paper's fixes, each one switchable; with all of them off the learner is MAML, bit for bit:

* **LSLR** (``lslr``): learned per-step inner learning rates, one per *parameter tensor* and
  inner step, meta-params ``"step_lr.<name>"`` of shape ``(inner_steps,)`` initialised to
  ``inner_lr``. Per tensor rather than per layer, as the authors' code does (its LSLR rule
  keeps one rate vector per named parameter), so a layer's weight and bias learn separate
  rates; Meta-SGD (``maml(learn_lr=True)``) learns one rate per entry instead.
* **MSL** (``multi_step_loss``): the task loss is ``sum_i w_i * L_query(after step i)``, the
  query loss after every inner step weighted by :func:`msl_weights`, which starts uniform
  and anneals towards the last step over ``msl_anneal_steps`` meta-steps; after that, only
  the last step counts (the paper's schedule). The loss a task reports is this weighted sum.
* **Derivative-order annealing** (``first_order_until``): first order for meta-steps
  ``0 .. first_order_until - 1``, second order after.
* **BNWB** (``per_step_bn``): per-step batch-norm weights and biases. Every param whose name
  ends in one of ``bn_suffixes`` (conv4's ``"blockN.norm.weight"``/``"blockN.norm.bias"``)
  is replaced by ``"step_bn.<name>"`` of shape ``(inner_steps, *shape)``: row ``i`` is used
  by inner step ``i``'s support pass and by the query pass after step ``i``. The rows are
  meta-learned and not adapted in the inner loop (the authors' default). :func:`step_params`
  gives the model's complete params at a step, for use outside the learner.
* **BNRS** (per-step running statistics, used at evaluation; :mod:`.running_stats`): training
  stays transductive (every forward normalises with its own batch's statistics, as MAML is
  run), and ``step_running_stats`` accumulates one set of batch-norm running statistics per
  inner step on the model's twin with running statistics (``conv4(..., running_stats=True)``),
  with batch norm's own momentum update over training-split tasks adapted as evaluation
  adapts. ``with_step_running_stats`` gives the learner whose query pass normalises with the
  row of the adapted params: each query example is scored on its own (non-transductive),
  which is what a deployed few-shot model that sees one query at a time needs; the support
  passes keep the support set's statistics (why: that function's docs). The paper updates the
  rows during meta-training; accumulating them from the finished meta-params instead keeps
  the meta-step pure and the statistics free of the lag behind the changing weights, and
  costs the adaptation of a few hundred tasks.
* **Cosine annealing of the meta learning rate** belongs to the outer loop (the optimiser's
  learning rate; :func:`funcgraph.train.optim.cosine_lr`), not to the learner.

**The meta-step.** The MSL weights and the derivative order depend on the meta-step ``t``;
the learner keeps ``task_grad(meta_params, task)`` and carries a
:attr:`~funcgraph.meta.learner.MetaLearner.schedule`: ``learner.at_step(t)`` is the learner
of meta-step ``t``, whose ``task_grad`` has that step's order built in and its weights
passed in: while they anneal, as a tensor (a :class:`~funcgraph.meta.learner.StepInputs`,
one function for every annealing step, so ``compile`` compiles it once, from the first
step), after the anneal as constants (the zero-weighted query passes skipped).
:func:`mamlpp` returns the learner of step 0; a training loop calls ``at_step(step)`` every
meta-step.

**Evaluation** adapts for ``eval_steps`` first-order steps and scores the last one; steps at
or beyond ``inner_steps`` reuse the last step's learned rate and batch-norm row.

Keys: inner step ``i`` forwards the support set with support key ``i``, and every query pass
(one per weighted step) uses the task's query key, so the per-step query losses see the same
dropout masks and differ only by the adaptation (the schedule is in
:mod:`funcgraph.meta.learner`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor

from ..checks import check_int, check_sequence
from ..errors import ConfigError
from ..model import BoundApply
from ..params import Params, select
from ..random import Key
from .adapted import AdaptThenScore, Predict, predicting
from .binding import ModelLike
from .learner import (
    STEP_BN_PREFIX,
    STEP_LR_PREFIX,
    MetaLearner,
    Objective,
    StepInputs,
    Task,
    TaskGradFn,
    call,
    check_apply,
    grad_of,
    model_params,
    objective,
    support_keys,
    task_grad_of,
)
from .maml_family import _query_score
from .registry import TaskInfo
from .settings import MAMLPP_META_STEPS, MamlppSettings

BN_SUFFIXES = ("norm.weight", "norm.bias")
"""The default names of batch-norm params that get per-step copies (conv4's blocks)."""

MSL_FLOOR = 0.03
"""Annealed non-final MSL weights never drop below ``MSL_FLOOR / inner_steps`` (the paper's
code) until annealing ends."""


def msl_weights(steps: int, meta_step: int, anneal_steps: int) -> tuple[float, ...]:
    """The multi-step loss weights of the query losses after inner steps ``0..steps-1`` at
    meta-step ``meta_step`` (0-based); they sum to 1.

    The paper's schedule: uniform ``1/steps`` at meta-step 0; each earlier step's weight then
    falls by ``1 / (steps * anneal_steps)`` per meta-step, to a floor of ``0.03 / steps``,
    and the last step's weight rises by what they lose; from meta-step ``anneal_steps`` on,
    the last step alone counts (weights ``(0, ..., 0, 1)``).
    """
    check_int("msl_weights", "steps", steps)
    check_int("msl_weights", "meta_step", meta_step, minimum=0)
    check_int("msl_weights", "anneal_steps", anneal_steps)
    if meta_step >= anneal_steps:
        return (0.0,) * (steps - 1) + (1.0,)
    floor = MSL_FLOOR / steps
    decay = meta_step / (steps * anneal_steps)
    earlier = max(1.0 / steps - decay, floor)  # each step's weight before the last
    last = min(1.0 / steps + (steps - 1) * decay, 1.0 - (steps - 1) * floor)
    return (earlier,) * (steps - 1) + (last,)


def _row(rows: Tensor, step: int) -> Tensor:
    """Row ``step`` of a per-step tensor; steps past the last row reuse the last row."""
    return rows[min(step, rows.shape[0] - 1)]


def _per_step(meta_params: Params, prefix: str) -> Params:
    """The per-step tensors under ``prefix``, by model param name."""
    return select(meta_params, prefix)


def _with_bn(params: Params, bn: Params, step: int) -> Params:
    """``params`` with the batch-norm rows of inner step ``step`` under their model names."""
    return {**params, **{n: _row(rows, step) for n, rows in bn.items()}}


def step_params(meta_params: Params, step: int) -> Params:
    """The model's complete params at inner step ``step`` (0-based): the model params of
    ``meta_params`` with row ``step`` of each per-step batch-norm copy (the last row past
    the trained steps). Without per-step batch norm this is
    :func:`~funcgraph.meta.learner.model_params`."""
    check_int("step_params", "step", step, minimum=0)
    return _with_bn(model_params(meta_params), _per_step(meta_params, STEP_BN_PREFIX), step)


def mamlpp_loss(
    apply: BoundApply,
    meta_params: Params,
    task: Task,
    *,
    objective: Objective,
    steps: int,
    inner_lr: float,
    first_order: bool,
    weights: Sequence[float] | Tensor | None,
) -> tuple[Tensor, Tensor]:
    """``(task loss, query metric after the last step)`` of one task; differentiate it for
    the meta-gradient.

    The inner loop adapts every model param in ``meta_params`` for ``steps`` SGD steps, with
    the learned rates ``"step_lr.<name>"`` where present (else ``inner_lr``) and the
    batch-norm rows ``"step_bn.<name>"`` of each step where present (not adapted).
    ``weights``: the MSL weight of the query loss after each step (:func:`msl_weights`),
    zero weights skipping that query pass, or a ``(steps,)`` tensor of them (every pass taken;
    what a compiled meta-gradient takes as an argument); ``None`` scores the last step alone,
    unweighted, exactly as :func:`~funcgraph.meta.maml_family.task_loss`.

    Raises:
        ConfigError: ``weights`` has not one entry per inner step.
    """
    if weights is not None and (steps < 1 or len(weights) != steps):
        raise ConfigError(f"mamlpp_loss: weights must have one entry per inner step, with "
                          f"steps >= 1 (steps={steps}), got {tuple(weights)}")
    fast = model_params(meta_params)
    rates = _per_step(meta_params, STEP_LR_PREFIX)
    bn = _per_step(meta_params, STEP_BN_PREFIX)

    def support_loss(f: Params, step: int, step_key: Key | None) -> Tensor:
        pred = call(apply, _with_bn(f, bn, step), task.support_x, step_key)
        return objective.loss(pred, task.support_y)

    terms: list[Tensor] = []
    for step, step_key in enumerate(support_keys(task.key, steps)):
        grads = grad_of(partial(support_loss, step=step, step_key=step_key), fast,
                        create_graph=not first_order)
        fast = _sgd_step(fast, grads, rates, inner_lr, step)
        if weights is not None and step < steps - 1 and (
                isinstance(weights, Tensor) or weights[step]):
            loss, _ = _query_score(apply, _with_bn(fast, bn, step), task, objective)
            terms.append(_weight(weights, step, loss) * loss)
    loss, metric = _query_score(apply, _with_bn(fast, bn, max(steps - 1, 0)), task, objective)
    if weights is None:
        return loss, metric
    return torch.stack([*terms, _weight(weights, steps - 1, loss) * loss]).sum(), metric


def mamlpp_adapt(apply: BoundApply, meta_params: Params, x: Tensor, y: Tensor,
                 key: Key | None, *, objective: Objective, steps: int,
                 inner_lr: float) -> Predict:
    """The adapted model of one task as evaluation adapts it: ``steps`` first-order steps on
    the support set ``(x, y)`` as in :func:`mamlpp_loss`, predicting with the batch-norm row
    of the last step (the query pass :func:`mamlpp_loss` scores with ``weights=None``)."""
    fast = model_params(meta_params)
    rates = _per_step(meta_params, STEP_LR_PREFIX)
    bn = _per_step(meta_params, STEP_BN_PREFIX)

    def support_loss(f: Params, step: int, step_key: Key | None) -> Tensor:
        return objective.loss(call(apply, _with_bn(f, bn, step), x, step_key), y)

    for step, step_key in enumerate(support_keys(key, steps)):
        grads = grad_of(partial(support_loss, step=step, step_key=step_key), fast)
        fast = _sgd_step(fast, grads, rates, inner_lr, step)
    return predicting(apply, _with_bn(fast, bn, max(steps - 1, 0)), key)


def _weight(weights: Sequence[float] | Tensor, step: int, loss: Tensor) -> float | Tensor:
    """The weight of step ``step``: a float, or its tensor entry rounded to the loss's dtype
    (what multiplying by the float does), so both give the same loss bit for bit."""
    w = weights[step]
    return w.to(loss.dtype) if isinstance(w, Tensor) else w


def _sgd_step(fast: Params, grads: Params, rates: Params, inner_lr: float, step: int) -> Params:
    """One inner SGD step with the learned rates of ``step`` where present."""
    return {n: p - (_row(rates[n], step) if rates else inner_lr) * grads[n]
            for n, p in fast.items()}


def _check_per_step_bn(per_step_bn: object, bn_suffixes: object) -> tuple[str, ...]:
    """The batch-norm options of :func:`mamlpp` checked: the suffixes as a tuple."""
    if per_step_bn is not None and not isinstance(per_step_bn, bool):
        raise ConfigError(f"mamlpp: per_step_bn must be None (when the model has batch norm), "
                          f"True or False, got {per_step_bn!r}")
    suffixes = check_sequence("mamlpp", "bn_suffixes", bn_suffixes, "param-name suffixes (str)")
    if not suffixes or not all(isinstance(s, str) and s for s in suffixes):
        raise ConfigError(f"mamlpp: bn_suffixes must be a non-empty sequence of non-empty "
                          f"strings (param-name endings such as 'norm.weight'), got "
                          f"{bn_suffixes!r}")
    return tuple(suffixes)


def _meta_params(params: Params, *, inner_steps: int, inner_lr: float, lslr: bool,
                 per_step_bn: bool | None, suffixes: tuple[str, ...]) -> Params:
    """MAML++'s meta-params of the model's ``params`` (the learner's ``init``): the adapted
    params, with LSLR their rates ``"step_lr.<name>"`` (``(inner_steps,)``, from
    ``inner_lr``), and with per-step batch norm the params ending in ``suffixes`` as
    ``"step_bn.<name>"`` (``(inner_steps, *shape)``, every row the param)."""
    norms = [n for n in params if n.endswith(suffixes)] if per_step_bn is not False else []
    if per_step_bn and not norms:
        raise ConfigError(f"mamlpp: per_step_bn=True but no param name ends in "
                          f"{list(suffixes)} (names: {list(params)[:4]}...); pass "
                          "bn_suffixes naming the batch-norm params, or per_step_bn=False")
    adapted = {n: p for n, p in params.items() if n not in norms}
    rates = {STEP_LR_PREFIX + n: torch.full((inner_steps,), inner_lr, dtype=p.dtype,
                                            device=p.device)
             for n, p in adapted.items()} if lslr else {}
    copies = {STEP_BN_PREFIX + n: params[n].expand(inner_steps, *params[n].shape).clone()
              for n in norms}
    return {**adapted, **rates, **copies}


def mamlpp(
    apply: ModelLike,
    *,
    kind: str = "classification",
    inner_steps: int = MamlppSettings.inner_steps,
    inner_lr: float = MamlppSettings.inner_lr,
    eval_steps: int | None = MamlppSettings.eval_steps,
    lslr: bool = MamlppSettings.lslr,
    multi_step_loss: bool = MamlppSettings.multi_step_loss,
    msl_anneal_steps: int | None = MamlppSettings.msl_anneal_steps,
    meta_steps: int = MAMLPP_META_STEPS,
    first_order_until: int = MamlppSettings.first_order_until,
    per_step_bn: bool | None = None,
    bn_suffixes: Sequence[str] = BN_SUFFIXES,
    name: str = "mamlpp",
) -> MetaLearner:
    """MAML++ as a :class:`MetaLearner` (the learner of meta-step 0; see the module docs for
    the pieces and for ``at_step``).

    Arguments:
        apply: ``f(params, x) -> prediction`` (``funcgraph.bind(model, state, train=True)``),
            or a Model or ``nn.Module`` bound for training by the learner
            (:mod:`funcgraph.meta.binding`); tasks with keys need it to take ``key=``.
        kind: ``"classification"`` (cross-entropy, accuracy) or ``"regression"`` (MSE).
        inner_steps: steps of the training inner loop, ``>= 1``.
        inner_lr: its rate (the initial learned rates with ``lslr``); the paper takes 5
            steps, one is as good on
            glyphs at half the cost (:class:`~funcgraph.meta.settings.MamlppSettings`).
        eval_steps: inner steps at evaluation (``None``: ``inner_steps``).
        lslr: learn one inner rate per parameter tensor and step.
        multi_step_loss: weight the query loss of every step (:func:`msl_weights`).
        msl_anneal_steps: meta-steps over which the MSL weights anneal to the last step;
            ``None``: 15% of ``meta_steps``, as the paper anneals over the first 15 of 100
            epochs.
        meta_steps: the meta-steps of the training run (for the ``None`` anneal).
        first_order_until: meta-steps ``< first_order_until`` are first order (0: never).
        per_step_bn: per-step batch-norm weights and biases: ``None`` when any param name
            ends in ``bn_suffixes``, ``True`` requires one (checked by ``init``).
        bn_suffixes: the name endings of the batch-norm params.
        name: the learner's name, for logs.

    Raises:
        ConfigError: an argument out of range (naming it and the value).
    """
    check_int("mamlpp", "inner_steps", inner_steps)
    settings = MamlppSettings(inner_steps, inner_lr,
                              inner_steps if eval_steps is None else eval_steps,
                              msl_anneal_steps, first_order_until, lslr, multi_step_loss)
    anneal = settings.anneal_steps(check_int("mamlpp", "meta_steps", meta_steps))
    eval_count = settings.eval_steps
    if not (isinstance(name, str) and name):
        raise ConfigError(f"mamlpp: name must be a non-empty string, got {name!r}")
    apply, uses_keys, model = check_apply(apply, name)
    obj = objective(kind)
    init = partial(_meta_params, inner_steps=inner_steps, inner_lr=inner_lr, lslr=lslr,
                   per_step_bn=per_step_bn, suffixes=_check_per_step_bn(per_step_bn, bn_suffixes))
    task_eval = AdaptThenScore(partial(mamlpp_adapt, apply, objective=obj, steps=eval_count,
                                       inner_lr=inner_lr), obj)
    loss = partial(mamlpp_loss, apply, objective=obj, steps=inner_steps, inner_lr=inner_lr)

    def learner(task_grad: TaskGradFn) -> MetaLearner:
        """The learner of the meta-steps that share ``task_grad``."""
        return MetaLearner(name, init, task_grad, task_eval, obj, settings, uses_keys=uses_keys,
                           schedule=at_step, model=model)

    by_values: dict[tuple[Any, ...], MetaLearner] = {}
    annealing: dict[bool, Callable[[Params, Task, Params], tuple[Params, Tensor, Tensor]]] = {}

    def annealed(first_order: bool
                 ) -> Callable[[Params, Task, Params], tuple[Params, Tensor, Tensor]]:
        """The task gradient while the MSL weights anneal, the weights its argument: one
        function for every annealing step of this derivative order."""
        if first_order not in annealing:
            def task_grad(meta_params: Params, task: Task, inputs: Params
                          ) -> tuple[Params, Tensor, Tensor]:
                return task_grad_of(partial(loss, first_order=first_order,
                                            weights=inputs["msl_weights"]))(meta_params, task)

            annealing[first_order] = task_grad
        return annealing[first_order]

    def at_step(step: int) -> MetaLearner:
        """The learner of meta-step ``step``: its MSL weights and derivative order. While the
        weights anneal they are a tensor the step's learner passes in (:class:`StepInputs`),
        so every annealing step of one derivative order shares one function and one
        compiled meta-gradient; after the anneal the steps share one learner."""
        weights = msl_weights(inner_steps, step, anneal) if multi_step_loss else None
        first_order = step < first_order_until
        if weights is not None and step < anneal:
            # float64 holds each Python float exactly; the loss rounds it as a float would be
            inputs = {"msl_weights": torch.tensor(weights, dtype=torch.float64)}
            return learner(StepInputs(annealed(first_order), inputs))
        if (weights, first_order) not in by_values:
            by_values[weights, first_order] = learner(
                task_grad_of(partial(loss, first_order=first_order, weights=weights)))
        return by_values[weights, first_order]

    return at_step(0)


def build_mamlpp(apply: BoundApply, settings: MamlppSettings, info: TaskInfo) -> MetaLearner:
    """The registry's builder: :func:`mamlpp` with ``settings`` for ``info``'s tasks and run
    length."""
    return mamlpp(apply, kind=info.kind, inner_steps=settings.inner_steps,
                  inner_lr=settings.inner_lr, eval_steps=settings.eval_steps,
                  lslr=settings.lslr, multi_step_loss=settings.multi_step_loss,
                  msl_anneal_steps=settings.msl_anneal_steps, meta_steps=info.meta_steps,
                  first_order_until=settings.first_order_until, name=type(settings).OWNER)


__all__ = ["BN_SUFFIXES", "MSL_FLOOR", "build_mamlpp", "mamlpp", "mamlpp_adapt", "mamlpp_loss",
           "msl_weights", "step_params"]
