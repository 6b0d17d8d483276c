"""A meta-learner written from scratch (examples/own_learner.py, a ridge-regression head):
it meets the MetaLearner contract (vmap equals the loop, its settings check their values),
meta-trains from the library's short path and from the command line as a plugin, and its
own settings and import live in the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import invoke

from funcgraph import random
from funcgraph.errors import ConfigError
from funcgraph.meta import Task, mean_task_grads
from funcgraph.meta.registry import unregister_algorithm

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def own(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import own_learner

    yield own_learner
    unregister_algorithm("ridge")
    sys.modules.pop("own_learner", None)


def test_meta_training_the_ridge_head_raises_held_out_accuracy(own) -> None:  # type: ignore[no-untyped-def]
    before, after = own.main(["--steps", "15", "--episodes", "15"])
    assert after > before + 0.05, (before, after)


def test_its_vmap_meta_gradient_equals_the_loop_and_settings_are_checked(own) -> None:  # type: ignore[no-untyped-def]
    learner = own.ridge(own.Embedding(hidden=4), ways=3)
    params, _ = learner.model.init(random.key(0))
    k = random.split(random.key(1), 2)
    tasks = Task(random.normal(k[0], (2, 3, 1, 16, 16)), torch.arange(3).repeat(2, 1),
                 random.normal(k[1], (2, 6, 1, 16, 16)), torch.arange(3).repeat(2, 2))
    looped = mean_task_grads(learner.task_grad, params, tasks, strategy="loop")
    mapped = mean_task_grads(learner.task_grad, params, tasks, strategy="vmap")
    for name in params:
        torch.testing.assert_close(mapped[0][name], looped[0][name], rtol=1e-4, atol=1e-6)
    assert set(looped[0]) == set(params), "a gradient for every meta-param"
    with pytest.raises(ConfigError, match="ridge: penalty must be a finite number > 0, got 0"):
        own.RidgeSettings(penalty=0)
    with pytest.raises(ConfigError, match="ridge: ways must be an int >= 2, got 1"):
        own.ridge(own.Embedding(), ways=1)


def test_the_command_line_trains_it_with_its_own_setting(
        own, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(EXAMPLES)  # as the docstring says: run from examples/
    run = tmp_path / "run"
    code, output = invoke("meta-train", "--import", "own_learner", "--algo", "ridge",
                          "--setting", "penalty=0.5", "--set", "ways=null", "--set", "hidden=8",
                          "--tasks", "3way1shot", "--steps", "2", "--meta-batch", "2",
                          "--episodes", "2", "--val-episodes", "1", "--validate-every", "0",
                          "--image-size", "8", "--threads", "1", "--out", str(run))
    assert code == 0, output
    config = json.loads((run / "config.json").read_text())
    assert config["settings"] == {"penalty": 0.5} and config["imports"] == ["own_learner"]
    assert config["model"]["ways"] is None, "the ridge head sits on the embedding"
    unregister_algorithm("ridge")
    sys.modules.pop("own_learner", None)
    code, output = invoke("evaluate", str(run), "--episodes", "2")
    assert code == 0 and "acc" in output, output
