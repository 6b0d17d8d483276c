"""The plan of a ``funcgraph meta-train`` run: its model, learner, keys and meta-parameters,
checked before anything is written.

:func:`plan_meta_train` resolves the model (the built-in conv4 or MLP sized from the tasks,
or a factory config), builds the learner through the algorithm registry with its typed
settings (:func:`build_learner`), initialises the meta-parameters from the run's keys
(:class:`RunKeys`), runs one task through them (:func:`check_fit`) and refuses a meta-batch
the device's free memory cannot hold: what ``--dry-run`` shows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import torch

from ... import random
from ...errors import ConfigError
from ...meta.evaluate import EVAL_BATCH, TaskSampler
from ...meta.learner import MetaLearner, Task
from ...meta.registry import algorithm_type
from ...meta.strategy import (
    STRATEGIES,
    default_chunk_size,
    examples_per_task,
    resolve_strategy,
)
from ...model import Model, bind
from ...params import Params, count, nbytes
from ...placement import placed_model
from ...random import Key
from ..memory import (
    MemoryEstimate,
    allocated_bytes,
    available_bytes,
    check_memory,
    check_task_sizes,
    fmt_bytes,
    resident_bytes,
)
from ..probe import probe
from ..resolve import ModelSpec, resolve_model, with_overrides
from ..task_sources import TaskSources
from .config import MetaTrainConfig, algorithm_settings, task_info


def default_model_config(algo: str, sources: TaskSources) -> ModelSpec:
    """``config["model"]`` for the built-in models: conv4 (no head for protonet; its width the
    algorithm's recipe's, else 64) or the MLP."""
    if sources.kind == "regression":
        return {"name": "mlp", "in_features": 1, "out_features": 1, "hidden": [40, 40]}
    hidden = algorithm_type(algo).recipe.hidden or 64  # the algorithm's recipe may say
    return {"name": "conv4", "ways": None if algo == "protonet" else sources.ways,
            "in_channels": sources.in_channels, "hidden": hidden,
            "image_size": sources.image_size, "variant": "strided"}


def model_config(algo: str, sources: TaskSources, *, factory: str | None = None,
                 overrides: Mapping[str, str] | None = None) -> ModelSpec:
    """The resolved ``config["model"]``: the built-in model with ``--set`` overrides, or
    ``{"factory": path_or_name, "overrides": {...}}`` for a :mod:`funcgraph.factory` config."""
    overrides = dict(overrides or {})
    if factory == "resnet12":  # a backbone sized from the tasks, like the default conv4
        spec = {"name": "resnet12", "ways": None if algo == "protonet" else sources.ways,
                "in_channels": sources.in_channels}
        return with_overrides(spec, overrides)
    if factory is not None:
        return {"factory": str(factory), "overrides": overrides}
    return with_overrides(default_model_config(algo, sources), overrides)


def run_model(cfg: MetaTrainConfig, place: str | None = None) -> Model:
    """The model ``cfg.model``, its params spread over devices by the placement plan
    ``place`` when one is given (:func:`funcgraph.placement.placed_model`)."""
    model = resolve_model(cfg.model)
    return model if place is None else placed_model(model, place)


def build_learner(cfg: MetaTrainConfig, sources: TaskSources, model: Model) -> MetaLearner:
    """The meta-learner ``cfg.algo`` over ``model`` (:func:`run_model` of ``cfg``): the
    registry's builder with the algorithm's typed settings from ``cfg``."""
    info = task_info(cfg, sources.kind, sources.ways)
    learner = cfg.entry.builder()(bind(model, {}, train=True), algorithm_settings(cfg), info)
    if not isinstance(learner, MetaLearner):
        raise ConfigError(f"--algo {cfg.algo}: its builder returned {type(learner).__name__}, "
                          "not a MetaLearner")
    return learner


def running_stats_twin(cfg: MetaTrainConfig) -> Model:
    """The run's conv4 with batch-norm running statistics, which ``--bn-running-stats``
    accumulates and evaluates with.

    Raises:
        ConfigError: the run's model is not the built-in conv4.
    """
    if cfg.model.get("name") != "conv4":
        raise ConfigError("--bn-running-stats needs the built-in conv4 (whose twin keeps "
                          f"running statistics); the run's model is {cfg.model}")
    return resolve_model({**cfg.model, "running_stats": True})


@dataclass(frozen=True)
class RunKeys:
    """The run's key streams, all from ``key(seed)`` (see the module docstring)."""

    init: Key
    train: Key
    model: Key

    @classmethod
    def of(cls, seed: int) -> RunKeys:
        root = random.key(seed)
        return cls(random.fold_in(root, 0), random.fold_in(root, 1), random.fold_in(root, 2))

    @property
    def val(self) -> Key:
        return random.fold_in(self.train, -1)

    @property
    def test(self) -> Key:
        return random.fold_in(self.train, -2)

    @property
    def running_stats(self) -> Key:
        """The training-split tasks that per-step running statistics accumulate over."""
        return random.fold_in(self.train, -4)

    def tasks(self, step: int, meta_batch: int) -> tuple[Key, Key]:
        """``(task sampling key, per-task model keys (meta_batch, 2))`` of meta-step ``step``."""
        return (random.fold_in(self.train, step),
                random.split(random.fold_in(self.model, step), meta_batch))


def init_params(cfg: MetaTrainConfig, learner: MetaLearner, model: Model) -> Params:
    """Initial meta-parameters of ``model``, from :attr:`RunKeys.init`; the model must be
    stateless."""
    params, state = model.init(RunKeys.of(cfg.seed).init)
    if state:
        raise ConfigError(f"model {model.name} has state {sorted(state)[:3]}...; meta-learning "
                          "needs a stateless model (batch norm with batch statistics)")
    return learner.init(params)


def check_fit(learner: MetaLearner, params: Params, sources: TaskSources) -> int:
    """Take one training task's meta-gradient and score one validation task, so a model that
    does not fit the tasks (channels, image size, head width) is a one-line
    :class:`ConfigError` before anything is written. Returns the bytes the meta-gradient
    allocated (:func:`~funcgraph.runs.memory.allocated_bytes`)."""
    train, val = one_task(sources.train), one_task(sources.val)
    what = (f"model: cannot run on {sources.ways}-way tasks with support set "
            f"{tuple(train.support_x.shape)}")
    _, per_task = probe(lambda: allocated_bytes(lambda: learner.task_grad(params, train)), what)
    probe(lambda: learner.task_eval(params, val), what)
    return per_task


def one_task(sample: TaskSampler) -> Task:
    """Task 0 of ``sample`` at key 0, with its key: what the probes run."""
    return sample(random.key(0), 1).with_keys(random.split(random.key(0), 1)).pick(0)


def tasks_at_once(strategy: str, device: torch.device, batch: int) -> int:
    """Task graphs ``strategy`` holds at once over ``batch`` tasks: vmap's chunk (all of
    them on a device without one), a graph per worker thread, or the loop's one."""
    if strategy == "vmap":
        return min(batch, default_chunk_size(device) or batch)
    return min(batch, torch.get_num_threads()) if strategy == "threads" else 1


def task_size(sample: TaskSampler) -> int:
    """Examples (support + query) in one task from ``sample``: what the strategy depends on."""
    return examples_per_task(sample(random.key(0), 1))


def eval_strategy(cfg: MetaTrainConfig, sources: TaskSources, device: torch.device,
                  learner: MetaLearner, params: Params,
                  echo: Callable[[str], object] | None = None) -> str:
    """How validation and the test run their tasks: ``cfg.strategy`` where it names one, else
    the measured default for the device and the evaluation tasks' size (usually larger than
    training's: 15 queries per class). ``funcgraph evaluate`` scores a run the same way.

    Under ``--max-memory`` (``cfg.max_memory``) a strategy that scores several tasks at once
    (threads: one per worker; vmap: a chunk) gives way to the loop, one task at a time, where
    that many evaluation graphs would not fit beside the process's resident memory; a bound
    one evaluation task cannot meet is refused, and ``echo`` gets a line when the loop is
    taken. A task's bytes are those ``learner``'s evaluation allocates in all
    (:func:`~funcgraph.runs.memory.allocated_bytes`), an upper bound of its peak, so the bound
    errs towards the loop.

    A config that records its scoring strategy (``cfg.score_strategy``, the run's own choice)
    scores with it: a resumed run and ``funcgraph evaluate`` round as the run did, whatever
    memory the process holds now.
    """
    if cfg.score_strategy is not None:
        return cfg.score_strategy
    strategy = resolve_strategy(cfg.strategy if cfg.strategy in STRATEGIES else "auto", device,
                                examples_per_task=task_size(sources.val))
    if cfg.max_memory is None:
        return strategy
    val = one_task(sources.val).to(device)
    _, per_task = allocated_bytes(lambda: learner.task_eval(params, val))
    resident = resident_bytes() if device.type == "cpu" else 0
    if resident + per_task > cfg.max_memory:
        raise ConfigError(
            f"--max-memory {fmt_bytes(cfg.max_memory)}: scoring one validation task needs "
            f"about {fmt_bytes(resident + per_task)} ({fmt_bytes(per_task)} beside the "
            f"{fmt_bytes(resident)} this process holds); raise it")
    at_once = tasks_at_once(strategy, device, EVAL_BATCH)
    if resident + at_once * per_task <= cfg.max_memory:
        return strategy
    if echo is not None:
        echo(f"--max-memory {fmt_bytes(cfg.max_memory)}: scoring runs one task at a time "
             f"(loop), not {at_once} at once ({strategy}, about "
             f"{fmt_bytes(resident + at_once * per_task)})")
    return "loop"


def task_bytes(sample: TaskSampler) -> int:
    """Bytes of one task's data (support and query inputs and targets) from ``sample``."""
    return sum(t.numel() * t.element_size() for t in sample(random.key(0), 1))


@dataclass(frozen=True)
class MetaTrainPlan:
    """A validated meta-training run, before anything is written: what ``--dry-run`` shows."""

    cfg: MetaTrainConfig
    learner: MetaLearner
    params: Params
    memory: MemoryEstimate
    memory_note: str | None = None
    """A line for the run's first lines where ``--strategy auto`` took a strategy estimated to
    need more than :data:`AUTO_MEMORY_RATIO` times the loop's memory."""
    chunk_size: int | None = None
    """Tasks vmap maps at a time to keep under ``--max-memory`` (``None``: the device's
    default)."""

    @property
    def parameters(self) -> int:
        return count(self.params)


def plan_meta_train(cfg: MetaTrainConfig, sources: TaskSources, device: torch.device, *,
                    place: str | None = None) -> MetaTrainPlan:
    """Resolve the model, build the learner and its meta-parameters, run one task through
    them (:func:`check_fit`) and refuse a meta-batch the device's free memory cannot hold."""
    if not cfg.model:
        cfg = replace(cfg, model=default_model_config(cfg.algo, sources))
    model = run_model(cfg, place)
    check_task_sizes(model, cfg, sources, device)  # from shapes, before anything is allocated
    learner = build_learner(cfg, sources, model)
    meta_params = init_params(cfg, learner, model)
    per_task = check_fit(learner, meta_params, sources)
    if cfg.bn_running_stats:
        running_stats_twin(cfg)  # refuse another model before anything is written
    # Every strategy but vmap holds one task graph per worker thread; "measure" may pick vmap.
    strategy = cfg.step_strategy or ("vmap" if cfg.strategy == "measure" else resolve_strategy(
        cfg.strategy, device, examples_per_task=task_size(sources.train)))
    live = tasks_at_once(strategy, device, cfg.meta_batch)
    state_bytes = 4 * nbytes(meta_params)
    data_bytes = cfg.meta_batch * task_bytes(sources.train)
    resident = resident_bytes() if device.type == "cpu" else 0
    chunk = None
    if cfg.chunk_size is not None:  # the run's own record: the same chunks as before
        chunk = cfg.chunk_size
        live = min(live, chunk) if strategy == "vmap" else live
    elif cfg.max_memory is not None:
        fits = bounded_tasks(cfg.max_memory, strategy, live, resident + state_bytes + data_bytes,
                             per_task)
        if strategy == "vmap" and fits < live:
            chunk = live = fits
    memory = MemoryEstimate(state_bytes + data_bytes + live * per_task,
                            available_bytes(device),
                            f"{live} task graph(s) of "
                            f"{fmt_bytes(per_task)} at once ({strategy}), "
                            f"{fmt_bytes(data_bytes)} of meta-batch data, params and Adam "
                            "state")
    check_memory(memory, "lower --meta-batch, or use --strategy loop or --remat")
    note = None
    if cfg.strategy == "auto" and cfg.step_strategy is None:
        note = auto_memory_note(strategy, memory.needed, state_bytes + data_bytes + per_task,
                                resident)
    return MetaTrainPlan(replace(cfg, chunk_size=chunk), learner, meta_params, memory, note,
                         chunk)


def bounded_tasks(max_memory: int, strategy: str, live: int, fixed: int, per_task: int) -> int:
    """How many task graphs of ``per_task`` bytes fit beside ``fixed`` bytes (the process's
    resident memory, params, optimiser state, the meta-batch's data) under ``max_memory``,
    at most ``live`` (what ``strategy`` would hold at once); refuses a bound that not even
    one task fits under, and ``"threads"`` (one graph per worker) beyond it."""
    fits = min(live, (max_memory - fixed) // max(per_task, 1))
    if fits < 1:
        raise ConfigError(
            f"--max-memory {fmt_bytes(max_memory)}: a meta-step needs at least "
            f"{fmt_bytes(fixed + per_task)} (one task graph of {fmt_bytes(per_task)} beside "
            f"{fmt_bytes(fixed)}: this process, params, optimiser state and the meta-batch's "
            "data); raise it, or lower --meta-batch or use --remat")
    if strategy == "threads" and fits < live:
        raise ConfigError(
            f"--max-memory {fmt_bytes(max_memory)}: {live} worker threads hold {live} task "
            f"graphs of {fmt_bytes(per_task)} at once and only {fits} fit; use --strategy loop "
            "(one at a time) or vmap")
    return int(fits)


def auto_memory_note(strategy: str, needed: int, loop: int, resident: int) -> str | None:
    """The line ``--strategy auto`` shows when ``strategy``'s peak (``needed`` bytes beside
    the ``resident`` bytes the process already holds) is over :data:`AUTO_MEMORY_RATIO` times
    the loop's (``loop`` bytes beside the same); ``None`` when it is not."""
    ratio = (resident + needed) / (resident + loop)
    if ratio <= AUTO_MEMORY_RATIO:
        return None
    held = f", with the {fmt_bytes(resident)} this process holds" if resident else ""
    return (f"strategy {strategy} (auto, the faster here): about "
            f"{fmt_bytes(resident + needed)}{held}, {ratio:.1f}x the loop's "
            f"{fmt_bytes(resident + loop)}; --strategy loop holds one task graph at a time")


AUTO_MEMORY_RATIO = 1.5
"""``--strategy auto`` says so in the run's first lines when its choice is estimated to need
more than this many times the loop's memory."""


__all__ = ["AUTO_MEMORY_RATIO", "MetaTrainPlan", "RunKeys", "auto_memory_note", "bounded_tasks",
           "build_learner", "check_fit", "default_model_config", "eval_strategy", "init_params",
           "model_config", "one_task", "plan_meta_train", "run_model", "running_stats_twin",
           "task_bytes", "task_size", "tasks_at_once"]
