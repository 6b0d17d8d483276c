"""What every meta-learning algorithm shares: the task record, losses, and the learner record.

A meta-learner is a few pure functions over a flat dict of *meta-parameters* (the model's
params, plus what a learner learns beside them under a prefix of :data:`LEARNER_PREFIXES`:
Meta-SGD's inner learning rates ``"inner_lr.<name>"``, MAML++'s per-step rates and batch-norm
copies ``"step_lr.<name>"`` and ``"step_bn.<name>"``):

* ``task_grad(meta_params, task) -> (grads, loss, metric)``: the meta-gradient contribution of
  one task (MAML: the gradient of the query loss after adaptation; Reptile: the
  pseudo-gradient ``params - adapted``).
* ``task_eval(meta_params, task) -> (loss, metric)``: adapt on the support set with the
  evaluation settings and score the query set.

Both take one task; :mod:`funcgraph.meta.strategy` runs them over a batch of tasks with
``vmap`` or a loop, and the average over tasks is the meta-gradient.

**Meta-steps.** A learner whose meta-gradient changes over training (MAML++ anneals its
multi-step loss weights and derivative order) says so with a :attr:`MetaLearner.schedule`;
the training loop asks ``learner.at_step(step)`` for the learner of each meta-step and calls
its ``task_grad``. For every other learner ``at_step`` returns the learner itself, so a loop
may always call it and ``task_grad(meta_params, task)`` keeps its signature.

**Keys.** A task may carry a key ``k`` (:attr:`Task.key`): the model's randomness (dropout,
stochastic depth) for that task. Every forward pass of the task gets its own key, derived
with ``fold_in``, so a run is reproducible and resumable bit for bit:

* inner step ``i`` (0-based) forwards the support set with ``fold_in(fold_in(k, 0), i)``
  (:func:`support_keys`); the rematerialised reverse pass of MAML recomputes step ``i`` with
  that same key, so it stays equal to differentiating through the inner loop;
* the query pass after adaptation uses ``fold_in(k, 1)`` (:func:`query_key`).

Support and query keys sit under different first folds, so the query key never equals a
support step's, however many steps evaluation adapts for. Reptile's inner loop (on support
and query together) takes the support keys and its final query forward the query key;
prototypical networks embed the support set with support step 0's key and the query set with
the query key. A task without a key (``key=None``) calls ``apply(params, x)`` exactly as
before keys existed (:func:`call`), so any plain ``f(params, x)`` works; a task with a key
needs an ``apply`` that takes ``key=`` (``funcgraph.bind`` makes one), which the learners
check once when they are built (:func:`~funcgraph.meta.binding.check_apply`, which also
binds a funcgraph Model or an ``nn.Module`` given instead of a function).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import Tensor

from .. import random
from ..checks import check_int
from ..control import in_transform
from ..errors import ConfigError, ShapeError
from ..model import BoundApply, Model
from ..params import Params, partition
from ..random import Key
from .binding import accepts_key, check_apply
from .settings import Settings

LR_PREFIX = "inner_lr."
"""Meta-SGD's learned per-parameter inner learning rates live under this prefix."""

STEP_LR_PREFIX = "step_lr."
"""MAML++'s learned per-step inner learning rates (one per parameter tensor and inner step)."""

STEP_BN_PREFIX = "step_bn."
"""MAML++'s per-step copies of the batch-norm weights and biases (one row per inner step)."""

LEARNER_PREFIXES = (LR_PREFIX, STEP_LR_PREFIX, STEP_BN_PREFIX)
"""The prefixes of meta-parameters that a learner adds beside the model's own."""

_SUPPORT, _QUERY = 0, 1
"""The first fold of a task key: the support steps' stream and the query pass's key."""


RANDOMNESS = "different"
"""``vmap``'s randomness over tasks: a random op of torch's generator inside a task (the
dropout of a converted ``nn.Module``, which takes no key) draws for each task apart, as the
loop draws for one task after another (torch's default, ``"error"``, refuses it). Keyed
randomness (:attr:`Task.key`) draws nothing from the generator."""


@dataclass(frozen=True, eq=False)
class Task:
    """One task, or a batch of tasks with a leading ``T`` dim (a pytree, so ``vmap`` maps it).

    Classification: ``support_x (N*K, C, H, W)``, ``support_y (N*K,)`` int64 labels in
    ``[0, N)``, ``query_x (N*Q, C, H, W)``, ``query_y (N*Q,)``. Regression: ``(K, D)`` inputs
    and ``(K, 1)`` targets. ``key``: the task's model key ``(2,)`` (``(T, 2)`` for a batch;
    see the module docstring), or ``None`` for a model without randomness.

    Iterating yields the four data tensors (``sx, sy, qx, qy = task``); the key is not data.
    A missing key is no pytree leaf, so ``vmap(f, in_dims=(None, 0))(params, tasks)`` maps a
    key-free batch and a keyed one alike.
    """

    support_x: Tensor
    support_y: Tensor
    query_x: Tensor
    query_y: Tensor
    key: Key | None = None

    @classmethod
    def of(cls, batch: Any) -> Task:
        """A :class:`Task` from any object with the four data attributes (the data samplers'
        batch), keeping its ``key`` if it has one."""
        return cls(batch.support_x, batch.support_y, batch.query_x, batch.query_y,
                   getattr(batch, "key", None))

    def __iter__(self) -> Iterator[Tensor]:
        return iter((self.support_x, self.support_y, self.query_x, self.query_y))

    def _map(self, fn: Callable[[Tensor], Any]) -> Task:
        """``fn`` on every tensor; a missing key stays ``None``."""
        sx, sy, qx, qy = (fn(t) for t in self)
        return Task(sx, sy, qx, qy, None if self.key is None else fn(self.key))

    def to(self, device: torch.device | str | None = None,
           dtype: torch.dtype | None = None) -> Task:
        """Move to ``device``; cast floating tensors (inputs, regression targets) to ``dtype``
        (labels and keys are integers and keep their dtype)."""
        return self._map(lambda t: t.to(device=device,
                                        dtype=dtype if t.is_floating_point() else None))

    def pick(self, i: int | slice) -> Task:
        """Task ``i`` (or a slice of tasks) of a batch, with its key."""
        return self._map(lambda t: t[i])

    def with_keys(self, keys: Key) -> Task:
        """This batch with one model key per task: ``keys (T, 2)`` int64 (``random.split``),
        moved to the tasks' device.

        Raises:
            ShapeError: ``keys`` is not an int64 tensor of shape ``(num_tasks, 2)``.
        """
        want = (self.num_tasks, 2)
        if not isinstance(keys, Tensor) or keys.dtype != torch.int64 or keys.shape != want:
            got = (f"{keys.dtype} {tuple(keys.shape)}" if isinstance(keys, Tensor)
                   else type(keys).__name__)
            raise ShapeError(f"Task.with_keys: expected int64 keys of shape {want} (one per "
                             f"task, e.g. random.split(key, {want[0]})), got {got}")
        return replace(self, key=keys.to(self.support_x.device))

    @property
    def num_tasks(self) -> int:
        return int(self.support_x.shape[0])


def _flatten_task(task: Task) -> tuple[list[Tensor], bool]:
    """Pytree leaves of a task: its four tensors, and its key when it has one."""
    # Fields by name, not by iterating the task: torch 2.11's dynamo cannot trace __iter__.
    data = [task.support_x, task.support_y, task.query_x, task.query_y]
    return [*data, *([] if task.key is None else [task.key])], task.key is not None


def _unflatten_task(leaves: Any, keyed: bool) -> Task:
    sx, sy, qx, qy, *key = leaves
    return Task(sx, sy, qx, qy, key[0] if keyed else None)


# A missing key is no leaf at all (a namedtuple's ``None`` field would be one, which vmap
# refuses to map over dim 0; and torch treats every namedtuple alike, registered or not).
pytree.register_pytree_node(Task, _flatten_task, _unflatten_task,
                            serialized_type_name="funcgraph.meta.Task")


def support_keys(key: Key | None, steps: int) -> list[Key | None]:
    """The keys of inner steps ``0..steps-1`` on the support set of a task with ``key``:
    ``fold_in(fold_in(key, 0), i)``; all ``None`` for a key-free task."""
    if key is None:
        return [None] * steps
    stream = random.fold_in(key, _SUPPORT)
    return [random.fold_in(stream, i) for i in range(steps)]


def query_key(key: Key | None) -> Key | None:
    """The key of the query pass of a task with ``key``: ``fold_in(key, 1)``; ``None`` for a
    key-free task."""
    return None if key is None else random.fold_in(key, _QUERY)


def call(apply: BoundApply, params: Params, x: Tensor, key: Key | None) -> Tensor:
    """``apply(params, x)`` without a key, ``apply(params, x, key=key)`` with one.

    The one place that decides how a learner calls the model: key-free tasks run exactly as
    before keys existed, with any plain function of ``(params, x)``.
    """
    if key is None:
        return apply(params, x)
    return apply(params, x, key=key)  # type: ignore[call-arg]  # (no cast: Dynamo traces this)


class Objective(NamedTuple):
    """A training loss and the metric reported beside it (``metric_name`` names it)."""

    loss: Callable[[Tensor, Tensor], Tensor]
    metric: Callable[[Tensor, Tensor], Tensor]
    metric_name: str
    higher_is_better: bool


def accuracy(logits: Tensor, labels: Tensor) -> Tensor:
    """Fraction of rows whose arg-max is the label (a float tensor, no gradient): float32 for
    bfloat16 logits (autocast's), whose 8 significant bits would round the fraction."""
    hits = logits.argmax(dim=-1) == labels
    return hits.to(torch.promote_types(logits.dtype, torch.float32)).mean().detach()


def _mse_metric(pred: Tensor, target: Tensor) -> Tensor:
    return F.mse_loss(pred, target).detach()


OBJECTIVES: dict[str, Objective] = {
    "classification": Objective(F.cross_entropy, accuracy, "acc", True),
    "regression": Objective(F.mse_loss, _mse_metric, "mse", False),
}


def objective(kind: str) -> Objective:
    """The :class:`Objective` for ``"classification"`` (cross-entropy, accuracy) or
    ``"regression"`` (MSE, MSE)."""
    if not isinstance(kind, str) or kind not in OBJECTIVES:
        raise ConfigError(f"objective: kind must be one of {sorted(OBJECTIVES)}, got {kind!r}")
    return OBJECTIVES[kind]


TaskGradFn = Callable[[Params, Task], tuple[Params, Tensor, Tensor]]
"""``(meta_params, task) -> (grads, loss, metric)``."""

TaskEvalFn = Callable[[Params, Task], tuple[Tensor, Tensor]]
"""``(meta_params, task) -> (loss, metric)``."""


@dataclass(frozen=True)
class StepInputs:
    """A :data:`TaskGradFn` whose values that change from meta-step to meta-step are tensors
    passed in, not constants built in: ``fn(meta_params, task, inputs)`` with ``inputs`` this
    step's tensors (MAML++'s multi-step loss weights while they anneal).

    Called as ``task_grad(meta_params, task)`` it is ``fn(meta_params, task, inputs)``, so it
    is a task gradient like any other. What it adds is for ``compile``: the learners of a
    schedule's steps share one ``fn``, so one compiled meta-gradient serves every step, the
    step's ``inputs`` passed as its arguments (:mod:`funcgraph.meta.compiled`). A schedule
    that builds a new function each step cannot compile (:func:`~funcgraph.meta.step.meta_step`
    says so once); give it one ``fn`` and its step's tensors here.

    Attributes:
        fn: ``(meta_params, task, inputs) -> (grads, loss, metric)``, the same for each step.
        inputs: this step's tensors, by name (no gradient flows to them).
    """

    fn: Callable[[Params, Task, Params], tuple[Params, Tensor, Tensor]]
    inputs: Params

    def __call__(self, meta_params: Params, task: Task) -> tuple[Params, Tensor, Tensor]:
        return self.fn(meta_params, task, self.inputs)


def compiled_identity(task_grad: TaskGradFn) -> object:
    """What a compiled meta-gradient of ``task_grad`` is made once for: the shared ``fn`` of
    a :class:`StepInputs`, else the function itself."""
    return task_grad.fn if isinstance(task_grad, StepInputs) else task_grad


@dataclass(frozen=True)
class MetaLearner:
    """A meta-learning algorithm as pure functions; see the module docstring.

    **The contract** a learner written from scratch must meet (``examples/own_learner.py``
    is one, a ridge-regression head, tested in ``tests/test_own_learner.py``):

    * ``task_grad(meta_params, task)`` returns ``(grads, loss, metric)`` for one task: a
      gradient for every name of ``meta_params`` (same shapes), a scalar loss and a scalar
      metric, all without gradient history (:func:`task_grad_of` builds it from a
      differentiable ``(loss, metric)`` function). ``task_eval(meta_params, task)`` returns
      ``(loss, metric)`` with the evaluation settings.
    * Both are pure and run under ``vmap`` as in a loop: no Python branch on a tensor value,
      no ``.item()`` (nor what reads a value, such as ``F.one_hot`` without its class count),
      nothing mutated; the strategies (:func:`~funcgraph.meta.strategy.mean_task_grads`) map
      them over tasks, and the meta-gradient of ``"vmap"`` must equal ``"loop"``'s.
    * A task with a key forwards with :func:`support_keys` / :func:`query_key` (use
      :func:`call`), so runs are reproducible; take the model through
      :func:`~funcgraph.meta.binding.check_apply` to accept a function, a Model or an
      ``nn.Module`` as the built-in learners do, and pass on its ``uses_keys`` and ``model``.
    * ``init`` maps model params to meta-params (the identity, or adding learned entries under
      a prefix of :data:`LEARNER_PREFIXES`); ``objective`` names the loss and metric
      (:func:`objective`), ``settings`` is the typed record it was built from.

    Attributes:
        name: ``"maml"``, ``"fomaml"``, ``"metasgd"``, ``"anil"``, ``"reptile"``, ``"protonet"``.
        init: model params -> meta-params (adds learned learning rates for Meta-SGD).
        task_grad: one task's meta-gradient, loss and metric.
        task_eval: one task's query loss and metric after adaptation with the eval settings.
        objective: the loss/metric pair.
        settings: the typed settings it was built with (:mod:`funcgraph.meta.settings`), for
            the run layer and logs; ``None`` for a learner assembled by hand.
        uses_keys: whether the model takes keys (its apply accepts ``key=``): then tasks
            carrying keys reach it, and :func:`~funcgraph.meta.evaluate.evaluate` attaches
            them; without, tasks must be key-free.
        schedule: for a learner whose meta-gradient depends on the meta-step, ``step -> the
            learner of that step`` (use :meth:`at_step`); ``None`` for the others.
        model: the Model the learner bound for training itself, when it was built from a
            Model or an ``nn.Module``: ``model.init(key)`` gives the initial params
            (:mod:`funcgraph.meta.binding`); ``None`` when it was given a function.
    """

    name: str
    init: Callable[[Params], Params]
    task_grad: TaskGradFn
    task_eval: TaskEvalFn
    objective: Objective
    settings: Settings | None = None
    uses_keys: bool = False
    schedule: Callable[[int], MetaLearner] | None = None
    model: Model | None = None

    def at_step(self, step: int) -> MetaLearner:
        """The learner of meta-step ``step`` (0-based): ``self`` unless it has a schedule.

        Raises:
            ConfigError: ``step`` is not an int >= 0.
        """
        check_int("MetaLearner.at_step", "step", step, minimum=0)
        return self if self.schedule is None else self.schedule(step)


def grad_of(
    fn: Callable[[Params], Tensor], params: Params, *, create_graph: bool = False
) -> Params:
    """``d fn / d params``, by ``torch.func.grad`` inside a transform, else plain autograd.

    Both give the same numbers; outside transforms (the loop strategy) plain
    ``torch.autograd.grad`` avoids the per-op cost of functorch's wrappers, which made a looped
    MAML step slower than the clone-and-adapt baseline (benchmarks/meta_step.py times both).
    ``create_graph`` keeps the result differentiable (second order); inside a transform that
    is automatic and ``create_graph=False`` detaches the result instead.
    """
    if in_transform():
        grads = torch.func.grad(fn)(params)
        return grads if create_graph else {n: g.detach() for n, g in grads.items()}
    leaves = {n: p if p.requires_grad else p.detach().requires_grad_() for n, p in params.items()}
    with torch.enable_grad():
        out = fn(leaves)
        grads = torch.autograd.grad(out, list(leaves.values()), create_graph=create_graph,
                                    allow_unused=True)
    return {n: torch.zeros_like(p) if g is None else g
            for (n, p), g in zip(leaves.items(), grads, strict=True)}


def task_grad_of(fn: Callable[[Params, Task], tuple[Tensor, Tensor]]) -> TaskGradFn:
    """A :data:`TaskGradFn` from a differentiable ``fn(meta_params, task) -> (loss, metric)``."""

    def task_grad(meta_params: Params, task: Task) -> tuple[Params, Tensor, Tensor]:
        out: dict[str, Tensor] = {}

        def loss_only(p: Params) -> Tensor:
            loss, metric = fn(p, task)
            out["loss"], out["metric"] = loss.detach(), metric.detach()
            return loss

        if in_transform():
            grads, (loss, metric) = torch.func.grad_and_value(fn, has_aux=True)(meta_params, task)
            return grads, loss.detach(), metric
        grads = grad_of(loss_only, {n: p.detach() for n, p in meta_params.items()})
        return grads, out["loss"], out["metric"]

    return task_grad


def model_params(meta_params: Params) -> Params:
    """The model's own params in ``meta_params``: drops what learners add under
    :data:`LEARNER_PREFIXES` (learned rates, per-step copies). MAML++ with per-step batch norm
    keeps no single copy of the norm params; :func:`~funcgraph.meta.mamlpp.step_params` gives
    the model's complete params at an inner step."""
    return partition(meta_params, lambda n: n.startswith(LEARNER_PREFIXES))[1]


__all__ = [
    "LEARNER_PREFIXES",
    "LR_PREFIX",
    "OBJECTIVES",
    "RANDOMNESS",
    "STEP_BN_PREFIX",
    "STEP_LR_PREFIX",
    "MetaLearner",
    "Objective",
    "StepInputs",
    "Task",
    "TaskEvalFn",
    "TaskGradFn",
    "accepts_key",
    "accuracy",
    "call",
    "check_apply",
    "compiled_identity",
    "grad_of",
    "model_params",
    "objective",
    "query_key",
    "support_keys",
    "task_grad_of",
]
