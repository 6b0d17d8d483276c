"""``funcgraph tune`` on a real PostgreSQL server (started by the test, see
``tests/postgres_server.py``): two separate ``tune run`` processes share one study, and the
trial of a worker killed mid-run is failed by Optuna's heartbeat and retried by another
process, resuming from the dead worker's checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from postgres_server import postgres_url

SPACE = """
[study]
algo = "maml"
dataset = "sinusoid"

[fixed]
steps = {steps}
validate_every = {validate}
checkpoint_every = {validate}
val_episodes = 4
meta_batch = 4

[space]
inner_lr = {{ low = 0.001, high = 0.05, log = true }}
"""


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with postgres_url() as found:
        yield found


def tune_run(tmp_path: Path, url: str, study: str, *args: str, steps: int,
             validate: int) -> subprocess.Popen[str]:
    space = tmp_path / f"{study}.toml"
    space.write_text(SPACE.format(steps=steps, validate=validate))
    return subprocess.Popen(
        [sys.executable, "-m", "funcgraph", "tune", "run", str(space), "--study",
         str(tmp_path / study), "--storage", url, "--threads", "1", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})


def wait_for(path: Path, process: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.2)


def test_two_processes_share_one_study(tmp_path: Path, url: str) -> None:
    """The first process stops once the study holds 2 finished trials, the second at 4: the
    first runs at most 2 (it starts a trial only while fewer than 2 are finished), so the
    second runs at least 2, however early the first started or fast it ran."""
    first = tune_run(tmp_path, url, "shared", "--trials", "2", steps=60, validate=30)
    wait_for(tmp_path / "shared" / "trials" / "trial-0000" / "config.json", first)
    second = tune_run(tmp_path, url, "shared", "--trials", "4", steps=60, validate=30)
    outputs = [p.communicate(timeout=300)[0] for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outputs
    study = optuna.load_study(study_name="shared", storage=url)
    done = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(done) >= 4, [t.state.name for t in study.trials]
    ran = {p.pid: sum(t.user_attrs["process"].endswith(f" pid {p.pid}") for t in done)
           for p in (first, second)}
    assert 1 <= ran[first.pid] <= 2 and ran[second.pid] >= 2, f"both ran trials: {ran}"
    assert len({t.user_attrs["run_dir"] for t in done}) == len(done), "one directory each"
    # What the study is, readable by plain Optuna; the directory remembers the storage.
    assert study.user_attrs["algo"] == "maml" and study.user_attrs["dataset"] == "sinusoid"
    assert set(study.user_attrs["space"]) == {"inner_lr"}
    record = json.loads((tmp_path / "shared" / "study.json").read_text())
    assert record == {"study_name": "shared", "storage": url,
                      "directory_id": study.user_attrs["directory_id"]}
    shown = subprocess.run([sys.executable, "-m", "funcgraph", "tune", "show",
                            str(tmp_path / "shared"), "--no-plots"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "best: trial" in shown.stdout, shown.stdout + shown.stderr


def test_a_killed_workers_trial_is_retried_from_its_checkpoint(tmp_path: Path,
                                                              url: str) -> None:
    trial_dir = tmp_path / "killed" / "trials" / "trial-0000"
    doomed = tune_run(tmp_path, url, "killed", "--trials", "1", "--heartbeat-s", "1",
                      "--pruner", "none", steps=400, validate=50)
    wait_for(trial_dir / "checkpoints" / "last.json", doomed)
    doomed.send_signal(signal.SIGKILL)  # no Ctrl-C handler runs: the trial stays RUNNING
    doomed.communicate(timeout=60)
    study = optuna.load_study(study_name="killed", storage=url)
    assert [t.state.name for t in study.trials] == ["RUNNING"]
    killed_at = max(json.loads(line)["step"] for line in
                    (trial_dir / "metrics.jsonl").read_text().splitlines()
                    if json.loads(line)["kind"] == "validation")
    time.sleep(6)  # five missed beats of one second: the trial is stale
    rescuer = tune_run(tmp_path, url, "killed", "--trials", "1", "--heartbeat-s", "1",
                       "--pruner", "none", steps=400, validate=50)
    output = rescuer.communicate(timeout=300)[0]
    assert rescuer.returncode == 0, output
    first, retry = optuna.load_study(study_name="killed", storage=url).trials
    assert first.state.name == "FAIL" and retry.state.name == "COMPLETE", output
    assert retry.params == first.params and retry.system_attrs["failed_trial"] == 0
    # Optuna copies the killed attempt's user attributes into the retry: these the retry
    # itself set (who ran it, its own CPU seconds, the whole curve caught up and reported).
    assert retry.user_attrs["process"].endswith(f" pid {rescuer.pid}"), retry.user_attrs
    assert retry.user_attrs["cpu_of"] == retry.number
    assert sorted(retry.intermediate_values) == list(range(50, 401, 50)), output
    steps = [json.loads(line)["step"] for line in
             (trial_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "validation"]
    assert steps == sorted(set(steps)) and steps[-1] == 400, "resumed, not restarted"
    assert killed_at in steps and not (tmp_path / "killed" / "trials" / "trial-0001").exists()
    assert "trial 1 (retry of trial 0, in trials/trial-0000)" in output, output


def test_a_missing_server_fails_where_ci_requires_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``.ci/run`` sets ``FUNCGRAPH_REQUIRE_POSTGRES=1``: a prerequisite missing there is a
    failure, not a skip that leaves CI green with the tests above unrun."""
    import postgres_server

    monkeypatch.setattr(postgres_server, "_binary", lambda name: None)
    monkeypatch.delenv(postgres_server.REQUIRE, raising=False)
    with pytest.raises(pytest.skip.Exception):
        with postgres_url():
            pass
    monkeypatch.setenv(postgres_server.REQUIRE, "1")
    with pytest.raises(pytest.fail.Exception, match="FUNCGRAPH_REQUIRE_POSTGRES=1"):
        with postgres_url():
            pass
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text()
    assert f"export {postgres_server.REQUIRE}=1" in ci, "CI sets the switch"
