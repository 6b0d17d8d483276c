"""``funcgraph evaluate RUN_DIR``: score a meta-training run's checkpoint on held-out tasks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import (
    DEVICES_PANEL,
    CheckpointOption,
    DeviceOption,
    ImportOption,
    PrecisionOption,
    console,
    import_plugins,
    user_errors,
)

EVALUATION_PANEL = "Evaluation"


@user_errors
def evaluate(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by meta-train.")],
    tasks: Annotated[str | None, typer.Option(
        rich_help_panel=EVALUATION_PANEL,
        help="Task spec to evaluate on, e.g. 5way1shot15query (default: the run's; another "
             "draws other tasks).")] = None,
    episodes: Annotated[int | None, typer.Option(
        rich_help_panel=EVALUATION_PANEL,
        min=1, max=100_000, help="Held-out tasks to average over (default: the run's test "
                                 "count; another count draws other tasks).")] = None,
    inner_steps_eval: Annotated[int | None, typer.Option(
        rich_help_panel=EVALUATION_PANEL,
        min=0, max=1000, help="Inner steps on each support set (default: the run's).")] = None,
    bn_running_stats: Annotated[bool | None, typer.Option(
        "--bn-running-stats/--batch-stats",
        rich_help_panel=EVALUATION_PANEL,
        help="MAML++: score each query on its own, normalised with the per-step running "
             "statistics of the adapted params, or with each batch's statistics (default: "
             "the run's).")] = None,
    checkpoint: CheckpointOption = "best",
    device: DeviceOption = "auto",
    precision: PrecisionOption = None,
    threads: Annotated[int | None, typer.Option(
        min=0, max=4096, rich_help_panel=DEVICES_PANEL,
        help="CPU threads for torch (default: the run's recorded count, so its test line "
             "comes back bit for bit; 0: torch's default).")] = None,
    import_: ImportOption = None,
    seed: Annotated[int | None, typer.Option(
        rich_help_panel=EVALUATION_PANEL,
        min=0, max=2**31 - 1, help="Seed of the test tasks (default: the run's; another seed "
                                   "draws other tasks).")] = None,
) -> None:
    """Adapt on each held-out task's support set and report query accuracy +- 95% CI.

    By default it scores the run's own test tasks with the checkpoint the run's test used, so
    on the same machine the figure equals the run's test line, printed again below it;
    --seed, --episodes and --tasks draw other tasks.

    A ProtoNet run holds an embedding, not a classifier: it scores tasks of any way count
    (--tasks 10way1shot on a 5-way run) by their class prototypes. Ctrl-C exits 130.

    Example: funcgraph evaluate runs/maml-glyphs-5way1shot-20260101-120000 --episodes 600
    """

    from ..runs import evaluate_run

    import_plugins(import_)
    if checkpoint not in ("best", "last"):
        raise typer.BadParameter(f"expected best or last, got {checkpoint!r}",
                                 param_hint="--checkpoint")
    scored = evaluate_run(run_dir, tasks=tasks, episodes=episodes, checkpoint=checkpoint,
                          inner_steps_eval=inner_steps_eval, bn_running_stats=bn_running_stats,
                          device=device, seed=seed, threads=threads,
                          precision=precision)
    tag = scored.checkpoint
    fallback = f" (the run has no {checkpoint!r} checkpoint)" if tag != checkpoint else ""
    lines = [f"{scored.run.path} ({tag} checkpoint{fallback}): {scored.result}"]
    if scored.recorded is not None:
        lines.append(f"the run's own {scored.recorded}")
    if scored.note is not None:
        lines.append(scored.note)
    if scored.other_tasks:
        lines.append(f"{', '.join(scored.other_tasks)} drew other tasks than the run's test; "
                     "leave them out to score the run's own")
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate)
