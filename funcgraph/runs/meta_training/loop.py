"""What ``funcgraph meta-train`` runs: a config, a model and a learner, the loop, the test.

:func:`meta_train` plans the run from a :class:`MetaTrainConfig`
(:mod:`~funcgraph.runs.meta_training.config`; the model, learner and meta-parameters:
:mod:`~funcgraph.runs.meta_training.plan`), runs :func:`funcgraph.train.run_loop` over
:func:`train_step`, which wraps the library's :func:`~funcgraph.meta.step.meta_step` with task
sampling and the all-reduce (progress, ``metrics.jsonl``, ``last``/``best`` checkpoints,
Ctrl-C, resume, a loss past :data:`~funcgraph.train.DIVERGENCE_BOUND` stopping the run as
diverged), validates periodically on the validation split, and scores the best checkpoint on
held-out tasks. Everything is checked (options, data, model, its first forward) before the
run directory is written, so a bad start leaves nothing behind.

Keys: the run's root ``key(seed)`` gives ``fold_in(root, 0)`` to the model's init,
``fold_in(root, 1)`` to task sampling (step ``s`` draws its tasks with ``fold_in(train, s)``)
and ``fold_in(root, 2)`` to the model: step ``s`` gives task ``t`` the key
``split(fold_in(model, s), meta_batch)[t]``, which the learner folds per inner step (dropout,
stochastic depth). So a resumed run ends bit-identical to an uninterrupted one on CPU.

What the results depend on is recorded in ``config.json`` beside the options: the thread count
the run ran with, whether it was asked to compile, its precision, the strategy the meta-step
took, the one validation and the test scored with, and vmap's chunk under ``--max-memory``.
A resume takes them again (:func:`~funcgraph.runs.meta_training.config.as_recorded`), so it
rounds as the run did; a thread count, compiling and the step budget may change on resume
(the change is logged in ``metrics.jsonl`` as a ``resume`` record), any other difference is
refused in one line.

A meta-batch is not refused for its time (what a step costs depends on the machine, and a
large one may be what the user wants), only for a memory estimate past the free memory
(:func:`~funcgraph.runs.meta_training.plan.plan_meta_train`). Instead, before its first step a run
says what one meta-step will cost, measured on a few tasks and scaled, with the memory
estimate and the time for the steps to go (:func:`step_cost`): a meta-batch of 100,000 tasks
says at once that each step takes hours on a CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ... import distributed
from ...errors import CheckpointError, ConfigError
from ...meta.compiled import use_compile_cache
from ...meta.evaluate import EvalResult, TaskSampler, evaluate
from ...meta.learner import MetaLearner
from ...meta.running_stats import step_running_stats, with_step_running_stats
from ...meta.settings import AdaptSettings
from ...meta.step import meta_step
from ...meta.strategy import STRATEGIES, resolve_strategy
from ...model import Model
from ...params import Params
from ...placement import cpu_threads, resolve_device
from ...precision import chosen_precision, resolve_precision
from ...random import Key
from ...train import (
    DIVERGENCE_BOUND,
    Groups,
    LoopConfig,
    Optimizer,
    Run,
    adam,
    cosine_lr,
    run_loop,
    sgd,
)
from ...train.ownership import CONFIG_FILE
from ..curves import write_curves
from ..memory import fmt_bytes
from ..task_sources import TaskSources, sources_for
from .compile_note import OUTCOMES, CompileReporter, compile_note, signature
from .config import (
    KIND_DEFAULTS,
    MAY_CHANGE_ON_RESUME,
    RECORDED_BY_THE_RUN,
    MetaTrainConfig,
    as_recorded,
    default_algo,
    default_config,
)
from .plan import (
    MetaTrainPlan,
    RunKeys,
    build_learner,
    check_fit,
    default_model_config,
    eval_strategy,
    init_params,
    model_config,
    plan_meta_train,
    run_model,
    running_stats_twin,
    task_size,
)

RUNNING_STATS_TASKS = 200
"""Training tasks that MAML++'s per-step running statistics accumulate over (batch norm's
momentum 0.1 leaves the initial statistics a weight of 0.9 ** 200, below 1e-9)."""


def evaluation_learner(cfg: MetaTrainConfig, learner: MetaLearner, params: Params,
                       sources: TaskSources, device: torch.device) -> MetaLearner:
    """The learner that scores ``params``: ``learner`` itself, or with
    ``--bn-running-stats`` MAML++ scoring each query on its own with the running statistics
    of the adapted params (:func:`funcgraph.meta.running_stats.with_step_running_stats`),
    accumulated over :data:`RUNNING_STATS_TASKS` training tasks from ``params`` (so each
    validation uses the statistics of the params it scores)."""
    if not cfg.bn_running_stats:
        return learner
    twin = running_stats_twin(cfg)
    tasks = sources.train(RunKeys.of(cfg.seed).running_stats, RUNNING_STATS_TASKS).to(device)
    settings = learner.settings
    if not isinstance(settings, AdaptSettings):
        raise ConfigError(f"--bn-running-stats: {learner.name} has no inner loop to adapt with")
    rows = step_running_stats(twin, params, tasks, steps=settings.eval_steps,
                              inner_lr=settings.inner_lr, objective=learner.objective)
    return with_step_running_stats(learner, twin, rows)


def scoring_learner(cfg: MetaTrainConfig, sources: TaskSources, model: Model, run: Run,
                    checkpoint: str, device: torch.device) -> tuple[MetaLearner, Params]:
    """``(scorer, meta-parameters)`` of the run's ``checkpoint``: the checkpoint's params
    loaded onto ``device`` and verified against those of ``cfg``'s learner over ``model``
    (:func:`init_params`), and the learner that scores them (:func:`evaluation_learner`).
    ``funcgraph evaluate`` scores with it and
    :meth:`LoadedRun.adapt <funcgraph.runs.load.LoadedRun.adapt>` adapts with it."""
    learner = build_learner(cfg, sources, model)
    template = init_params(cfg, learner, model)
    params = run.load(checkpoint, expect={"params": template}, device=str(device))[0]["params"]
    return evaluation_learner(cfg, learner, params, sources, device), params


def meta_optimizer(cfg: MetaTrainConfig) -> Optimizer:
    """The meta-step's optimiser: Adam, or plain SGD (Reptile's ``theta += eps (W - theta)``
    is SGD on its pseudo-gradient with rate ``eps``)."""
    return sgd(cfg.meta_lr) if cfg.meta_optimizer == "sgd" else adam(cfg.meta_lr)


def meta_lr_at(cfg: MetaTrainConfig, step: int) -> float:
    """The meta learning rate of meta-step ``step``: constant, cosine-annealed to 0, or
    linearly annealed to 0 (Reptile's outer step size) over ``cfg.steps``."""
    if cfg.cosine_meta_lr:
        return cosine_lr(cfg.meta_lr, step, cfg.steps)
    if cfg.linear_meta_lr:
        return cfg.meta_lr * (1 - step / cfg.steps)
    return cfg.meta_lr


def run_rates(cfg: MetaTrainConfig) -> dict[str, float]:
    """The learning rates a run uses, as its diverged message names them."""
    inner = {"--inner-lr": cfg.inner_lr} if cfg.entry.inner_loop else {}
    return {**inner, "--meta-lr": cfg.meta_lr}


StepFn = Callable[[int, Groups, str], tuple[Groups, dict[str, float]]]
"""``(step, groups, strategy) -> (groups, metrics)``: one meta-step of the run."""


def train_step(cfg: MetaTrainConfig, learner: MetaLearner, optimizer: Optimizer,
               sources: TaskSources, dev: torch.device, env: distributed.DistEnv,
               sync_every: int, chunk_size: int | None = None) -> StepFn:
    """The run's meta-step: draw step ``s``'s tasks from the run's keys (this rank's slice
    of them in a data-parallel job), take :func:`~funcgraph.meta.step.meta_step` with the
    all-reduce of the gradients across ranks, and check every ``sync_every`` steps that the
    ranks hold identical params. ``chunk_size``: vmap's tasks at a time (``--max-memory``)."""
    keys = RunKeys.of(cfg.seed)

    def step_fn(step: int, groups: Groups, strategy: str) -> tuple[Groups, dict[str, float]]:
        task_key, model_keys = keys.tasks(step, cfg.meta_batch)
        tasks = sources.train(task_key, cfg.meta_batch).with_keys(model_keys)
        if env.active:
            mine = distributed.shard(cfg.meta_batch, env)
            tasks = tasks.pick(slice(mine.start, mine.stop))
        comm: dict[str, float] = {}

        def all_reduce(grads: Params, loss: Tensor, metric: Tensor
                       ) -> tuple[Params, Tensor, Tensor]:
            started = time.perf_counter()
            grads = distributed.all_reduce_mean(
                {**grads, "loss.": loss.reshape(1), "metric.": metric.reshape(1)}, env)
            loss, metric = grads.pop("loss."), grads.pop("metric.")
            comm["comm_s"] = time.perf_counter() - started
            return grads, loss, metric

        params, opt, metrics = meta_step(
            learner, optimizer, groups["params"], groups["opt"], tasks.to(dev), step=step,
            lr=meta_lr_at(cfg, step), strategy=strategy, chunk_size=chunk_size,
            reduce=all_reduce if env.active else None, precision=cfg.precision,
            compile=cfg.compile)
        if env.active and (step + 1) % sync_every == 0:
            distributed.assert_in_sync(params, env, step + 1)
        return {"params": params, "opt": opt}, {
            "loss": float(metrics.loss), learner.objective.metric_name: float(metrics.metric),
            **comm}

    return step_fn


def estimate_step_seconds(cfg: MetaTrainConfig, plan: MetaTrainPlan, sources: TaskSources,
                          device: torch.device, *, tasks: int = 4,
                          strategy: str | None = None) -> tuple[float, int]:
    """Seconds a meta-step of ``cfg`` will take, estimated from a short measurement: the
    second of two eager meta-steps on ``tasks`` tasks (the first warms up), scaled by
    ``meta_batch / tasks``, under ``strategy`` (default: ``cfg``'s, ``auto`` for ``measure``).
    Returns ``(seconds, tasks measured)``; ``--dry-run`` and a run's first line print it."""
    n = min(cfg.meta_batch, tasks)
    optimizer = meta_optimizer(cfg)
    params = {k: v.to(device) for k, v in plan.params.items()}
    opt = optimizer.init(params)
    strategy = strategy or resolve_strategy(
        cfg.strategy if cfg.strategy in STRATEGIES else "auto", device,
        examples_per_task=task_size(sources.train))
    keys = RunKeys.of(cfg.seed)
    task_key, model_keys = keys.tasks(0, n)
    batch = sources.train(task_key, n).with_keys(model_keys).to(device)
    seconds = 0.0
    for _ in range(2):
        started = time.perf_counter()
        meta_step(plan.learner, optimizer, params, opt, batch, step=0, lr=cfg.meta_lr,
                  strategy=strategy, chunk_size=plan.chunk_size,
                  precision=resolve_precision(cfg.precision, device)[0])
        seconds = time.perf_counter() - started
    return seconds * cfg.meta_batch / n, n


def resumed(run: Run, groups: Groups, dev: torch.device, env: distributed.DistEnv
            ) -> tuple[Groups, int, float | None, str | None]:
    """``(groups, start step, best value, strategy)`` from the run's ``last`` checkpoint; the
    strategy is kept only on the device type it was chosen for."""
    # Verify the params against the model; the optimiser state is ours (its "step" entry
    # appears after the first update, so an init template would not match it).
    loaded, meta = run.load("last", expect={"params": groups["params"]})
    if "opt" not in loaded and groups["opt"]:
        raise CheckpointError(f"{run.path}: checkpoint 'last' has no optimiser state")
    start = int(meta["step"])
    if env.is_main:
        run.truncate_metrics(start)
    strategy = meta.get("strategy") if meta.get("device") == dev.type else None
    return ({"params": loaded["params"], "opt": loaded.get("opt", {})}, start,
            meta.get("best_value"), strategy)


def recorded_run(out: str | Path) -> dict[str, Any] | None:
    """The ``config.json`` of the run in ``out`` that a resume continues (one that saved a
    step), or ``None``."""
    if not (Path(out) / CONFIG_FILE).is_file():
        return None
    run = Run.open(out)
    return run.config if run.has_checkpoint("last") else None


def resume_changes(recorded: Mapping[str, Any], cfg: MetaTrainConfig) -> dict[str, Any]:
    """The settings a resume changes that the run allows to change
    (:data:`~funcgraph.runs.meta_training.config.MAY_CHANGE_ON_RESUME`), as
    ``{name: [recorded, new]}``; the derived chunk and scoring strategy are left out."""
    now = cfg.to_json()
    return {k: [recorded.get(k), now[k]] for k in MAY_CHANGE_ON_RESUME
            if k not in ("chunk_size", "score_strategy") and recorded.get(k) != now[k]}


def fmt_seconds(seconds: float) -> str:
    """``42.0`` -> ``"42 s"``, ``5400`` -> ``"1.5 h"``: a duration at a glance."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.3g} min" if seconds < 7200 else f"{seconds / 3600:.3g} h"


def step_cost(cfg: MetaTrainConfig, plan: MetaTrainPlan, seconds: float, measured: int,
              steps: int) -> str:
    """The line a run starts with: what one meta-step of ``cfg`` will cost (``seconds``, from
    :func:`estimate_step_seconds` on ``measured`` tasks, and the plan's memory estimate) and
    the ``steps`` still to run."""
    compiled = ", eager; compiling comes first" if cfg.compile else ""
    return (f"one meta-step: about {fmt_seconds(seconds)} and {fmt_bytes(plan.memory.needed)} "
            f"({measured} of its {cfg.meta_batch:,} tasks timed, scaled{compiled}); about "
            f"{fmt_seconds(seconds * steps)} for {steps:,} step(s), validation not included")


@dataclass(frozen=True)
class MetaTrainResult:
    """The run directory, the final meta-parameters and the held-out score."""

    run: Run
    params: Params
    test: EvalResult | None  # None on ranks other than 0 of a distributed job, or untested


def meta_train(
    cfg: MetaTrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    device: str = "cpu",
    sources: TaskSources | None = None,
    show_progress: bool = True,
    echo: Any = print,
    env: distributed.DistEnv | None = None,
    sync_every: int = 50,
    tensorboard: bool = False,
    place: str | None = None,
    on_validation: Callable[[int, Mapping[str, float]], object] | None = None,
    on_step: Callable[[int], object] | None = None,
    score_test: bool = True,
    label: str = "",
) -> MetaTrainResult:
    """Meta-train per ``cfg`` into the run directory ``out``; see the module docstring.

    Arguments:
        sources: task samplers (default: built from ``cfg.dataset``); tests pass synthetic ones.
        resume: continue the run in ``out`` from its ``last`` checkpoint, with the thread
            count and strategies the run recorded where ``cfg`` leaves them to the run (0,
            ``None``); only the fields of
            :data:`~funcgraph.runs.meta_training.config.MAY_CHANGE_ON_RESUME` may differ from
            the stored config.
        echo: where one-line summaries go.
        label: put before each step line the loop prints (``[trial 3] ``).
        env: this process's place in a data-parallel job (``distributed.init()``): each rank
            meta-trains on its slice of every meta-batch and one all-reduce averages the
            gradients; rank 0 alone validates, writes and tests. Every ``sync_every`` steps a
            checksum verifies that all ranks hold identical params.
        on_validation: called with the step and the validation's figures after each
            validation is logged (a settings search reports them to its pruner, which stops
            the run by raising; the checkpoints saved so far stay).
        on_step: called with the number of completed steps after each meta-step (a
            settings search stops a run that will pass its CPU cap there).
        score_test: score the best checkpoint on the held-out tasks at the end; a settings
            search passes ``False`` and chooses on validation alone (``test`` is then
            ``None``).
    """
    recorded = recorded_run(out) if resume else None
    if recorded is not None:  # what the run resolved and the caller leaves to it
        cfg = as_recorded(cfg, recorded)
    with cpu_threads(cfg.threads):  # the count the run ran with, or the process's
        return _meta_train(replace(cfg, threads=torch.get_num_threads()), out, recorded,
                           resume=resume, device=device, sources=sources,
                           show_progress=show_progress, echo=echo, env=env,
                           sync_every=sync_every, tensorboard=tensorboard, place=place,
                           on_validation=on_validation, on_step=on_step,
                           score_test=score_test, label=label)


def _meta_train(
    cfg: MetaTrainConfig,
    out: str | Path,
    recorded: Mapping[str, Any] | None,
    *,
    resume: bool,
    device: str,
    sources: TaskSources | None,
    show_progress: bool,
    echo: Any,
    env: distributed.DistEnv | None,
    sync_every: int,
    tensorboard: bool,
    place: str | None,
    on_validation: Callable[[int, Mapping[str, float]], object] | None,
    on_step: Callable[[int], object] | None,
    score_test: bool,
    label: str,
) -> MetaTrainResult:
    """:func:`meta_train` at the run's thread count; ``recorded``: the config of the run a
    resume continues."""
    env = env or distributed.DistEnv()
    dev = resolve_device(device)
    plan, sources = _planned(cfg, sources, dev, env, echo, place)
    cfg = plan.cfg
    changes = resume_changes(recorded, cfg) if recorded is not None else {}
    run = Run.create(out, cfg.to_json(), resume=resume,
                     may_change=(*MAY_CHANGE_ON_RESUME, *OUTCOMES),
                     env=env, tensorboard=tensorboard,
                     added={"precision": "float32", "compile": False, "max_memory": None})
    try:
        setup = _Setup(plan, sources, dev, env, run, echo)
        optimizer = meta_optimizer(cfg)
        cfg, start = _start(cfg, setup, optimizer, changes, resume=resume, place=place)
        step_fn = train_step(cfg, plan.learner, optimizer, sources, dev, env, sync_every,
                             plan.chunk_size)
        # compiling: its cache folder set now, its lines and records (measure's probe too)
        reporter = CompileReporter(cfg, run if env.is_main else None, setup.main_echo,
                                   start=start.step)
        strategy, score = _strategies(cfg, setup, start, step_fn, reporter)
        cfg = replace(cfg, step_strategy=strategy, score_strategy=score)
        if env.is_main:  # what the run resolved, for --resume and funcgraph evaluate
            run.record({k: getattr(cfg, k) for k in RECORDED_BY_THE_RUN})
        groups = start.groups
        if start.step < cfg.steps:
            groups = _train(cfg, setup, start, step_fn, reporter, strategy, score,
                            show_progress=show_progress, label=label,
                            on_validation=on_validation, on_step=on_step)
        return _end(cfg, setup, groups, score, score_test=score_test)
    finally:
        run.close()


@dataclass(frozen=True)
class _Setup:
    """What the pieces of one run share and do not change: the plan (model, learner, initial
    meta-parameters, vmap's chunk), the task sources, the device, this process's place in a
    data-parallel job, the run directory and where the one-line summaries go. The config,
    which the run resolves as it starts, travels beside it."""

    plan: MetaTrainPlan
    sources: TaskSources
    dev: torch.device
    env: distributed.DistEnv
    run: Run
    echo: Any

    @property
    def main_echo(self) -> Any:
        """``echo`` on rank 0, ``None`` on the other ranks: a job says each line once."""
        return self.echo if self.env.is_main else None

    def score(self, cfg: MetaTrainConfig, params: Params, sample: TaskSampler, key: Key,
              episodes: int, strategy: str) -> EvalResult:
        """``params`` scored on ``episodes`` tasks of ``sample`` drawn from ``key``, as
        validation and the test score them: by :func:`evaluation_learner`, with the scoring
        ``strategy`` and the run's precision."""
        scorer = evaluation_learner(cfg, self.plan.learner, params, self.sources, self.dev)
        return evaluate(scorer, params, sample, key=key, episodes=episodes, strategy=strategy,
                        device=self.dev, precision=cfg.precision)


def _planned(cfg: MetaTrainConfig, sources: TaskSources | None, dev: torch.device,
             env: distributed.DistEnv, echo: Any, place: str | None
             ) -> tuple[MetaTrainPlan, TaskSources]:
    """The run's plan (:func:`plan_meta_train`) and task sources (default: ``cfg``'s), with
    the precision chosen for ``dev`` (``config.json`` records the choice; the run's first
    lines say which and why) and ``measure`` taken as ``auto`` in a data-parallel job (the
    timings differ per rank, and the ranks must agree)."""
    if env.active and cfg.strategy == "measure":
        cfg = replace(cfg, strategy="auto")
    cfg = replace(cfg, precision=chosen_precision(cfg.precision, dev,
                                                  echo if env.is_main else None))
    sources = sources or sources_for(cfg)
    plan = plan_meta_train(cfg, sources, dev, place=place)
    if plan.memory_note is not None and env.is_main:
        echo(plan.memory_note)
    return plan, sources


@dataclass(frozen=True)
class _Start:
    """Where the loop starts: the groups (meta-parameters and optimiser state), the step,
    the best validation so far, and the meta-step's strategy where the run has one
    (``None``: chosen before the first step)."""

    groups: Groups
    step: int
    best_value: float | None
    strategy: str | None


def _start(cfg: MetaTrainConfig, setup: _Setup, optimizer: Optimizer,
           changes: Mapping[str, Any], *, resume: bool, place: str | None
           ) -> tuple[MetaTrainConfig, _Start]:
    """``cfg`` and where the loop starts: step 0 at the plan's meta-parameters, or with
    ``resume`` the run's ``last`` checkpoint (:func:`resumed`), whose strategies are kept on
    the device type they were chosen for and dropped from ``cfg`` (chosen again) on another
    where ``cfg`` leaves them to the run; a resume logs the settings it ``changes`` (a
    ``resume`` record) and says them. The tensors go to the run's device unless a placement
    plan has put each where it belongs."""
    env, run, dev = setup.env, setup.run, setup.dev
    params = setup.plan.params
    groups: Groups = {"params": params, "opt": optimizer.init(params)}
    step, best_value, strategy = 0, None, cfg.step_strategy
    if resume and run.has_checkpoint("last"):
        groups, step, best_value, kept = resumed(run, groups, dev, env)
        if kept is None and cfg.strategy in ("auto", "measure"):
            if strategy is not None and env.is_main:
                setup.echo(f"resumed on {dev.type}: the run's strategies were chosen for "
                           "another device; chosen again")
            strategy = None
            cfg = replace(cfg, step_strategy=None, score_strategy=None)
        strategy = strategy or kept  # a run from before config.json recorded it
        if changes and env.is_main:
            run.log({"kind": "resume", "step": step, "changed": changes})
            setup.echo(f"resumed at step {step} with " + ", ".join(
                f"{k} {new!r} (was {old!r})" for k, (old, new) in changes.items()))
    if place is None:  # a placement plan has put every tensor where it belongs
        groups = {g: {n: t.to(dev) for n, t in d.items()} for g, d in groups.items()}
    return cfg, _Start(groups, step, best_value, strategy)


def _strategies(cfg: MetaTrainConfig, setup: _Setup, start: _Start, step_fn: StepFn,
                reporter: CompileReporter) -> tuple[str, str]:
    """``(the meta-step's strategy, the scoring strategy)``: the step's as the run kept it,
    else chosen now (``measure`` times the strategies on the first meta-batch, compiling
    under ``reporter``); validation's and the test's by :func:`eval_strategy`. Rank 0 first
    says what one meta-step will cost (:func:`step_cost`) where steps remain."""
    dev, sources, strategy = setup.dev, setup.sources, start.strategy
    if start.step < cfg.steps and setup.env.is_main:  # before a step of minutes: its cost
        seconds, measured = estimate_step_seconds(cfg, setup.plan, sources, dev,
                                                  strategy=strategy)
        setup.echo(step_cost(cfg, setup.plan, seconds, measured, cfg.steps - start.step))
    if strategy is None:
        if cfg.strategy == "measure" and setup.env.is_main:
            setup.echo("measuring the strategies on the first meta-batch (a few steps)")
        with reporter:
            strategy = resolve_strategy(cfg.strategy, dev,
                                        examples_per_task=task_size(sources.train),
                                        probe=lambda s: step_fn(start.step, start.groups, s),
                                        compiled=cfg.compile)
    # The training learner stands in for the scorer: running statistics change no sizes.
    score = eval_strategy(cfg, sources, dev, setup.plan.learner, start.groups["params"],
                          setup.main_echo)
    return strategy, score


def _loop_config(cfg: MetaTrainConfig, setup: _Setup, strategy: str, *,
                 show_progress: bool, label: str) -> LoopConfig:
    """The loop's settings: the step budget, checkpoints, validations and the best
    checkpoint by the learner's metric, progress and writing on rank 0 alone, the checkpoint
    meta (``strategy`` and the device type, which a resume keeps the strategy for), the
    divergence bound with the run's rates, and the line before the first step."""
    env, objective = setup.env, setup.plan.learner.objective
    return LoopConfig(
        total_steps=cfg.steps, checkpoint_every=cfg.checkpoint_every,
        validate_every=cfg.validate_every, best_metric=objective.metric_name,
        maximize=objective.higher_is_better, items_per_step=cfg.meta_batch,
        item_name="tasks", show_progress=show_progress and env.is_main,
        write=env.is_main, description=f"meta-train {cfg.algo}",
        meta={"strategy": strategy, "device": setup.dev.type, "world_size": env.world_size},
        divergence_bound=DIVERGENCE_BOUND, rates=run_rates(cfg),
        first_step=(compile_note(use_compile_cache(), signature(cfg)) if cfg.compile else
                    f"sampling {cfg.meta_batch:,} tasks, warming up"), label=label,
    )


def _train(cfg: MetaTrainConfig, setup: _Setup, start: _Start, step_fn: StepFn,
           reporter: CompileReporter, strategy: str, score: str, *, show_progress: bool,
           label: str, on_validation: Callable[[int, Mapping[str, float]], object] | None,
           on_step: Callable[[int], object] | None) -> Groups:
    """The groups after the loop from ``start`` to the step budget (:func:`run_loop`), each
    meta-step under ``strategy``: rank 0 validates every ``validate_every`` steps on the
    validation split (scoring strategy ``score``), then writes the curves and calls
    ``on_validation``; after each step the compile ``reporter`` and ``on_step`` see it."""
    run = setup.run
    metric_name, val_key = setup.plan.learner.objective.metric_name, RunKeys.of(cfg.seed).val

    def validate(step: int, groups: Groups) -> dict[str, float]:
        res = setup.score(cfg, groups["params"], setup.sources.val, val_key,
                          cfg.val_episodes, score)
        return {metric_name: res.mean, "ci95": res.ci95, "loss": res.loss}

    def after_validation(step: int, figures: Mapping[str, float]) -> None:
        write_curves(run.path)
        if on_validation is not None:
            on_validation(step, figures)

    def after_step(step: int) -> None:
        reporter.at(step)
        if on_step is not None:
            on_step(step)

    with_validation = cfg.validate_every and setup.env.is_main
    with reporter:
        return run_loop(run, start.groups, lambda s, g: step_fn(s, g, strategy),
                        _loop_config(cfg, setup, strategy, show_progress=show_progress,
                                     label=label),
                        start_step=start.step, validate=validate if with_validation else None,
                        best_value=start.best_value, after_validation=after_validation,
                        after_step=after_step)


def _end(cfg: MetaTrainConfig, setup: _Setup, groups: Groups, score: str, *,
         score_test: bool) -> MetaTrainResult:
    """The run's result and its last records: on rank 0 the best checkpoint (else the last)
    scored on the held-out tasks with the scoring strategy ``score`` (its ``test`` record,
    the curves and the test line), or with ``score_test`` off a ``final`` record saying the
    test was not scored; no test on the other ranks."""
    run = setup.run
    if not setup.env.is_main:
        return MetaTrainResult(run, groups["params"], None)
    if not score_test:  # the run ends here: `funcgraph runs` lists it as finished
        run.log({"kind": "final", "step": cfg.steps, "test": "not scored"})
        write_curves(run.path)
        return MetaTrainResult(run, groups["params"], None)
    tag = "best" if run.has_checkpoint("best") else "last"
    final = run.load(tag, expect={"params": groups["params"]},
                     device=str(setup.dev))[0]["params"]
    test = setup.score(cfg, final, setup.sources.test, RunKeys.of(cfg.seed).test,
                       cfg.test_episodes, score)
    run.log({"kind": "test", "step": cfg.steps, "checkpoint": tag, **test.as_record()})
    write_curves(run.path)
    setup.echo(f"test ({tag} checkpoint, {cfg.tasks}): {test}")
    return MetaTrainResult(run, groups["params"], test)


__all__ = [
    "KIND_DEFAULTS",
    "MetaTrainConfig",
    "MetaTrainPlan",
    "MetaTrainResult",
    "RUNNING_STATS_TASKS",
    "RunKeys",
    "build_learner",
    "check_fit",
    "default_algo",
    "default_config",
    "default_model_config",
    "estimate_step_seconds",
    "fmt_seconds",
    "eval_strategy",
    "evaluation_learner",
    "init_params",
    "meta_train",
    "model_config",
    "plan_meta_train",
    "recorded_run",
    "resume_changes",
    "run_model",
    "run_rates",
    "running_stats_twin",
    "scoring_learner",
    "step_cost",
    "task_size",
    "train_step",
]
