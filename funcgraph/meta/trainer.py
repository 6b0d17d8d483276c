"""The short path of meta-training: a learner, an optimiser and one state record.

As Flax's ``TrainState`` and Optax's ``init``/``update``: three calls cover the common case,
and everything they do is the long path's public pieces, so leaving the short path costs
nothing learnt::

    learner = maml(MyNet(), kind="regression")       # an nn.Module, bound for training
    trainer = MetaTrainer(learner)                    # Adam at the algorithm's meta rate
    state = trainer.init(random.key(0))               # params, optimiser state, step, key
    for batch in tasks("sinusoid", "10shot", batch=8, count=100):
        state, metrics = trainer.step(state, batch)   # one meta_step
    print(trainer.evaluate(state, tasks("sinusoid", "10shot", batch=50, count=4,
                                        split="test")))

**Pure.** :class:`MetaTrainer` holds only what was chosen when it was built (the learner,
the optimiser, the strategy, the precision); everything that changes is in the frozen
:class:`TrainState` that ``step`` takes and returns. The same state and tasks give the same
new state.

**Where the params come from.** ``init(key)`` draws the model's params with
``learner.model.init`` (a learner built from a Model or an ``nn.Module`` keeps that Model;
:mod:`funcgraph.meta.binding`), then adds the learner's own meta-parameters
(``learner.init``) and starts the optimiser. A learner built from a bound function has no
model: pass the params, ``init(key, params)``.

**Keys.** ``init`` splits its key in two: one draws the params, the other is the state's
root key. When the learner's model takes keys (dropout), meta-step ``s`` gives task ``t`` of
its batch the key ``split(fold_in(state.key, s), T)[t]``, unless the tasks carry their own.

**The long path** (:func:`~funcgraph.meta.step.meta_step`,
:func:`~funcgraph.meta.evaluate.evaluate`, your own loop) is the place for a learning-rate
schedule, explicit task keys, a data-parallel reduce or checkpoints
(``funcgraph.train.save_checkpoint``) between steps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .. import random
from ..checks import check_choice, check_int
from ..errors import ConfigError
from ..params import Params
from ..precision import check_precision
from ..random import Key
from ..train import Optimizer, adam
from .compiled import Backend, CompileRecord, recording
from .evaluate import EvalResult, evaluate
from .learner import MetaLearner, Task
from .registry import DEFAULT_META_LR, algorithm_names, algorithm_type
from .step import StepMetrics, meta_step
from .strategy import STRATEGIES, check_compiled_strategy
from .task_stream import TaskStream

_EVAL_TAG = 0x6576616C
"""``fold_in`` tag of the key that scores one batch of tasks (ASCII ``"eval"``)."""


@dataclass(frozen=True)
class TrainState:
    """Everything meta-training carries from one step to the next; ``step`` returns a new one.

    Attributes:
        params: the meta-parameters (the model's params and what the learner learns beside
            them, e.g. Meta-SGD's rates).
        opt_state: the optimiser's state.
        step: meta-steps taken (0 after ``init``).
        key: the root key of the model's randomness (see the module docstring).
    """

    params: Params
    opt_state: Params
    step: int
    key: Key


@dataclass(frozen=True, init=False)
class MetaTrainer:
    """A learner and an optimiser: ``init(key) -> state``, ``step(state, tasks) -> (state,
    metrics)``, ``evaluate(state, tasks) -> result``; see the module docstring.

    Arguments:
        learner: any :class:`~funcgraph.meta.learner.MetaLearner` (``maml(module)``, ...).
        optimizer: a pure optimiser; default Adam at the algorithm's meta learning rate (its
            registry recipe's, else :data:`~funcgraph.meta.registry.DEFAULT_META_LR`, as
            ``funcgraph meta-train`` starts from).
        strategy: how tasks run, ``"auto"`` (the measured default for the device and task
            size), ``"loop"``, ``"threads"`` or ``"vmap"``.
        chunk_size: tasks ``"vmap"`` maps at a time, the bound on its memory (``None``: the
            device's default, 16 on CPU; :func:`~funcgraph.meta.strategy.default_chunk_size`).
        precision: ``"float32"`` or ``"bf16"`` (:mod:`funcgraph.precision`).
        compile: compile each meta-step's whole meta-gradient with ``torch.compile``
            (:mod:`funcgraph.meta.compiled`; ``True`` for torch's default backend, or a
            backend, by name or callable); the first step compiles.

    After a step, :attr:`compiled` says whether its meta-gradient ran compiled and
    :attr:`compile_reason` why not; :attr:`compile_seconds` is the time the steps that
    compiled took.

    Raises:
        ConfigError: an argument of the wrong kind.
    """

    learner: MetaLearner
    optimizer: Optimizer
    strategy: str
    chunk_size: int | None
    precision: str
    compile: bool | Backend

    def __init__(self, learner: MetaLearner, optimizer: Optimizer | None = None, *,
                 strategy: str = "auto", chunk_size: int | None = None,
                 precision: str = "float32", compile: bool | Backend = False) -> None:
        if not isinstance(learner, MetaLearner):
            raise ConfigError(f"MetaTrainer: learner must be a MetaLearner (maml(module), "
                              f"protonet(...), ...), got {type(learner).__name__}")
        if optimizer is None:
            optimizer = adam(algorithm_type(learner.name).meta_lr()
                             if learner.name in algorithm_names() else DEFAULT_META_LR)
        if not isinstance(optimizer, Optimizer):
            raise ConfigError(f"MetaTrainer: optimizer must be None or a funcgraph.train "
                              f"Optimizer (adam(lr), sgd(lr)), got {type(optimizer).__name__}")
        check_choice("MetaTrainer", "strategy", strategy, ("auto", *STRATEGIES))
        if chunk_size is not None:
            check_int("MetaTrainer", "chunk_size", chunk_size)
        check_precision("MetaTrainer", precision)
        if not (isinstance(compile, bool | str) or callable(compile)):
            raise ConfigError(f"MetaTrainer: compile must be True, False or a torch.compile "
                              f"backend (its name, or a callable one), got {compile!r}")
        check_compiled_strategy("MetaTrainer", compile, strategy)
        for name, value in (("learner", learner), ("optimizer", optimizer),
                            ("strategy", strategy), ("chunk_size", chunk_size),
                            ("precision", precision),
                            ("compile", compile)):
            object.__setattr__(self, name, value)
        # What the steps did, not what was chosen: no field (kept out of eq and repr).
        object.__setattr__(self, "_record", CompileRecord())

    @property
    def compiled(self) -> bool | None:
        """Whether the last step's meta-gradient ran compiled: ``None`` before the first
        step, ``False`` without ``compile`` or where it ran eagerly (:attr:`compile_reason`
        says why)."""
        record: CompileRecord = self.__dict__["_record"]
        return record.compiled

    @property
    def compile_reason(self) -> str | None:
        """Why the last step's meta-gradient did not run compiled (``None`` when it did, or
        before the first step)."""
        record: CompileRecord = self.__dict__["_record"]
        return record.reason

    @property
    def compile_seconds(self) -> float:
        """Seconds the steps that compiled took (the compiling included); 0 when none did."""
        record: CompileRecord = self.__dict__["_record"]
        return record.seconds

    def init(self, key: Key, params: Params | None = None) -> TrainState:
        """The state before the first meta-step.

        Arguments:
            key: one key; half of it draws the params, the other is the state's root key.
            params: the model's params, for a learner built from a function (which has no
                model to draw them from); ``None``: ``learner.model.init``'s.

        Raises:
            ConfigError: no params and a learner without a model, or a model without
                parameters.
        """
        key = random.check_key("MetaTrainer.init", key, batch=False)
        draw, root = random.split(key, 2)
        if params is None:
            if self.learner.model is None:
                raise ConfigError(
                    f"MetaTrainer.init: the {self.learner.name} learner was given a function, "
                    "so it has no model to draw params from; pass them, init(key, params), or "
                    "build the learner from the Model or nn.Module itself")
            params, _ = self.learner.model.init(draw)
            if not params:
                raise ConfigError(
                    f"MetaTrainer.init: the {self.learner.name} learner's model has no "
                    "parameters, so there is nothing to meta-train; give it a model with "
                    "learnable weights (an nn.Module's nn.Parameter, a Model's params)")
        elif not isinstance(params, dict) or not params:
            raise ConfigError(f"MetaTrainer.init: params must be None or a non-empty dict of "
                              f"tensors, got {type(params).__name__}")
        meta_params = self.learner.init(dict(params))
        return TrainState(meta_params, self.optimizer.init(meta_params), 0, root)

    def step(self, state: TrainState, tasks: Task) -> tuple[TrainState, StepMetrics]:
        """One meta-step on a batch of tasks: ``(the new state, the tasks' mean loss and
        metric)``.

        The tasks (a :class:`~funcgraph.meta.learner.Task` batch, or any batch with the four
        data attributes) are moved to the params' device and floating dtype; a learner whose
        model takes keys gets one per task (see the module docstring).
        """
        _check_state("MetaTrainer.step", state)
        tasks = tasks if isinstance(tasks, Task) else Task.of(tasks)
        if self.learner.uses_keys and tasks.key is None:
            tasks = tasks.with_keys(random.split(random.fold_in(state.key, state.step),
                                                 tasks.num_tasks))
        like = _first(state.params)
        record: CompileRecord = self.__dict__["_record"]
        with recording(record):
            params, opt_state, metrics = meta_step(
                self.learner, self.optimizer, state.params, state.opt_state,
                tasks.to(like.device, like.dtype), step=state.step, strategy=self.strategy,
                chunk_size=self.chunk_size, precision=self.precision, compile=self.compile)
        if not self.compile:
            record.ran(False, "compile=False")
        return replace(state, params=params, opt_state=opt_state, step=state.step + 1), metrics

    def evaluate(self, state: TrainState, tasks: TaskStream | Task) -> EvalResult:
        """Adapt on held-out tasks' support sets and score their queries: the mean metric
        +- 95% CI (:func:`~funcgraph.meta.evaluate.evaluate`, with the evaluation settings).

        Arguments:
            tasks: a finite :class:`~funcgraph.meta.task_stream.TaskStream` (``tasks(...,
                count=N)``; the same tasks its iteration yields) or one batch of tasks.
        """
        _check_state("MetaTrainer.evaluate", state)
        like = _first(state.params)
        if isinstance(tasks, TaskStream):
            sample, key, episodes, batch = tasks.sample, tasks.key, tasks.episodes, tasks.batch
        elif isinstance(tasks, Task):
            one = tasks
            sample, key = (lambda k, n: one), random.fold_in(state.key, _EVAL_TAG)
            episodes = batch = tasks.num_tasks
        else:
            raise ConfigError(f"MetaTrainer.evaluate: tasks must be a TaskStream (tasks(..., "
                              f"count=N)) or a Task batch, got {type(tasks).__name__}")
        return evaluate(self.learner, state.params, sample, key=key, episodes=episodes,
                        batch=batch, strategy=self.strategy, device=like.device,
                        dtype=like.dtype, precision=self.precision)


def _check_state(who: str, state: object) -> None:
    if not isinstance(state, TrainState):
        raise ConfigError(f"{who}: state must be the TrainState that init or step returned, "
                          f"got {type(state).__name__}")


def _first(params: Params) -> torch.Tensor:
    """A tensor of ``params``: where and in what dtype the meta-parameters live."""
    return next(iter(params.values()))


__all__ = ["MetaTrainer", "TrainState"]
