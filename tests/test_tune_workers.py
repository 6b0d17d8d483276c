"""``funcgraph tune`` with several processes: two starts at once on one store take turns
(one study per directory, a retry queued once), and a worker killed mid-trial has its trial
retried by the others while the command ends normally, naming the retry."""

from __future__ import annotations

import json
import multiprocessing
import sys
import textwrap
import threading
import tomllib
from pathlib import Path
from typing import Any

import optuna
import pytest
from tune_spaces import TINY  # tests/ is on sys.path, here and in the spawned starts

from funcgraph.runs.tune.space import parse_space
from funcgraph.runs.tune.study import TuneOptions, open_study, retry_callback, retry_unfinished

SPACE = TINY.format(fixed="")


def _options(study_dir: Path, journal: Path, name: str | None = None) -> TuneOptions:
    space = parse_space(tomllib.loads(SPACE), SPACE)
    return TuneOptions(space, study_dir, storage=f"journal:{journal}", study_name=name)


def _start(study_dir: Path, journal: Path, name: str, barrier: Any, queue: Any) -> None:
    """One start as ``tune`` makes it: open (or create) the study at the barrier, then
    queue the retries of unfinished trials; reports its directory id or its refusal. The
    store is slow to queue a retry (a second between reading the trials and writing the
    retry, as a remote database may be), so two starts without turns would both queue it."""
    import time

    from funcgraph.runs.tune import study as tune_study

    optuna_retry = tune_study.retry_callback

    def slow_retry() -> Any:
        queue_it = optuna_retry()

        def later(study: Any, trial: Any) -> None:
            time.sleep(1.0)
            queue_it(study, trial)
        return later

    tune_study.retry_callback = slow_retry
    try:
        opts = _options(study_dir, journal, name)
        barrier.wait(timeout=120)
        study = open_study(opts)
        try:
            barrier.wait(timeout=120)  # both opened: now both recover at once
        except threading.BrokenBarrierError:
            pass  # the other start was refused
        again = retry_unfinished(opts, study)
        queue.put((str(study_dir), "ok", study.user_attrs["directory_id"], again))
    except Exception as e:  # noqa: BLE001 - the parent asserts on what happened
        barrier.abort()
        queue.put((str(study_dir), "refused", str(e), []))


def _race(*starts: tuple[Path, Path, str]) -> list[tuple[str, str, Any, list[int]]]:
    context = multiprocessing.get_context("spawn")
    barrier, queue = context.Barrier(len(starts)), context.Queue()
    processes = [context.Process(target=_start, args=(*s, barrier, queue)) for s in starts]
    for p in processes:
        p.start()
    results = [queue.get(timeout=240) for _ in processes]
    for p in processes:
        p.join(timeout=60)
        assert p.exitcode == 0, p.exitcode
    return sorted(results)


def test_two_first_starts_of_one_directory_agree_on_its_study(tmp_path: Path) -> None:
    journal = tmp_path / "shared.journal"
    results = _race((tmp_path / "study", journal, "study"), (tmp_path / "study", journal, "study"))
    assert [r[1] for r in results] == ["ok", "ok"], results
    record = (tmp_path / "study" / "study.json").read_text()
    assert results[0][2] == results[1][2] and results[0][2] in record, (results, record)
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal)))
    assert optuna.get_all_study_names(storage) == ["study"]


def test_two_directories_starting_one_name_at_once_get_one_study(tmp_path: Path) -> None:
    """The store decides which start creates the study; the other is refused, never merged,
    however close together they start."""
    journal = tmp_path / "shared.journal"
    results = _race((tmp_path / "a" / "maml", journal, "maml"),
                    (tmp_path / "b" / "maml", journal, "maml"))
    outcomes = sorted(r[1] for r in results)
    assert outcomes == ["ok", "refused"], results
    [refused] = [r for r in results if r[1] == "refused"]
    [owner] = [r[0] for r in results if r[1] == "ok"]
    assert f"belongs to the study directory {owner}, not {refused[0]}" in refused[2], refused


def test_two_starts_at_once_queue_a_killed_trial_once(tmp_path: Path) -> None:
    journal = tmp_path / "shared.journal"
    opts = _options(tmp_path / "study", journal)
    study = open_study(opts)
    trial = study.ask({"inner_lr": optuna.distributions.FloatDistribution(0.001, 0.05,
                                                                          log=True)})
    study.tell(trial, state=optuna.trial.TrialState.FAIL)  # a killed attempt: no reason
    results = _race((tmp_path / "study", journal, "study"), (tmp_path / "study", journal, "study"))
    assert sorted(r[3] for r in results) == [[], [0]], results
    retries = [t for t in study.get_trials(deepcopy=False) if t.number != 0]
    assert [t.state.name for t in retries] == ["WAITING"], "one retry, not two"


def test_a_retry_does_not_count_its_failed_attempts_cpu_seconds(tmp_path: Path) -> None:
    """Optuna's retry copies the failed attempt's user attributes, ``cpu_s`` included."""
    from funcgraph.runs.tune.report import trial_rows
    from funcgraph.runs.tune.study import cpu_seconds

    study = optuna.create_study()
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL, params={"x": 1.0},
        distributions={"x": optuna.distributions.FloatDistribution(0, 2)},
        user_attrs={"cpu_s": 5.0, "cpu_of": 0}))
    retry_callback()(study, study.trials[0])
    assert study.trials[1].user_attrs["cpu_s"] == 5.0, "Optuna copied it"
    assert cpu_seconds(study) == 5.0, "counted once, for the attempt that spent it"
    assert [r.cpu_s for r in trial_rows(study)] == [5.0], "the waiting retry is no row"


PLUGIN = '''
import os
import signal
import time

import optuna

from funcgraph.runs.tune import objective as tune_objective

_real = tune_objective.meta_train


def _retry_queued(study_dir):
    study = optuna.load_study(study_name=study_dir.name,
                              storage=f"sqlite:///{study_dir / 'study.db'}")
    return any("failed_trial" in t.system_attrs for t in study.get_trials(deepcopy=False))


def meta_train(cfg, out, **kw):
    """Worker 0 dies by SIGKILL after its trial's first validation; worker 1 ends its first
    trial only once the dead worker's trial is queued again, so it runs the retry next."""
    label = kw["label"]
    if "retry" not in label and label.startswith("[worker 0,"):
        report = kw["on_validation"]

        def die(step, figures):
            report(step, figures)
            os.kill(os.getpid(), signal.SIGKILL)
        kw["on_validation"] = die
    elif "retry" not in label:
        deadline = time.monotonic() + 120
        while not _retry_queued(out.parent.parent) and time.monotonic() < deadline:
            time.sleep(0.2)
    return _real(cfg, out, **kw)


tune_objective.meta_train = meta_train
'''


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_killed_worker_is_retried_and_the_command_ends_normally(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from funcgraph.cli import app
    from funcgraph.runs.tune import objective as tune_objective

    (tmp_path / "kill_worker_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))  # the spawned workers inherit sys.path
    monkeypatch.setattr(tune_objective, "meta_train", tune_objective.meta_train)  # restored
    monkeypatch.delitem(sys.modules, "kill_worker_plugin", raising=False)
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    study_dir = tmp_path / "study"
    runner = CliRunner()
    done = runner.invoke(app, ["tune", "run", str(space), "--study", str(study_dir),
                               "--workers", "2", "--trials", "2", "--threads", "1", "--pruner",
                               "none", "--import", "kill_worker_plugin"])
    sys.modules.pop("kill_worker_plugin", None)
    assert done.exit_code == 0, done.output
    study = optuna.load_study(study_name="study", storage=f"sqlite:///{study_dir}/study.db")
    killed = [t for t in study.trials if t.state.name == "FAIL"]
    assert len(killed) == 1, [t.state.name for t in study.trials]
    [retry] = [t for t in study.trials if t.system_attrs.get("failed_trial") == killed[0].number]
    assert retry.state.name == "COMPLETE" and retry.user_attrs["worker"] == 1, done.output
    line = (f"worker 0 (pid {killed[0].user_attrs['process'].rsplit(' ', 1)[1]}) was killed by "
            f"SIGKILL in trial {killed[0].number}, retried as trial {retry.number} (complete); "
            "the study met its budget")
    assert line in done.output, done.output
    shown = runner.invoke(app, ["tune", "show", str(study_dir), "--no-plots", "--json"])
    assert shown.exit_code == 0, shown.output
    rows = {r["trial"]: r for r in (json.loads(line) for line in shown.output.splitlines()
                                    if line.startswith('{"'))
            if "state" in r}
    assert rows[killed[0].number]["reason"] == (
        f"killed or lost: its process ended without a word; retried as trial {retry.number}")
