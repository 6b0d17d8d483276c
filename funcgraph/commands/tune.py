"""``funcgraph tune run|show|confirm``: search meta-train settings with Optuna, see the
study, and confirm its best settings on another data set."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, cast

import typer

from . import help_layout
from .common import (
    DEVICES_PANEL,
    RUN_PANEL,
    DeviceOption,
    ImportOption,
    ThreadsOption,
    console,
    start_run,
    user_errors,
)

BUDGET_PANEL = "Budget"
SEARCH_PANEL = "Search"

tune_app = typer.Typer(
    help="Search meta-train settings with Optuna (TPE, Hyperband pruning on validation "
         "accuracy), see a study, confirm its best settings on another data set.",
    no_args_is_help=True,
    cls=help_layout.Group,
)

StudyArgument = Annotated[Path, typer.Argument(
    help="The study directory (space.toml, study.db, trials/).")]
StorageOption = Annotated[str | None, typer.Option(
    rich_help_panel=RUN_PANEL,
    help="The study's Optuna storage, if not STUDY/study.db (one process at a time): an RDB "
         "URL (postgresql://..., mysql://...) that processes on several machines share, or "
         "journal:PATH (a journal file on a shared filesystem). The study directory "
         "remembers it (STUDY/study.json): later commands need not repeat it.")]
StudyNameOption = Annotated[str | None, typer.Option(
    rich_help_panel=RUN_PANEL,
    help="The study's name in its storage (default: the study directory's name; the "
         "directory remembers it).")]


def _echo(line: str) -> None:
    console.print(line, highlight=False, markup=False, soft_wrap=True)


@user_errors
def run(
    space: Annotated[Path, typer.Argument(
        help="The search space, a TOML file ([study], [fixed], [space]; docs/tune.md).")],
    study: Annotated[Path, typer.Option(
        "--study", rich_help_panel=RUN_PANEL,
        help="The study directory; the same command again resumes the study.")],
    storage: StorageOption = None,
    study_name: StudyNameOption = None,
    workers: Annotated[int, typer.Option(
        min=1, max=256, rich_help_panel=DEVICES_PANEL,
        help="Local worker processes on the study (the cores are divided between them).")
    ] = 1,
    trials: Annotated[int | None, typer.Option(
        min=1, max=100_000, rich_help_panel=BUDGET_PANEL,
        help="Stop once the study holds this many finished trials.")] = None,
    timeout: Annotated[float | None, typer.Option(
        min=1.0, rich_help_panel=BUDGET_PANEL,
        help="Stop starting trials after this many wall seconds.")] = None,
    cpu_hours: Annotated[float | None, typer.Option(
        rich_help_panel=BUDGET_PANEL,
        help="Stop once the study's trials have used this many CPU hours in all (> 0).")
    ] = None,
    trial_cpu_s: Annotated[float | None, typer.Option(
        min=1.0, rich_help_panel=BUDGET_PANEL,
        help="Prune a trial whose CPU seconds, projected to its last step, pass this cap.")
    ] = None,
    pruner: Annotated[str, typer.Option(
        rich_help_panel=SEARCH_PANEL,
        help="hyperband, halving (successive halving), median or none; each acts at the "
             "trials' validation points.")] = "hyperband",
    seed: Annotated[int, typer.Option(
        min=0, max=2**31 - 1, rich_help_panel=SEARCH_PANEL,
        help="Seed of the TPE sampler (worker i uses seed + i).")] = 0,
    heartbeat_s: Annotated[int, typer.Option(
        min=1, max=86_400, rich_help_panel=RUN_PANEL,
        help="With an RDB storage, each running trial beats this often; a trial silent for "
             "5 beats (its worker was killed) is failed and retried by the next worker to "
             "start a trial.")] = 60,
    device: DeviceOption = "cpu",
    threads: ThreadsOption = 0,
    import_: ImportOption = None,
) -> None:
    """Run (or resume) a settings study: each trial is a meta-train run in STUDY/trials/.
    Ctrl-C or SIGTERM saves the running trials; the same command resumes them.

    Example: funcgraph tune run space.toml --study studies/maml --trials 30 --cpu-hours 3
    """
    from ..runs.tune.run import TuneOptions, stop_on_sigterm, tune
    from ..runs.tune.space import load_space

    stop_on_sigterm()
    start_run(threads=threads, imports=import_, tensorboard=False, resume=False, out=None)
    opts = TuneOptions(load_space(space), study, storage=storage, study_name=study_name,
                       workers=workers, heartbeat_s=heartbeat_s, threads=threads,
                       trials=trials, timeout_s=timeout, cpu_hours=cpu_hours,
                       trial_cpu_s=trial_cpu_s, seed=seed, pruner=pruner, device=device,
                       imports=tuple(import_ or ()))
    done = tune(opts, echo=_echo)
    _echo(f"study {study}: {len(done.trials)} trial(s); funcgraph tune show {study}")


@user_errors
def show(
    study: StudyArgument,
    storage: StorageOption = None,
    plots: Annotated[bool, typer.Option(
        "--plots/--no-plots", help="Write STUDY/plots/*.png.")] = True,
    json_lines: Annotated[bool, typer.Option(
        "--json", help="Also print each trial and the best as JSON lines (for records).")
    ] = False,
) -> None:
    """The trial table, the best settings as a meta-train command line, the front of
    accuracy against CPU seconds, and plots.

    Example: funcgraph tune show studies/maml
    """
    import json

    from ..runs.tune.report import best_command, best_trial, front, table, trial_rows, write_plots
    from ..runs.tune.study import metric_of, shown_value

    space, opened = _open(study, storage)
    metric = metric_of(space)
    rows = trial_rows(opened)
    console.print(table(rows, metric), highlight=False, markup=False, end="")
    best = best_trial(opened)
    command = best_command(opened, space)
    if best is None:
        _echo("best: none yet (no complete trial)")
    else:
        _echo(f"best: trial {best.number}, validation {shown_value(best.value, metric)}")
        _echo(f"  {command}")
    on_front = front(rows, metric)
    if on_front:
        _echo("front (no other complete trial is as good at both validation and CPU "
              "seconds and better at one; a run's CPU seconds sum its attempts):")
        for r in on_front:
            _echo(f"  trial {r.number}: {shown_value(cast(float, r.value), metric)} in "
                  f"{r.cpu_s:.0f} CPU s")
    if plots and rows:
        for path in write_plots(opened, study / "plots", metric):
            _echo(f"plot: {path}")
    if json_lines:
        for row in rows:
            print(json.dumps(row.as_record(), sort_keys=True))
        if best is not None:
            print(json.dumps({"best_trial": best.number, "best_value": best.value,
                              "command": command,
                              "front": [r.number for r in on_front]}, sort_keys=True))


def _open(study: Path, storage: str | None) -> tuple[Any, Any]:
    from ..errors import ConfigError
    from ..runs.tune.objective import import_study_plugins
    from ..runs.tune.space import load_space
    from ..runs.tune.study import SPACE_FILE, TuneOptions, open_study

    if not (study / SPACE_FILE).is_file():
        raise ConfigError(f"{study}: not a study directory (no {SPACE_FILE}); start one with "
                          "funcgraph tune run SPACE --study DIR")
    import_study_plugins(study)  # what its trials were run with: names the space may use
    space = load_space(study / SPACE_FILE)
    return space, open_study(TuneOptions(space, study, storage=storage), create=False)


@user_errors
def confirm(
    study: StudyArgument,
    dataset: Annotated[str, typer.Option(
        help="The confirmation data set (one the study did not tune on).")],
    seeds: Annotated[str, typer.Option(help="Seeds, comma-separated.")] = "0,1,2",
    against: Annotated[str, typer.Option(
        help="Algorithms whose defaults run beside the tuned settings, comma-separated "
             "(empty: none).")] = "protonet,maml",
    image_size: Annotated[int | None, typer.Option(
        min=8, max=512, help="Resize the confirmation images to this size.")] = None,
    steps: Annotated[int | None, typer.Option(
        min=1, max=10_000_000,
        help="Meta-train steps of the --against algorithms (default: each one's own; the "
             "tuned settings keep the trial's).")] = None,
    episodes: Annotated[int | None, typer.Option(
        min=1, max=100_000,
        help="Held-out test tasks of every confirmation run (default: meta-train's).")
    ] = None,
    trial: Annotated[int | None, typer.Option(
        min=0, help="Confirm this complete trial's settings (one on the front tune show "
                    "prints) instead of the best trial's.")] = None,
    storage: StorageOption = None,
    device: DeviceOption = "cpu",
    threads: ThreadsOption = 0,
    import_: ImportOption = None,
) -> None:
    """Run the best trial's (or --trial's) settings unchanged on another data set with each
    seed, beside other algorithms' defaults; prints one JSON line per run and one per name.

    Example: funcgraph tune confirm studies/maml --dataset rgb-shapes --image-size 28
    """
    import json

    from ..errors import ConfigError
    from ..meta.registry import algorithm_type
    from ..runs.tune.confirm import confirm as run_confirm
    from ..runs.tune.confirm import summary

    start_run(threads=threads, imports=import_, tensorboard=False, resume=False, out=None)
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds: expected integers like 0,1,2, got {seeds!r}") from None
    if any(s < 0 for s in seed_list):
        raise ConfigError(f"--seeds: seeds are >= 0, got {seeds!r}")
    names = [a.strip() for a in against.split(",") if a.strip()]
    for name in names:
        try:
            algorithm_type(name)
        except ConfigError as e:
            raise ConfigError(f"--against {name}: {str(e).split(': ', 1)[-1]}") from None
    space, opened = _open(study, storage)
    results = run_confirm(opened, space, study, dataset, image_size=image_size,
                          seeds=seed_list, against=names, baseline_steps=steps,
                          episodes=episodes, trial=trial, device=device, echo=_echo)
    for r in results:
        print(json.dumps(r.as_record(), sort_keys=True))
    for s in summary(results):
        print(json.dumps(s, sort_keys=True))


def register(app: typer.Typer) -> None:
    tune_app.command("run")(run)
    tune_app.command("show")(show)
    tune_app.command("confirm")(confirm)
    app.add_typer(tune_app, name="tune")
