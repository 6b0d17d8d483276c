"""Divergence is a result: a loss past the documented bound stops the run with one line that
names the rates; the same guard is a library function; the meta-step is one pure function."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from funcgraph.cli import app
from funcgraph.errors import DivergedError
from funcgraph.meta import Task, maml, mean_task_grads, meta_step
from funcgraph.train import DIVERGENCE_BOUND, adam, check_diverged

SINE = ["meta-train", "--dataset", "sinusoid", "--steps", "20", "--meta-batch", "2",
        "--episodes", "2", "--val-episodes", "1", "--validate-every", "0", "--device", "cpu"]


def test_a_huge_inner_rate_stops_as_diverged_naming_the_rates(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [*SINE, "--inner-lr", "1e9", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    errors = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, result.output
    assert "training diverged: the loss became" in errors[0], errors[0]
    assert "running with --inner-lr 1e+09 and --meta-lr 0.001" in errors[0], errors[0]
    assert "Traceback" not in result.output


def test_check_diverged_bounds_the_loss() -> None:
    check_diverged(1.6, step=1)
    check_diverged(torch.tensor(DIVERGENCE_BOUND), step=1)
    for loss in (DIVERGENCE_BOUND * 2, math.nan, math.inf):
        with pytest.raises(DivergedError, match="training diverged: the loss became"):
            check_diverged(loss, step=3)
    with pytest.raises(DivergedError, match=r"at step 3 \(above the bound 10\), running with "
                                            r"lr 0\.5"):
        check_diverged(11.0, step=3, bound=10, rates={"lr": 0.5})
    check_diverged(1e30, step=1, bound=math.inf)  # only NaN and infinities past an inf bound


def test_meta_step_equals_the_mean_gradient_and_update_by_hand() -> None:
    g = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(3, 2, generator=g, dtype=torch.float64)}
    tasks = Task(torch.randn(4, 5, 3, generator=g, dtype=torch.float64),
                 torch.randint(0, 2, (4, 5), generator=g),
                 torch.randn(4, 5, 3, generator=g, dtype=torch.float64),
                 torch.randint(0, 2, (4, 5), generator=g))
    learner, optimizer = maml(lambda p, x: x @ p["w"], inner_steps=2), adam(1e-2)
    state = optimizer.init(params)
    new, new_state, metrics = meta_step(learner, optimizer, params, state, tasks, step=0,
                                        lr=1e-2, strategy="loop")
    grads, loss, metric = mean_task_grads(learner.task_grad, params, tasks, strategy="loop")
    want, want_state = optimizer.update(params, grads, state, lr=1e-2)
    assert torch.equal(new["w"], want["w"]), "meta_step is mean_task_grads then the update"
    assert all(torch.equal(new_state[n], want_state[n]) for n in want_state)
    assert torch.equal(metrics.loss, loss) and torch.equal(metrics.metric, metric)
    assert not torch.equal(new["w"], params["w"]), "the step moved the params"
