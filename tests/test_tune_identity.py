"""A study's identity: named after its directory, its space and target stored as study
attributes, its storage remembered by the directory; joining another study, a lost store and
a changed storage are each one line and exit 2, and nothing in a study directory is lost."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from test_tune import TINY, options, runner, space_file

from funcgraph.cli import app
from funcgraph.runs.tune.run import tune


def run(*args: str) -> tuple[int, list[str]]:
    result = runner.invoke(app, ["tune", *args])
    return result.exit_code, [line for line in result.output.splitlines() if line.strip()]


def test_two_directories_on_one_journal_are_two_studies(tmp_path: Path) -> None:
    journal = f"journal:{tmp_path / 'shared.journal'}"
    space = space_file(tmp_path)
    for name in ("first", "second"):
        code, lines = run("run", str(space), "--study", str(tmp_path / name), "--storage",
                          journal, "--trials", "1", "--threads", "1")
        assert code == 0, lines
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "shared.journal")))
    assert sorted(optuna.get_all_study_names(storage)) == ["first", "second"]
    study = optuna.load_study(study_name="first", storage=storage)
    assert len(study.trials) == 1
    attrs = study.user_attrs
    assert (attrs["algo"], attrs["dataset"], attrs["metric"]) == ("maml", "sinusoid", "mse")
    assert attrs["fixed"]["steps"] == 4 and set(attrs["space"]) == {"inner_lr", "inner_steps"}
    assert attrs["space_toml"] == space.read_text()
    # The directory remembers its storage: show needs no --storage, another one is refused.
    code, lines = run("show", str(tmp_path / "first"), "--no-plots")
    assert code == 0 and any(line.startswith("best: trial 0") for line in lines), lines
    code, lines = run("show", str(tmp_path / "first"), "--storage",
                      f"journal:{tmp_path / 'other.journal'}")
    assert code == 2 and len(lines) == 1 and "was started on journal:" in lines[0], lines


def test_joining_a_study_with_another_space_is_one_line(tmp_path: Path) -> None:
    journal = f"journal:{tmp_path / 'shared.journal'}"
    code, lines = run("run", str(space_file(tmp_path)), "--study", str(tmp_path / "first"),
                      "--storage", journal, "--trials", "1", "--threads", "1")
    assert code == 0, lines
    other = tmp_path / "other.toml"
    other.write_text(TINY.format(fixed="").replace("steps = 4", "steps = 6"))
    before = (tmp_path / "shared.journal").read_bytes()
    code, lines = run("run", str(other), "--study", str(tmp_path / "second"), "--storage",
                      journal, "--study-name", "first", "--trials", "1", "--threads", "1")
    assert code == 2 and len(lines) == 1, lines
    assert f"study 'first' in journal:{tmp_path / 'shared.journal'} belongs to the study " \
        f"directory {tmp_path / 'first'}, not {tmp_path / 'second'}" in lines[0], lines
    assert "another space: [fixed] steps = 4 there, 6 here)" in lines[0], "names what differs"
    assert (tmp_path / "shared.journal").read_bytes() == before, "nothing added to the store"
    assert not (tmp_path / "second").exists(), "a refused study leaves no directory"
    widened = tmp_path / "widened.toml"
    widened.write_text(TINY.format(fixed="") + "meta_lr = { low = 0.001, high = 0.01 }\n")
    code, lines = run("run", str(widened), "--study", str(tmp_path / "third"), "--storage",
                      journal, "--study-name", "first", "--trials", "1", "--threads", "1")
    assert code == 2 and "[space] meta_lr = (none) there, { low = 0.001, high = 0.01 } here" in (
        lines[0]), lines
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "shared.journal")))
    assert len(optuna.load_study(study_name="first", storage=storage).trials) == 1, (
        "the other study is untouched")
    code, lines = run("show", str(tmp_path / "first"), "--no-plots")
    assert code == 0 and (tmp_path / "shared.journal").read_bytes() == before, (
        "reading a study writes nothing to its store")


def test_a_second_directory_with_the_same_name_is_refused_naming_both(tmp_path: Path) -> None:
    """``--study x/maml`` and ``--study y/maml`` on one store: the second is refused (it would
    join the first's study, whose trials live under x/), until it picks its own name."""
    journal = f"journal:{tmp_path / 'shared.journal'}"
    space = str(space_file(tmp_path))
    code, lines = run("run", space, "--study", str(tmp_path / "x" / "maml"), "--storage",
                      journal, "--trials", "1", "--threads", "1")
    assert code == 0, lines
    record = json.loads((tmp_path / "x" / "maml" / "study.json").read_text())
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "shared.journal")))
    attrs = optuna.load_study(study_name="maml", storage=storage).user_attrs
    assert attrs["directory_id"] == record["directory_id"], "the store and the directory agree"
    assert attrs["directory"] == str(tmp_path / "x" / "maml")
    before = (tmp_path / "shared.journal").read_bytes()
    for trials in ("1", "2"):
        code, lines = run("run", space, "--study", str(tmp_path / "y" / "maml"), "--storage",
                          journal, "--trials", trials, "--threads", "1")
        assert code == 2 and len(lines) == 1, lines
        assert (f"belongs to the study directory {tmp_path / 'x' / 'maml'}, not "
                f"{tmp_path / 'y' / 'maml'}") in lines[0] and "--study-name NAME" in lines[0], lines
    assert (tmp_path / "shared.journal").read_bytes() == before, "nothing added to the store"
    assert not (tmp_path / "y").exists(), "a refused study leaves no directory"
    code, lines = run("run", space, "--study", str(tmp_path / "y" / "maml"), "--storage",
                      journal, "--study-name", "maml-y", "--trials", "1", "--threads", "1")
    assert code == 0, lines
    assert sorted(optuna.get_all_study_names(storage)) == ["maml", "maml-y"]
    assert len(optuna.load_study(study_name="maml", storage=storage).trials) == 1
    assert (tmp_path / "y" / "maml" / "trials" / "trial-0000").is_dir()
    # A directory moved elsewhere is still its study's: the id travels in study.json.
    (tmp_path / "x" / "maml").rename(tmp_path / "moved")
    code, lines = run("show", str(tmp_path / "moved"), "--no-plots")
    assert code == 0 and any(line.startswith("best: trial 0") for line in lines), lines


def test_a_relative_journal_is_remembered_from_any_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    code, lines = run("run", str(space_file(tmp_path)), "--study", "study", "--storage",
                      "journal:shared.journal", "--trials", "1", "--threads", "1")
    assert code == 0, lines
    monkeypatch.chdir(tmp_path)
    code, lines = run("show", "here/study", "--no-plots")
    assert code == 0 and any(line.startswith("best: trial 0") for line in lines), lines
    assert not (tmp_path / "shared.journal").exists(), "no empty journal made elsewhere"
    (tmp_path / "here" / "shared.journal").write_bytes(b"")
    code, lines = run("show", "here/study", "--no-plots")
    assert code == 2 and len(lines) == 1 and "shared.journal is empty (zero bytes)" in (
        lines[0]), lines


@pytest.mark.parametrize("record", ["kept", "lost"])
def test_an_empty_store_is_refused_and_the_trials_are_kept(tmp_path: Path,
                                                          record: str) -> None:
    """Also where ``study.json`` is gone (or the directory predates it): its trials show
    that it holds a study."""
    opts = options(tmp_path, trials=1)
    tune(opts, echo=lambda _: None)
    trial = opts.study_dir / "trials" / "trial-0000"
    before = (trial / "config.json").read_text()
    (opts.study_dir / "study.db").write_bytes(b"")  # a full disk or a killed copy
    if record == "lost":
        (opts.study_dir / "study.json").unlink()
    for args in (["run", str(space_file(tmp_path)), "--study", str(opts.study_dir),
                  "--trials", "2"],
                 ["run", str(space_file(tmp_path)), "--study", str(opts.study_dir),
                  "--trials", "2", "--seed", "3"],
                 ["show", str(opts.study_dir)]):
        code, lines = run(*args)
        assert code == 2 and len(lines) == 1 and "is empty (zero bytes)" in lines[0], lines
    assert (opts.study_dir / "study.db").stat().st_size == 0, "nothing was changed"
    assert (trial / "config.json").read_text() == before
    assert sorted(p.name for p in trial.parent.iterdir()) == ["trial-0000"]


def test_a_replaced_store_is_refused_and_no_trial_directory_is_taken(tmp_path: Path) -> None:
    opts = options(tmp_path, trials=1)
    tune(opts, echo=lambda _: None)
    (opts.study_dir / "study.db").unlink()
    optuna.create_study(study_name="unrelated",
                        storage=f"sqlite:///{opts.study_dir / 'study.db'}")
    code, lines = run("run", str(space_file(tmp_path)), "--study", str(opts.study_dir),
                      "--trials", "2")
    assert code == 2 and len(lines) == 1, lines
    assert "holds no study 'study' (it holds 'unrelated')" in lines[0], lines
    record = json.loads((opts.study_dir / "study.json").read_text())
    assert set(record) == {"study_name", "storage", "directory_id"}, record
    assert (record["study_name"], record["storage"]) == ("study", None)
    assert not (opts.study_dir / "trials" / "trial-0001").exists()
