"""What a run depends on is recorded and used again: thread count, compile, precision and
the strategies in ``config.json``; ``--resume`` takes them, honours the options that may
change mid-run and refuses the others in one line; ``evaluate`` scores with the run's own
strategy; every option of meta-train, train and search maps to a config key or says why not;
a run says what one meta-step will cost before it takes one."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import torch
import typer.main
from test_meta_train import config, sources, step_key  # tests/ is on sys.path under pytest
from typer.testing import CliRunner

from funcgraph.cli import app
from funcgraph.meta.strategy import STRATEGIES
from funcgraph.placement import cpu_threads
from funcgraph.runs import MetaTrainConfig, TrainConfig, default_config, evaluate_run, meta_train
from funcgraph.train import Run

runner = CliRunner()

SINE = ["meta-train", "--dataset", "sinusoid", "--meta-batch", "2", "--episodes", "3",
        "--val-episodes", "2", "--validate-every", "2", "--device", "cpu"]


def quiet(cfg: MetaTrainConfig, out: Path, lines: list[str] | None = None, **kw: Any) -> Any:
    echo = (lambda _: None) if lines is None else lines.append
    return meta_train(cfg, out, show_progress=False, echo=echo, **kw)


def metrics(out: Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "tasks_per_s"} for r in Run.open(out).metrics()]


def test_config_json_records_threads_compile_precision_and_the_strategies(
        tmp_path: Path) -> None:
    quiet(replace(config(2), threads=1), tmp_path / "run", sources=sources())
    recorded = Run.open(tmp_path / "run").config
    assert recorded["threads"] == 1 and recorded["compile"] is False, recorded
    assert recorded["precision"] == "float32", recorded
    assert recorded["step_strategy"] in STRATEGIES, recorded
    assert recorded["score_strategy"] in STRATEGIES, recorded
    _, meta = Run.open(tmp_path / "run").load("last")
    assert meta["strategy"] == recorded["step_strategy"], "one strategy, recorded twice"


def test_resume_runs_at_the_recorded_thread_count_and_ends_bit_identical(
        tmp_path: Path) -> None:
    """The run records 1 thread; resumed from a process at 2 threads without naming a count,
    every step runs at 1 again and the metrics equal the uninterrupted run's exactly."""
    one = replace(config(4), threads=1)
    whole = quiet(one, tmp_path / "whole", sources=sources())
    with pytest.raises(KeyboardInterrupt):
        quiet(one, tmp_path / "cut", sources=sources(interrupt_at=3))
    seen: list[int] = []
    with cpu_threads(2):
        resumed = quiet(config(4), tmp_path / "cut", sources=sources(), resume=True,
                        on_step=lambda _: seen.append(torch.get_num_threads()))
        assert torch.get_num_threads() == 2, "the caller's thread count is restored"
    assert seen == [1, 1], f"the resumed steps ran at {seen} threads, the run at 1"
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "whole"), "metrics differ"
    for name, value in whole.params.items():
        assert torch.equal(value, resumed.params[name]), f"{name} differs after the resume"
    assert Run.open(tmp_path / "cut").config == Run.open(tmp_path / "whole").config


def test_a_thread_count_named_on_resume_is_honoured_and_logged(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert runner.invoke(app, [*SINE, "--steps", "2", "--threads", "1", "--out", str(out)]
                         ).exit_code == 0
    assert Run.open(out).config["threads"] == 1
    with cpu_threads(1):
        result = runner.invoke(app, ["meta-train", "--resume", "--out", str(out), "--steps",
                                     "3", "--threads", "2"])
    assert result.exit_code == 0, result.output
    assert "resumed at step 2 with steps 3 (was 2), threads 2 (was 1)" in result.output, (
        result.output)
    assert Run.open(out).config["threads"] == 2
    [change] = [r for r in Run.open(out).metrics() if r["kind"] == "resume"]
    assert change == {"kind": "resume", "step": 2, "changed": {"threads": [1, 2],
                                                               "steps": [2, 3]}}, change


def test_compile_named_on_resume_reaches_the_config(tmp_path: Path) -> None:
    """Typer's parameter is ``compile_``: named on a resume it sets ``compile`` (a dry run
    prints the config the resume would run), and ``--no-compile`` turns it off again."""
    out = tmp_path / "run"
    assert runner.invoke(app, [*SINE, "--steps", "2", "--out", str(out)]).exit_code == 0
    for flag, want in (("--compile", True), ("--no-compile", False)):
        result = runner.invoke(app, ["meta-train", "--resume", "--out", str(out), flag,
                                     "--dry-run"])
        assert result.exit_code == 0, result.output
        shown = json.loads(result.output[:result.output.index("\n}\n") + 2])
        assert shown["compile"] is want, f"{flag}: the resumed config has {shown['compile']}"


@pytest.mark.parametrize("args,named", [
    (["--algo", "fomaml"], "algo: 'maml' -> 'fomaml'"),
    (["--tasks", "5shot"], "tasks: '10shot' -> '5shot'"),
    (["--precision", "bf16"], "precision: 'float32' -> 'bf16'"),
])
def test_options_that_change_the_results_mid_run_are_refused_in_one_line(
        tmp_path: Path, args: list[str], named: str) -> None:
    out = tmp_path / "run"
    assert runner.invoke(app, [*SINE, "--steps", "2", "--out", str(out)]).exit_code == 0
    before = (out / "config.json").read_text()
    result = runner.invoke(app, ["meta-train", "--resume", "--out", str(out), *args])
    lines = [x for x in result.output.splitlines() if x.startswith("error:")]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "Traceback" not in result.output, result.output
    assert "options differ from the run" in lines[0] and named in lines[0], lines
    assert (out / "config.json").read_text() == before, "a refused resume changed the record"


def test_a_strategy_named_against_the_recorded_one_is_refused() -> None:
    with pytest.raises(Exception, match="the run's meta-step took loop"):
        replace(config(2), strategy="vmap", step_strategy="loop")


def test_evaluate_scores_with_the_runs_recorded_strategy_under_max_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``--max-memory`` the scoring strategy depends on the memory the process holds;
    evaluate takes the run's recorded one (here vmap, where the memory now would choose the
    loop) and gives the run's test figure bit for bit. A run without the record is scored
    with a strategy chosen now, and evaluate says so."""
    from funcgraph.runs import evaluate as evaluate_module
    from funcgraph.runs.meta_training import plan as meta_plan

    cfg = default_config("maml", "sinusoid", steps=2, meta_batch=2, val_episodes=2,
                         validate_every=2, test_episodes=20, strategy="vmap",
                         max_memory=2**40)
    out = tmp_path / "run"
    result = quiet(cfg, out, device="cpu")
    assert Run.open(out).config["score_strategy"] == "vmap"
    used: list[str] = []
    scorer = evaluate_module.evaluate

    def spy(*args: Any, **kw: Any) -> Any:
        used.append(kw["strategy"])
        return scorer(*args, **kw)

    monkeypatch.setattr(evaluate_module, "evaluate", spy)
    monkeypatch.setattr(meta_plan, "tasks_at_once", lambda *_: 10**9)  # nothing fits at once
    scored = evaluate_run(out, device="cpu")
    assert used == ["vmap"], used
    assert scored.note is None
    assert scored.result.mean == result.test.mean and scored.result.ci95 == result.test.ci95
    assert scored.recorded is not None and scored.recorded.result.mean == result.test.mean

    older = json.loads((out / "config.json").read_text())
    del older["score_strategy"]
    (out / "config.json").write_text(json.dumps(older))
    old = evaluate_run(out, device="cpu")
    assert used[-1] == "loop" and old.note is not None, (used, old.note)
    assert "recorded no scoring strategy" in old.note, old.note


def test_evaluate_runs_at_the_recorded_thread_count(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from funcgraph.runs import evaluate as evaluate_module

    cfg = default_config("maml", "sinusoid", steps=1, meta_batch=2, validate_every=0,
                         test_episodes=3, threads=1)
    quiet(cfg, tmp_path / "run", device="cpu")
    seen: list[int] = []
    scorer = evaluate_module.evaluate

    def spy(*args: Any, **kw: Any) -> Any:
        seen.append(torch.get_num_threads())
        return scorer(*args, **kw)

    monkeypatch.setattr(evaluate_module, "evaluate", spy)
    with cpu_threads(2):
        evaluate_run(tmp_path / "run", device="cpu")
        evaluate_run(tmp_path / "run", device="cpu", threads=2)
    assert seen == [1, 2], seen


def test_the_run_says_what_a_meta_step_costs_before_the_first_step(tmp_path: Path) -> None:
    lines: list[str] = []
    before_first: list[list[str]] = []
    quiet(config(2), tmp_path / "run", lines, sources=sources(),
          on_step=lambda step: before_first.append(list(lines)) if step == 1 else None)
    [cost] = [x for x in before_first[0] if x.startswith("one meta-step: about ")]
    assert "(2 of its 2 tasks timed, scaled)" in cost, cost
    assert "B and" not in cost.split(" (")[0] or "iB" in cost, cost
    assert " for 2 step(s), validation not included" in cost, cost


def test_a_meta_batch_of_100000_says_its_cost_before_it_draws_its_tasks(
        tmp_path: Path) -> None:
    """The size the hostile-input checks once refused: with the free memory to hold it, the
    run starts and says at once what each step will cost; the refusal where the memory is
    short stands (tests/test_memory_sizes.py). Ctrl-C as the first meta-batch is drawn."""
    from funcgraph.runs.task_sources import sources_for

    cfg = default_config("maml", "glyphs", meta_batch=100_000, steps=1, validate_every=0,
                         model={"name": "conv4", "ways": 5, "in_channels": 1, "hidden": 4,
                                "image_size": 28, "variant": "strided"})
    real = sources_for(cfg)
    first = step_key(1)

    def train(key: torch.Tensor, n: int) -> Any:
        if torch.equal(key, first) and n == 100_000:
            raise KeyboardInterrupt
        return real.train(key, n)

    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        quiet(cfg, tmp_path / "big", lines, sources=replace(real, train=train), device="cpu")
    [cost] = [x for x in lines if x.startswith("one meta-step: about ")]
    assert "(4 of its 100,000 tasks timed, scaled)" in cost, cost
    assert "GiB" in cost, f"a step holds gigabytes of task data: {cost}"


def test_fmt_seconds_reads_at_a_glance() -> None:
    from funcgraph.runs.meta_training.loop import fmt_seconds

    assert fmt_seconds(0.25) == "0.25 s" and fmt_seconds(90) == "90 s"
    assert fmt_seconds(3000) == "50 min" and fmt_seconds(12000) == "3.33 h"


# Every option of the training commands maps to a config key, or says why it needs none.

def config_keys(command: str) -> set[str]:
    if command == "meta-train":
        return {f.name for f in fields(MetaTrainConfig)}
    if command == "train":
        return {f.name for f in fields(TrainConfig)}
    from funcgraph.nas import SearchConfig

    flat = set()
    for key, value in SearchConfig().to_dict().items():
        flat |= {f"{key}.{k}" for k in value} if isinstance(value, dict) else {key}
    return flat | {"data", "threads"}  # what run_search adds beside the search's own


FIELDS_WITHOUT_OPTIONS = {
    "meta-train": {"checkpoint_every", "step_strategy", "score_strategy", "chunk_size"},
    "train": {"checkpoint_every", "loss"},  # every tenth of the run; the model's preset's
    "search": {"nodes", "multiplier", "stem_multiplier", "arch_init_scale"}  # --model's
    | {k for k in config_keys("search") if k.startswith("bilevel.")}
    - {"bilevel.order", "bilevel.hypergradient"},  # DARTS' optimiser settings, fixed
}
"""Config keys no option sets by its own name: resolved by the run (strategies), derived (the
checkpoint interval), fixed (DARTS' optimisers) or given by a config file (the search's
network)."""


@pytest.mark.parametrize("command", ["meta-train", "train", "search"])
def test_every_option_maps_to_a_config_key_or_says_why_not(command: str) -> None:
    import importlib

    module = importlib.import_module(f"funcgraph.commands.{command.replace('-', '_')}")
    group: Any = typer.main.get_command(app)  # typer may bring a click of its own
    options = [p.name for p in group.commands[command].params
               if p.param_type_name == "option" and p.name]
    keys = config_keys(command)
    assert options and keys
    for name in options:
        if name in module.NOT_IN_CONFIG:
            assert len(module.NOT_IN_CONFIG[name]) > 10, f"{command} {name}: no reason given"
            assert name not in keys, f"{command} {name} is a config key, yet listed as none"
            continue
        for key in module.OPTION_FIELDS.get(name, (name,)):
            assert key in keys, (f"{command}: option {name} sets {key!r}, which config.json "
                                 "does not hold; map it (OPTION_FIELDS) or say why it "
                                 "needs no record (NOT_IN_CONFIG)")
    stale = set(module.NOT_IN_CONFIG) - set(options)
    assert not stale, f"{command}: NOT_IN_CONFIG lists no such options {stale}"
    reached = {k for n in options if n not in module.NOT_IN_CONFIG
               for k in module.OPTION_FIELDS.get(n, (n,))}
    unset = keys - reached - FIELDS_WITHOUT_OPTIONS[command]
    assert not unset, f"{command}: config keys no option sets: {sorted(unset)}"


def test_a_named_option_the_command_does_not_map_is_a_loud_bug() -> None:
    from funcgraph.commands.common import resumed_config

    recorded = config(2)
    assert resumed_config(recorded, frozenset({"compile_"}), {"compile": True},
                          {"compile_": ("compile",)}).compile is True
    with pytest.raises(TypeError, match="'compile_' sets field 'compile_'"):
        resumed_config(recorded, frozenset({"compile_"}), {"compile": True})
    assert resumed_config(recorded, frozenset({"device"}), {}, unrecorded={"device"}) == recorded


def test_train_and_search_record_their_thread_count_and_a_resume_takes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``train`` and ``search`` run at the count they are given and record the count they ran
    with (0: the process's); a resume that names none runs at the recorded one, whatever the
    process's count. (The runs themselves are stubbed: what is checked is the count each
    starts at and the config it records.)"""
    from funcgraph.nas import SearchConfig
    from funcgraph.runs import fit, run_search, train_config
    from funcgraph.runs import search as search_module
    from funcgraph.runs import train as train_module

    seen: list[tuple[int, int]] = []  # (threads at the start, threads recorded)
    monkeypatch.setattr(train_module, "_fit", lambda cfg, *a, **kw: seen.append(
        (torch.get_num_threads(), cfg.threads)))
    monkeypatch.setattr(search_module, "_run_search", lambda *a, extra_config, **kw: seen.append(
        (torch.get_num_threads(), extra_config["threads"])))
    cfg = train_config("rnn", steps=1, threads=1)
    search = SearchConfig()
    with cpu_threads(2):
        fit(cfg, tmp_path / "fit")
        run_search(tmp_path / "search", None, search, threads=1)  # type: ignore[arg-type]
        fit(replace(cfg, threads=0), tmp_path / "fit")  # a new run: the process's count
        assert seen == [(1, 1), (1, 1), (2, 2)], seen
        for out in (tmp_path / "fit", tmp_path / "search"):
            out.mkdir()
            (out / "config.json").write_text(json.dumps({"threads": 1}))
        fit(replace(cfg, threads=0), tmp_path / "fit", resume=True)
        run_search(tmp_path / "search", None, search, resume=True)  # type: ignore[arg-type]
        fit(replace(cfg, threads=2), tmp_path / "fit", resume=True)  # named: honoured
    assert seen[3:] == [(1, 1), (1, 1), (2, 2)], seen
