"""What ``funcgraph evaluate`` runs: a meta-training run's checkpoint scored on held-out tasks.

By default :func:`evaluate_run` scores the run's own test tasks, as the run's last line did:
the same keys (:attr:`~funcgraph.runs.meta_training.plan.RunKeys.test` of the run's seed), the same
number of tasks, the same checkpoint (``best``, else ``last``), strategy and precision, so on
the same machine it gives the run's test figure bit for bit. The run's recorded test line comes
back beside the new figure. Another seed, task count or task spec draws other tasks; another
checkpoint, inner-step count, statistics or precision scores the same tasks another way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ConfigError
from ..meta import EvalResult, evaluate
from ..placement import cpu_threads, resolve_device
from ..plugins import import_recorded
from ..precision import resolve_precision
from ..train import Run
from .memory import check_task_sizes
from .meta_training.loop import MetaTrainConfig, run_model, scoring_learner
from .meta_training.plan import RunKeys, eval_strategy
from .task_sources import sources_for


@dataclass(frozen=True)
class RecordedTest:
    """The run's own test line (``metrics.jsonl``): the checkpoint and task spec it scored,
    and its result."""

    checkpoint: str
    tasks: str
    result: EvalResult

    def __str__(self) -> str:  # as the run printed it
        return f"test ({self.checkpoint} checkpoint, {self.tasks}): {self.result}"


@dataclass(frozen=True)
class RunEvaluation:
    """What :func:`evaluate_run` scored and the run's own test line to set beside it.

    ``checkpoint`` is the checkpoint scored (``"best"`` falls back to ``"last"`` for a run
    that never validated); ``recorded`` the run's test (``None`` for a run that was not
    scored, such as a settings-search trial); ``other_tasks`` names the options that drew
    other tasks than the run's test (``--seed``, ``--episodes``, ``--tasks``), empty when the
    tasks are the run's own.
    """

    run: Run
    checkpoint: str
    result: EvalResult
    recorded: RecordedTest | None
    other_tasks: tuple[str, ...]
    note: str | None = None
    """Why the figure may differ from the run's own line where it cannot be bit for bit (a
    run from before its scoring strategy was recorded, scored under ``--max-memory``)."""


def evaluate_run(
    run_dir: str | Path,
    *,
    tasks: str | None = None,
    episodes: int | None = None,
    checkpoint: str = "best",
    inner_steps_eval: int | None = None,
    bn_running_stats: bool | None = None,
    device: str = "cpu",
    seed: int | None = None,
    precision: str | None = None,
    threads: int | None = None,
) -> RunEvaluation:
    """Score the run in ``run_dir`` on held-out tasks: by default the run's own test tasks.

    Arguments:
        tasks: another task spec (default: the run's); draws other tasks.
        episodes: how many tasks (default: the run's test count); another count draws other
            tasks.
        seed: the seed the test tasks' keys come from (default: the run's); another seed
            draws other tasks.
        checkpoint: ``"best"`` (falls back to ``"last"`` for a run that never validated) or
            ``"last"``.
        inner_steps_eval, bn_running_stats: override the run's settings (MAML++'s
            ``bn_running_stats``: score each query on its own with per-step running
            statistics instead of the query batch's own); neither changes what was trained.
        precision: ``float32``, ``bf16`` or ``auto``, overriding the precision the run
            trained in.
        threads: CPU threads for torch (default: the count the run recorded, so its figure
            comes back bit for bit; 0: the process's).

    The tasks are scored with the strategy the run recorded (``score_strategy``: under
    ``--max-memory`` the run chose it from the memory it held then), so the figure rounds as
    the run's did; another task spec chooses again for its size. A run that predates the
    record is scored with a strategy chosen now, and under ``--max-memory``
    :attr:`RunEvaluation.note` says that the figure may differ from the run's.

    Raises:
        ConfigError: an override the run cannot take (inner steps of a ProtoNet run, a task
            spec whose way count the model's head does not have).
        CheckpointError: the run has no checkpoint to score.
    """
    run = Run.open(run_dir)
    import_recorded(run.config, run_dir)
    cfg = MetaTrainConfig.from_json(run.config)
    with cpu_threads(cfg.threads if threads is None else threads):
        return _evaluate_run(run, cfg, tasks=tasks, episodes=episodes, checkpoint=checkpoint,
                             inner_steps_eval=inner_steps_eval,
                             bn_running_stats=bn_running_stats, device=device, seed=seed,
                             precision=precision)


def _evaluate_run(run: Run, cfg: MetaTrainConfig, *, tasks: str | None, episodes: int | None,
                  checkpoint: str, inner_steps_eval: int | None,
                  bn_running_stats: bool | None, device: str, seed: int | None,
                  precision: str | None) -> RunEvaluation:
    """:func:`evaluate_run` of ``run`` (its config ``cfg``) at its thread count."""
    own: dict[str, Any] = {"--seed": cfg.seed, "--episodes": cfg.test_episodes,
                           "--tasks": cfg.tasks}
    asked = {"--seed": seed, "--episodes": episodes, "--tasks": tasks}
    other_tasks = tuple(n for n, v in asked.items() if v is not None and v != own[n])
    changes: dict[str, Any] = {}
    note = None
    if tasks is not None and tasks != cfg.tasks:  # tasks of another size: chosen for them
        changes.update(tasks=tasks, score_strategy=None)
    elif cfg.score_strategy is None and cfg.max_memory is not None:
        note = ("the run recorded no scoring strategy (it predates the record): this one was "
                "chosen under --max-memory from the memory this process holds, and may round "
                "otherwise than the run's test")
    if inner_steps_eval is not None:
        if cfg.algo == "protonet":
            raise ConfigError("--inner-steps-eval: a protonet run adapts by class prototypes, "
                              "with no inner steps to set")
        changes["inner_steps_eval"] = inner_steps_eval
    if bn_running_stats is not None:
        changes["bn_running_stats"] = bn_running_stats
    dev = resolve_device(device)
    if precision is not None:
        changes["precision"] = resolve_precision(precision, dev)[0]
    cfg = replace(cfg, **changes)
    # As the run built them: MAML++'s running statistics come from its training tasks.
    sources = sources_for(cfg)
    model_ways = cfg.model.get("ways")
    if model_ways is not None and model_ways != sources.ways:
        raise ConfigError(f"--tasks {cfg.tasks}: the model's head has {model_ways} ways")
    model = run_model(cfg)
    check_task_sizes(model, cfg, sources, dev)  # from shapes, before a task is sampled
    tag = checkpoint if run.has_checkpoint(checkpoint) else "last"
    if not run.has_checkpoint(tag):
        raise CheckpointError(f"{run.path}: no checkpoint to evaluate (expected checkpoints/"
                              f"{checkpoint}.json)")
    scorer, params = scoring_learner(cfg, sources, model, run, tag, dev)
    key = RunKeys.of(cfg.seed if seed is None else seed).test
    result = evaluate(scorer, params, sources.test, key=key,
                      episodes=cfg.test_episodes if episodes is None else episodes,
                      strategy=eval_strategy(cfg, sources, dev, scorer, params), device=dev,
                      precision=cfg.precision)
    metric = scorer.objective.metric_name
    tests = [r for r in run.metrics() if r.get("kind") == "test" and metric in r]
    recorded = RecordedTest(str(tests[-1]["checkpoint"]), own["--tasks"],
                            EvalResult.from_record(metric, tests[-1])) if tests else None
    run.log({"kind": "evaluate", "step": cfg.steps, "checkpoint": tag, "tasks": cfg.tasks,
             **result.as_record()})
    return RunEvaluation(run, tag, result, recorded, other_tasks, note)


__all__ = ["RecordedTest", "RunEvaluation", "evaluate_run"]
