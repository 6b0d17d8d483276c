"""A trial row as ``tune show --json`` writes it: its value keyed by what the study scores."""

from __future__ import annotations

import optuna

from funcgraph.runs.tune.report import trial_rows


def study_of(direction: str, value: float, metric: str | None = None) -> optuna.Study:
    """An in-memory study with one complete trial; ``metric`` as a study records it."""
    study = optuna.create_study(direction=direction)
    if metric is not None:
        study.set_user_attr("metric", metric)
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=value))
    return study


def test_a_study_scored_by_an_error_keys_its_rows_by_that_error() -> None:
    [row] = trial_rows(study_of("minimize", 0.25, "mse"))
    record = row.as_record()
    assert record["val_mse"] == 0.25 and "val_acc" not in record, record


def test_an_accuracy_study_keeps_the_key_its_older_records_have() -> None:
    [row] = trial_rows(study_of("maximize", 0.75, "acc"))
    record = row.as_record()
    assert record["val_acc"] == 0.75 and "val_mse" not in record, record


def test_a_study_without_the_attribute_keys_its_rows_by_its_direction() -> None:
    for direction, metric in (("maximize", "acc"), ("minimize", "mse")):
        [row] = trial_rows(study_of(direction, 0.5))
        assert row.metric == metric and row.as_record()[f"val_{metric}"] == 0.5, direction
