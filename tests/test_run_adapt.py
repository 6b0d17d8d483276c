"""``load_run(RUN).adapt(x, y).predict(q)``: a run adapted to a support set of one's own with
the run's own learner, through the code ``evaluate`` scores with, and one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from funcgraph import random
from funcgraph.errors import ConfigError, ShapeError
from funcgraph.meta.evaluate import _TASK_KEYS_TAG
from funcgraph.meta.learner import accuracy
from funcgraph.runs import MetaTrainConfig, default_config, evaluate_run, load_run, meta_train
from funcgraph.runs.meta_training.plan import RunKeys
from funcgraph.runs.task_sources import sources_for

TINY = {"name": "conv4", "ways": 5, "in_channels": 1, "hidden": 4, "image_size": 28}


def tiny_run(out: Path, algo: str, **given: object) -> Path:
    """A one-step run of ``algo`` on glyphs 5-way 1-shot with a conv4 of width 4."""
    cfg = default_config(algo, "glyphs", steps=1, meta_batch=2, validate_every=1,
                         val_episodes=1, test_episodes=1, model=TINY, **given)
    meta_train(cfg, out, show_progress=False, echo=lambda line: None)
    return out


RUNS = {"maml": {"inner_steps_eval": 2}, "mamlpp": {"inner_steps": 2}, "protonet": {}}


@pytest.fixture(scope="module", params=sorted(RUNS))
def run_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_run(tmp_path_factory.mktemp("runs") / request.param, request.param,
                    **RUNS[request.param])


def test_predict_scores_the_runs_test_task_as_evaluate_does(run_dir: Path) -> None:
    """Adapting to evaluate's task 0 with its key and predicting its query set gives the
    accuracy and loss ``evaluate`` scored for it, bit for bit (inner steps and rates, MAML++'s
    per-step rates and batch-norm rows, ProtoNet's prototypes)."""
    out = run_dir
    scored = evaluate_run(out, episodes=1, device="cpu")
    run = load_run(out)
    batch_key = random.fold_in(RunKeys.of(run.config["seed"]).test, 0)  # evaluate's task 0
    task = sources_for(MetaTrainConfig.from_json(run.config)).test(batch_key, 1).pick(0)
    task_key = random.split(random.fold_in(batch_key, _TASK_KEYS_TAG), 1)[0]
    logits = run.adapt(task.support_x, task.support_y, key=task_key).predict(task.query_x)
    assert logits.shape == (task.query_x.shape[0], 5), logits.shape
    assert accuracy(logits, task.query_y).item() == scored.result.mean, (
        accuracy(logits, task.query_y), scored.result)
    assert F.cross_entropy(logits, task.query_y).item() == scored.result.loss, (
        F.cross_entropy(logits, task.query_y), scored.result)


def test_adapt_refuses_bad_input_in_one_line(run_dir: Path) -> None:
    run = load_run(run_dir)
    x, y = torch.rand(5, 1, 28, 28), torch.arange(5)
    cases = [
        ((x.double(), y), "x_support must be a torch.float32 tensor of shape (batch, 1, 28, 28), "
                          "got torch.float64 (5, 1, 28, 28)"),
        ((x[:, :, :20], y), "got torch.float32 (5, 1, 20, 28)"),
        ((x, y + 1), "each of 0..4 at least once (the run is 5-way), got labels [1, 2, 3, 4, 5]"),
        ((x, y.float()), "y_support must be int64 labels of shape (5,)"),
        ((x, y[:4]), "got torch.int64 (4,)"),
        ((x.numpy(), y), "got ndarray"),
    ]
    for args, message in cases:
        with pytest.raises(ShapeError) as caught:
            run.adapt(*args)
        assert message in str(caught.value) and "\n" not in str(caught.value), caught.value
    predictor = run.adapt(x, y)
    with pytest.raises(ShapeError, match=r"predict: x_query must be .* got torch.float32 "
                                         r"\(1, 28, 28\)"):
        predictor.predict(x[0])


def test_adapt_refuses_a_train_run(tmp_path: Path) -> None:
    from funcgraph.runs import fit, train_config

    out = tmp_path / "fit"
    fit(train_config("rnn", steps=1, batch_size=8, validate_every=0), out, show_progress=False,
        echo=lambda line: None)
    with pytest.raises(ConfigError, match="a train run, with no learner to adapt with"):
        load_run(out).adapt(torch.rand(2, 1, 28, 28), torch.arange(2))
