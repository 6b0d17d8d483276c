"""``funcgraph tune``: the space is checked before anything runs, trials are ordinary run
directories chosen on validation, a diverged trial fails with its reason while the study goes
on, an interrupted trial resumes from its checkpoint, two workers share one study, and the
best settings come back as a meta-train command line that meta-train accepts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import cast

import optuna
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tune_spaces import TINY  # tests/ is on sys.path under pytest
from typer.testing import CliRunner

from funcgraph.cli import app
from funcgraph.errors import ConfigError, RunDirectoryError
from funcgraph.runs.tune import objective as tune_objective
from funcgraph.runs.tune.report import TrialRow, best_command, front, table, trial_rows
from funcgraph.runs.tune.run import TuneOptions, tune
from funcgraph.runs.tune.space import parse_space
from funcgraph.runs.tune.study import origin
from funcgraph.train.ownership import RunLock

runner = CliRunner()

def space_file(tmp_path: Path, fixed: str = "") -> Path:
    path = tmp_path / "space.toml"
    path.write_text(TINY.format(fixed=fixed))
    return path


def options(tmp_path: Path, **kw: object) -> TuneOptions:
    import tomllib

    text = space_file(tmp_path, str(kw.pop("fixed", ""))).read_text()
    space = parse_space(tomllib.loads(text), text)
    return TuneOptions(space, tmp_path / "study", threads=1, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("space", "expected"), [
    ('[space]\ninner_lrr = { low = 0.1, high = 1.0 }', "did you mean inner_lr?"),
    ('[space]\ninner_lr = { low = 1.0, high = 0.1 }', "low must be below high"),
    ('[space]\ninner_lr = { low = 0.0, high = 0.1, log = true }', "log scale needs low > 0"),
    ('[space]\ninner_steps = { low = 1.5, high = 3 }', "int option; give whole numbers"),
    ('[space]\nrotate = { low = 0, high = 1 }', "give its choices"),
    ('[space]\nmeta_batch = { choices = [] }', "non-empty list"),
    ('[space]\ninner_lr = { low = -1.0, high = 0.1 }', "inner_lr = -1.0 is refused"),
    ('[space]\nfirst_order_fraction = { low = 0.0, high = 2.0 }', "lies in [0, 1]"),
    ('[space]\nseed = { choices = [0, 1] }', "seed belongs to confirmation runs"),
    ('[study]\nalgo = "protonet"\n[space]\ninner_lr = { low = 0.1, high = 1.0 }',
     "protonet has no inner loop"),
    ('[study]\nwho = 1\n[space]\ninner_lr = { low = 0.1, high = 1.0 }', "unknown keys"),
    ('[space]\n', "no knobs to search"),
    ('[study]\nalgo = "maml"\ndataset = "sinusoid"\n[space]\n'
     '"model.hiddn" = { choices = [8, 16] }',
     "model.hiddn = 8 is refused: model mlp: model.params.hiddn: unknown parameter of mlp "
     "(did you mean 'hidden'?)"),
    ('[study]\nalgo = "maml"\ndataset = "sinusoid"\n[space]\n'
     '"model.hidden" = { low = -2, high = 8 }', "model.hidden = -2 is refused"),
    ('[study]\nalgo = "maml"\ndataset = "sinusoid"\n[fixed]\n"model.hiddn" = 8\n[space]\n'
     'inner_lr = { low = 0.1, high = 1.0 }', "[fixed] model.hiddn = 8 is refused: model mlp: "
     "model.params.hiddn: unknown parameter of mlp"),
    ('[study]\nalgo = "maml"\ndataset = "sinusoid"\n[fixed]\n"model.hiddn" = 8\n[space]\n'
     '"model.in_features" = { choices = [1] }', "[fixed] model.hiddn = 8 is refused"),
    ('[study]\nalgo = "maml"\ndataset = "sinusoid"\n[space]\n'
     '"model.in_features" = { choices = [1] }\n"model.hiddn" = { choices = [8, 16] }',
     "[space] model.hiddn = 8 is refused"),
    ('[space]\nimaml_lambda = { low = 0.1, high = 2.0 }',
     "[space] imaml_lambda: maml has no imaml_lambda setting (it is imaml's)"),
    ('[space]\nfirst_order_fraction = { low = 0.0, high = 0.5 }',
     "[space] first_order_fraction: maml has no first_order_until setting (it is mamlpp's)"),
    ('[fixed]\nimaml_lambda = 1.0\n[space]\ninner_lr = { low = 0.1, high = 1.0 }',
     "[fixed] imaml_lambda: maml has no imaml_lambda setting"),
    ('[study]\nalgo = "maml"\ndataset = "glyphs"\ntasks = "5way0shot"\n[space]\n'
     'inner_lr = { low = 0.1, high = 1.0 }', "[study] tasks = '5way0shot' is refused: task spec "
     "'5way0shot': TaskSpec: shots must be an int >= 1, got 0"),
    ('[study]\ndataset = "sinusoid"\ntasks = "5way"\n[space]\n'
     'inner_lr = { low = 0.1, high = 1.0 }', "[study] tasks = '5way' is refused: sinusoid task "
     "spec '5way' is not of the form '<K>shot'"),
    ('[study]\ntasks = 5\n[space]\ninner_lr = { low = 0.1, high = 1.0 }',
     "[study] tasks = 5: expected a string, e.g. tasks = '5way1shot'"),
    ('[study]\nimage_size = 4\n[space]\ninner_lr = { low = 0.1, high = 1.0 }',
     "[study] image_size = 4 is refused: image_size: the size must be an int >= 8, got 4"),
    ('[fixed]\nfirst_order = 1\n[space]\ninner_lr = { low = 0.1, high = 1.0 }',
     "[fixed] first_order: a flag must be True or False, got 1 (int)"),
    ('[space]\nrotate = { choices = ["yes", "no"] }',
     "[space] rotate: a flag must be True or False, got 'yes' (str)"),
    ('[fixed]\nthreads = 2\n[space]\ninner_lr = { low = 0.1, high = 1.0 }',
     "[fixed] threads: 'threads' is not set in a space's [fixed] or [space] (give the trials' "
     "threads with tune run --threads)"),
])
def test_a_bad_space_is_one_line_before_anything_runs(tmp_path: Path, space: str,
                                                      expected: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(space)
    result = runner.invoke(app, ["tune", "run", str(path), "--study", str(tmp_path / "s")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], result.output
    assert not (tmp_path / "s").exists(), "a refused space must not create the study"


def test_a_spec_the_data_cannot_fill_is_one_line_before_the_first_trial(tmp_path: Path) -> None:
    """What needs the data (a spec's shots against each class's examples) is checked when
    the study starts, before a trial or a study directory exists."""
    path = tmp_path / "bad.toml"
    path.write_text('[study]\nalgo = "maml"\ndataset = "glyphs"\ntasks = "5way30shot"\n'
                    '[space]\ninner_lr = { low = 0.1, high = 1.0 }')
    result = runner.invoke(app, ["tune", "run", str(path), "--study", str(tmp_path / "s")])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "space: the study's run is refused: task spec 5way30shot1query: 30 shots + 1 " \
        "queries need 31 examples per class" in lines[0], lines
    assert not (tmp_path / "s").exists(), "no study, no trial"


def test_trials_are_run_directories_chosen_on_validation(tmp_path: Path) -> None:
    lines: list[str] = []
    study = tune(options(tmp_path, trials=3), echo=lines.append)
    finished = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(finished) == 3, [t.state for t in study.trials]
    for t in finished:
        run_dir = tmp_path / "study" / t.user_attrs["run_dir"]
        config = json.loads((run_dir / "config.json").read_text())
        assert config["inner_lr"] == pytest.approx(t.params["inner_lr"])
        records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert not [r for r in records if r["kind"] == "test"], "a trial must not peek at test"
        vals = [r["mse"] for r in records if r["kind"] == "validation"]
        if t.state.name == "COMPLETE":
            assert t.value == min(vals), "the objective is the best validation"
        assert float(t.user_attrs["cpu_s"]) > 0
    assert sum(line.startswith("trial ") for line in lines) == 3, lines
    listed = runner.invoke(app, ["runs", str(tmp_path / "study" / "trials"), "--json"])
    states = {r["name"]: r["status"] for r in json.loads(listed.output)}
    assert all(states[t.user_attrs["run_dir"].split("/")[-1]] == "finished" for t in finished
               if t.state.name == "COMPLETE"), states
    # A trial's run directory is a run: evaluate scores it.
    result = runner.invoke(app, ["evaluate", str(tmp_path / "study" / "trials" / "trial-0000"),
                                 "--episodes", "3"])
    assert result.exit_code == 0, result.output


def test_a_trial_over_the_cpu_cap_is_pruned_with_that_reason(tmp_path: Path) -> None:
    lines: list[str] = []
    study = tune(options(tmp_path, trials=1, trial_cpu_s=1e-6), echo=lines.append)
    (trial,) = study.trials
    assert trial.state.name == "PRUNED" and "over the CPU cap" in trial.user_attrs["pruned"]
    (line,) = [x for x in lines if x.startswith("trial 0:")]
    assert "over the CPU cap" in line, lines
    assert " projects " in line and "to step 4, over --trial-cpu-s 1e-06" in line, lines


def test_a_second_tune_on_a_held_study_is_refused(tmp_path: Path) -> None:
    opts = options(tmp_path, trials=1)
    lock = RunLock(opts.study_dir).acquire()
    try:
        with pytest.raises(RunDirectoryError):
            tune(opts)
    finally:
        lock.release()


def test_a_resumed_study_draws_new_settings(tmp_path: Path) -> None:
    tune(options(tmp_path, trials=2), echo=lambda _: None)
    study = tune(options(tmp_path, trials=4), echo=lambda _: None)
    draws = [t.params["inner_lr"] for t in study.trials]
    assert len(draws) == 4 and len(set(draws)) == 4, draws


def test_a_changed_space_is_a_new_study(tmp_path: Path) -> None:
    tune(options(tmp_path, trials=1), echo=lambda _: None)
    with pytest.raises(ConfigError, match="started with another space"):
        tune(options(tmp_path, trials=2, fixed="inner_steps_eval = 2"))


def test_an_option_name_is_a_setting_name_in_a_space() -> None:
    space = parse_space({"study": {"algo": "maml", "dataset": "sinusoid"},
                         "fixed": {"episodes": 7},
                         "space": {"inner_lr": {"low": 0.01, "high": 0.1}}})
    assert space.fixed == {"test_episodes": 7} and space.config({}).test_episodes == 7


def test_any_exception_fails_one_trial_with_its_reason(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    real = tune_objective.meta_train
    calls: list[int] = []

    def broken_once(cfg, out, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)")
        return real(cfg, out, **kw)

    monkeypatch.setattr(tune_objective, "meta_train", broken_once)
    lines: list[str] = []
    study = tune(options(tmp_path, trials=2), echo=lines.append)
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"]
    assert study.trials[0].user_attrs["failure"] == (
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)")
    assert "trial 0: failed (RuntimeError: mat1 and mat2" in lines[0], lines


def test_a_diverged_trial_fails_with_its_reason_and_the_study_goes_on(tmp_path: Path) -> None:
    huge = parse_space({"study": {"algo": "maml", "dataset": "sinusoid"},
                        "fixed": {"steps": 4, "validate_every": 2, "val_episodes": 4,
                                  "meta_batch": 4, "inner_steps": 1},
                        "space": {"inner_lr": {"low": 1e7, "high": 1e9, "log": True}}})
    study = tune(TuneOptions(huge, tmp_path / "study", threads=1, trials=2),
                 echo=lambda _: None)
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]
    assert all("diverged" in t.user_attrs["failure"] for t in study.trials)


@pytest.mark.parametrize("stop_at", [2, 4])
def test_an_interrupted_trial_resumes_from_its_checkpoint(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          stop_at: int) -> None:
    """Ctrl-C lands after the validation of step ``stop_at`` is recorded, before it is
    reported; the retry resumes after it (at 4: with no step left to train)."""
    real = tune_objective.meta_train
    calls: list[bool] = []

    def interrupted_once(cfg, out, **kw):  # type: ignore[no-untyped-def]
        calls.append(kw["resume"])
        if len(calls) == 1:
            report = kw["on_validation"]

            def stop(step: int, figures: object) -> None:
                if step == stop_at:
                    raise KeyboardInterrupt
                report(step, figures)
            kw["on_validation"] = stop
        return real(cfg, out, **kw)

    monkeypatch.setattr(tune_objective, "meta_train", interrupted_once)
    opts = options(tmp_path, trials=1, pruner="none")
    with pytest.raises(KeyboardInterrupt):
        tune(opts, echo=lambda _: None)
    lines: list[str] = []
    study = tune(opts, echo=lines.append)
    first, retry = study.trials
    assert first.state.name == "FAIL" and first.user_attrs["interrupted"]
    assert retry.state.name == "COMPLETE" and origin(retry) == 0
    assert retry.params == first.params and calls == [False, True]
    assert retry.user_attrs["cpu_of"] == 1 and first.user_attrs["cpu_of"] == 0, (
        "each attempt's CPU seconds are its own")
    assert any("retrying interrupted trial(s) 0" in line for line in lines), lines
    assert any(line.startswith("trial 1 (retry of trial 0, in trials/trial-0000): mse")
               for line in lines), lines
    rows = {r.number: r for r in trial_rows(study)}
    assert rows[0].reason == "interrupted; retried as trial 1", rows
    assert rows[0].step == stop_at, "the step the interrupted attempt validated"
    assert rows[1].reason == "retry of trial 0" and rows[1].run_dir == "trials/trial-0000"
    assert sorted(retry.intermediate_values) == [2, 4], "the retry reports the whole curve"
    text = " ".join(table(list(rows.values()), "mse").split())  # settings wrap at 80
    assert "[interrupted; retried as trial 1]" in text and "[retry of trial 0]" in text, text
    records = [json.loads(x) for x in
               (opts.study_dir / "trials" / "trial-0000" / "metrics.jsonl").read_text()
               .splitlines()]
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == sorted(set(steps)) and steps[-1] == 4, "resumed, not restarted"
    assert not (opts.study_dir / "trials" / "trial-0001").exists()


def test_two_workers_share_one_study(tmp_path: Path) -> None:
    study = tune(options(tmp_path, trials=4, workers=2), echo=lambda _: None)
    finished = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(finished) >= 4
    assert {t.user_attrs["worker"] for t in finished} == {0, 1}
    assert len({t.params["inner_lr"] for t in finished}) == len(finished), "distinct draws"


@pytest.mark.skipif(sys.platform == "win32", reason="terminate() is a hard kill on Windows")
def test_a_sigterm_to_the_command_stops_every_worker_and_keeps_their_trials(
        tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import time

    space = tmp_path / "long.toml"
    space.write_text(TINY.format(fixed="").replace("steps = 4", "steps = 100000")
                     .replace("validate_every = 2", "validate_every = 20"))
    command = subprocess.Popen(
        [sys.executable, "-m", "funcgraph", "tune", "run", str(space), "--study",
         str(tmp_path / "study"), "--workers", "2", "--threads", "1", "--pruner", "none"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    trials = [tmp_path / "study" / "trials" / f"trial-{n:04d}" / "metrics.jsonl"
              for n in (0, 1)]
    deadline = time.monotonic() + 240
    while not all(t.exists() and '"validation"' in t.read_text() for t in trials):
        assert command.poll() is None, command.communicate()[0]
        assert time.monotonic() < deadline, "the workers never validated"
        time.sleep(0.2)
    command.send_signal(signal.SIGTERM)  # the command alone, as a scheduler's stop
    output = command.communicate(timeout=120)[0]
    assert command.returncode != 0, output
    study = optuna.load_study(study_name="study", storage=f"sqlite:///{tmp_path}/study/study.db")
    assert sorted(t.state.name for t in study.trials) == ["FAIL", "FAIL"], output
    assert all(t.user_attrs["interrupted"] for t in study.trials), "saved to be resumed"
    for trial in study.trials:  # no worker outlives the command
        pid = int(trial.user_attrs["process"].rsplit(" ", 1)[1])
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_show_prints_80_columns_and_a_command_that_reproduces_the_trial(tmp_path: Path) -> None:
    import shlex

    from funcgraph.runs.tune.objective import best_validation

    opts = options(tmp_path, trials=3)
    study = tune(opts, echo=lambda _: None)
    text = table(trial_rows(study), "mse")
    assert max(len(line) for line in text.splitlines()) <= 80, text
    command = best_command(study, opts.space)
    assert command is not None and command.startswith("funcgraph meta-train --algo maml")
    best = study.best_trial
    assert repr(best.params["inner_lr"]) in command, "the exact value, not a rounding"
    assert command.endswith(" --device cpu --threads 1"), "what the trial ran on"
    out = tmp_path / "again"
    result = runner.invoke(app, [*shlex.split(command)[1:], "--out", str(out)])
    assert result.exit_code == 0, (command, result.output)
    assert best_validation(out, "mse") == best.value, "the printed command is the trial"
    result = runner.invoke(app, ["tune", "show", str(opts.study_dir), "--json"])
    assert result.exit_code == 0, result.output
    [summary] = [json.loads(line) for line in result.output.splitlines() if '"best_trial"' in line]
    complete = {t.number for t in study.trials if t.state.name == "COMPLETE"}
    assert summary["front"] and set(summary["front"]) <= complete, summary
    on_front = [t for t in study.trials if t.number in summary["front"]]
    # An error (sinusoid's mse): the lowest is the best, and it is on the front.
    assert min(t.value for t in on_front) == best.value, "the best figure is on the front"
    assert "front (no other complete trial is as good at both" in result.output
    for name in ("history.png", "cost.png"):
        assert (opts.study_dir / "plots" / name).stat().st_size > 1000


def test_the_best_command_names_every_value_and_reproduces_a_fomaml_trial(
        tmp_path: Path) -> None:
    """``--threads``, ``--device`` and every value of the space, a default included; a
    ``False`` flag that meta-train has no off switch for stays on the line as a comment."""
    import shlex

    from funcgraph.runs.tune.objective import best_validation

    space = tmp_path / "fomaml.toml"
    space.write_text(TINY.format(fixed="first_order = false").replace(
        'algo = "maml"', 'algo = "fomaml"'))
    result = runner.invoke(app, ["tune", "run", str(space), "--study", str(tmp_path / "study"),
                                 "--trials", "2", "--threads", "1", "--pruner", "none"])
    assert result.exit_code == 0, result.output
    shown = runner.invoke(app, ["tune", "show", str(tmp_path / "study"), "--no-plots",
                                "--json"])
    assert shown.exit_code == 0, shown.output
    [summary] = [json.loads(line) for line in shown.output.splitlines() if '"best_trial"' in line]
    command = summary["command"]
    study = optuna.load_study(study_name="study",
                              storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")
    best = study.best_trial
    assert f"  {command}" in shown.output.splitlines(), "show prints the same command"
    words = shlex.split(command, comments=True)
    assert command.endswith("# first_order=false (meta-train's default: the flag left out)")
    assert words[words.index("--threads") + 1] == "1" and "--device" in words, command
    assert words[words.index("--inner-lr") + 1] == repr(best.params["inner_lr"]), command
    assert words[words.index("--inner-steps") + 1] == str(best.params["inner_steps"]), command
    assert words[words.index("--meta-batch") + 1] == "4", "a fixed value is named"
    out = tmp_path / "again"
    again = runner.invoke(app, [*words[1:], "--out", str(out)])
    assert again.exit_code == 0, (command, again.output)
    assert json.loads((out / "config.json").read_text())["first_order"] is False
    assert best_validation(out, "mse") == best.value, "the printed command is the trial"


def row(number: int, value: float | None, cpu_s: float, state: str = "complete",
        run_dir: str | None = None) -> TrialRow:
    return TrialRow(number, state, value, 10, cpu_s, {}, run_dir, None)


def test_the_front_holds_the_trials_no_other_beats_at_both() -> None:
    rows = [row(0, 0.90, 100), row(1, 0.95, 300), row(2, 0.93, 400),  # 2: 1 is better, cheaper
            row(3, 0.95, 300), row(4, 0.97, 900), row(5, None, 10, "pruned"),
            row(6, 0.90, 100)]  # 6 ties 0 exactly: neither beats the other
    assert [r.number for r in front(rows, "acc")] == [0, 6, 1, 3, 4]
    # On an error the lower figure is the better.
    assert [r.number for r in front(rows, "mse")] == [0, 6]
    # A retry costs what all its run's attempts cost: 50 + 80 CPU s, more than trial 0.
    retried = [row(0, 0.90, 100, run_dir="trials/trial-0000"),
               row(1, None, 50, "fail", run_dir="trials/trial-0001"),
               row(2, 0.90, 80, run_dir="trials/trial-0001")]
    assert [(r.number, r.cpu_s) for r in front(retried, "acc")] == [(0, 100)]


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 20)), min_size=1, max_size=12),
       st.sampled_from(["acc", "mse"]))
def test_every_trial_off_the_front_is_beaten_by_one_on_it(points: list[tuple[int, int]],
                                                         metric: str) -> None:
    rows = [row(i, v / 20, c) for i, (v, c) in enumerate(points)]
    on = front(rows, metric)
    assert on, "a study with a complete trial has a front"
    sign = 1 if metric == "acc" else -1  # an error: the lower the better
    for r in rows:
        beaten_by = [o for o in on if o.cpu_s <= r.cpu_s and sign * cast(float, o.value) >= (
            sign * cast(float, r.value)) and (o.cpu_s, o.value) != (r.cpu_s, r.value)]
        assert (r in on) == (not beaten_by), (r, on)


def test_the_command_line_names_every_option_that_differs() -> None:
    from funcgraph.runs.meta_training.config import default_config
    from funcgraph.runs.tune.report import command_line

    cfg = default_config("mamlpp", "rgb-shapes", image_size=28, rotate=False, seed=2,
                         cosine_meta_lr=False, inner_lr=0.25)
    line = command_line(cfg, {"hidden": "64"})
    assert line == ("funcgraph meta-train --algo mamlpp --dataset rgb-shapes --image-size 28 "
                    "--no-rotate --inner-lr 0.25 --constant-meta-lr --seed 2 --set hidden=64"), line
    maml = command_line(default_config("maml", "glyphs", rotate=True), {})
    assert maml == "funcgraph meta-train --algo maml --dataset glyphs --rotate", maml


def test_confirm_runs_the_best_settings_with_each_seed(tmp_path: Path) -> None:
    opts = options(tmp_path, trials=2)
    tune(opts, echo=lambda _: None)
    args = ["tune", "confirm", str(opts.study_dir), "--dataset", "sinusoid", "--seeds", "0,1",
            "--against", "", "--episodes", "3"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "warning: --dataset sinusoid is the data set the study tuned on" in result.output
    records = [json.loads(line) for line in result.output.splitlines()
               if line.startswith("{")]
    runs = [r for r in records if "seed" in r]
    assert [r["seed"] for r in runs] == [0, 1] and all(r["metric"] == "mse" for r in runs)
    assert all(r["confirm"].startswith("trial") for r in runs), runs
    assert all(json.loads((Path(r["run_dir"]) / "config.json").read_text())["test_episodes"]
               == 3 for r in runs)
    again = runner.invoke(app, args)  # finished runs are read back, not run again
    assert again.exit_code == 0 and "confirm trial" not in again.output, again.output
    # A directory holding other settings is refused, never credited to these.
    [run_dir] = {Path(r["run_dir"]) for r in runs if r["seed"] == 0}
    config = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**config, "inner_lr": 0.123}))
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "holds a run with other settings (inner_lr)" in (
        refused.output), refused.output
    assert optuna.__version__  # the study store is Optuna's


def test_confirm_takes_a_chosen_complete_trial_and_refuses_another(tmp_path: Path) -> None:
    opts = options(tmp_path, trials=2, pruner="none")
    study = tune(opts, echo=lambda _: None)
    other = next(t.number for t in study.trials if t.number != study.best_trial.number)
    args = ["tune", "confirm", str(opts.study_dir), "--dataset", "sinusoid", "--seeds", "0",
            "--against", "", "--episodes", "3"]
    result = runner.invoke(app, [*args, "--trial", str(other)])
    assert result.exit_code == 0, result.output
    [run] = [json.loads(line) for line in result.output.splitlines() if '"seed"' in line]
    assert run["confirm"] == f"trial{other}", run
    assert json.loads((Path(run["run_dir"]) / "config.json").read_text())["inner_lr"] == (
        study.trials[other].params["inner_lr"]), "the chosen trial's settings, unchanged"
    refused = runner.invoke(app, [*args, "--trial", "7"])
    assert refused.exit_code == 2 and "--trial 7: " in refused.output and (
        "holds trials 0 to 1" in refused.output), refused.output
    from funcgraph.runs.tune.confirm import chosen_trial

    pruned = optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED,
                                       params={}, distributions={})
    study.add_trial(pruned)
    with pytest.raises(ConfigError, match="--trial 2: that trial is pruned, not complete"):
        chosen_trial(study, opts.study_dir, 2)


def test_confirm_runs_the_baselines_for_the_steps_asked() -> None:
    from funcgraph.runs.tune.confirm import confirm_configs

    space = parse_space({"study": {"algo": "maml", "dataset": "sinusoid"},
                         "fixed": {"steps": 4},
                         "space": {"inner_lr": {"low": 0.01, "high": 0.1}}})
    runs = confirm_configs(space, {"inner_lr": 0.05}, "sinusoid", image_size=None, seeds=[0],
                           against=["maml"], baseline_steps=7, episodes=9)
    (_, tuned, _), (_, baseline, _) = runs
    assert (tuned.steps, tuned.test_episodes) == (4, 9), "the tuned settings keep their steps"
    assert (baseline.steps, baseline.test_episodes) == (7, 9)


def test_show_and_confirm_refuse_what_is_not_a_study_in_one_line(tmp_path: Path) -> None:
    for args in (["show", str(tmp_path / "nowhere")],
                 ["confirm", str(tmp_path), "--dataset", "sinusoid"]):
        result = runner.invoke(app, ["tune", *args])
        assert result.exit_code == 2 and "not a study directory" in result.output, result.output
    (tmp_path / "space.toml").write_text(space_file(tmp_path).read_text())
    result = runner.invoke(app, ["tune", "show", str(tmp_path)])
    assert result.exit_code == 2 and "its storage holds no study" in result.output, result.output
    result = runner.invoke(app, ["tune", "confirm", str(tmp_path), "--dataset", "sinusoid",
                                 "--against", "bogus"])
    assert result.exit_code == 2 and "--against bogus: not a registered" in result.output


@pytest.mark.parametrize(("args", "expected"), [
    (["--pruner", "foo"], "--pruner must be one of hyperband, halving, median, none"),
    (["--cpu-hours", "0"], "--cpu-hours must be a number above 0 (a budget of 0 runs nothing"),
    (["--storage", "bogus://x"], "--storage bogus://x: NoSuchModuleError"),
])
def test_bad_run_options_are_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    result = runner.invoke(app, ["tune", "run", str(space_file(tmp_path)), "--study",
                                 str(tmp_path / "study"), "--trials", "1", *args])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and expected in lines[0], result.output


def test_bad_confirm_seeds_are_one_line(tmp_path: Path) -> None:
    tune(options(tmp_path, trials=1), echo=lambda _: None)
    for seeds, expected in (("a,b", "expected integers like 0,1,2"), ("-1", "seeds are >= 0")):
        result = runner.invoke(app, ["tune", "confirm", str(tmp_path / "study"), "--dataset",
                                     "sinusoid", "--seeds", seeds, "--against", ""])
        assert result.exit_code == 2 and expected in result.output, result.output


def test_a_study_imports_what_its_trials_were_run_with(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``tune show``/``confirm`` import the trials' recorded ``--import`` modules first (the
    space may name a plugin's algorithm), and a module gone is one line naming the trial."""
    import sys

    trial = tune_objective.trial_dir(tmp_path, 0)
    trial.mkdir(parents=True)
    (trial / "config.json").write_text(json.dumps({"imports": ["study_plugin_mod"]}))
    (tmp_path / "study_plugin_mod.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        tune_objective.import_study_plugins(tmp_path)
        assert sys.modules["study_plugin_mod"].LOADED
    finally:
        sys.modules.pop("study_plugin_mod", None)
    (tmp_path / "study_plugin_mod.py").unlink()
    with pytest.raises(ConfigError, match=f"the run in {trial} was made with --import "
                                          "study_plugin_mod, which does not import here"):
        tune_objective.import_study_plugins(tmp_path)


def test_a_journal_file_holds_the_study_instead_of_sqlite(tmp_path: Path) -> None:
    journal = tmp_path / "shared" / "study.journal"
    journal.parent.mkdir()
    study = tune(options(tmp_path, trials=2, storage=f"journal:{journal}"), echo=lambda _: None)
    assert len([t for t in study.trials if t.state.name == "COMPLETE"]) == 2
    assert journal.stat().st_size > 0 and not (tmp_path / "study" / "study.db").exists()


@pytest.mark.parametrize("budget", [{"cpu_hours": 1e-7}, {"timeout_s": 1e-3}])
def test_a_spent_budget_stops_the_study_after_the_running_trial(
        tmp_path: Path, budget: dict[str, float]) -> None:
    study = tune(options(tmp_path, trials=5, **budget), echo=lambda _: None)
    assert len(study.trials) == 1, [t.state.name for t in study.trials]


def test_the_importance_plot_is_drawn_once_two_trials_differ(tmp_path: Path) -> None:
    from funcgraph.runs.tune.report import write_plots

    opts = options(tmp_path, trials=3, pruner="none")
    written = write_plots(tune(opts, echo=lambda _: None), tmp_path / "plots", "mse")
    assert {p.name for p in written} == {"history.png", "importance.png", "cost.png"}
    assert all(p.stat().st_size > 1000 for p in written)
