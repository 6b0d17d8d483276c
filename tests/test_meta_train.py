"""meta-train as a library and a command: run directory, resume bit-identity, clean errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from funcgraph import random
from funcgraph.cli import app
from funcgraph.errors import CheckpointError, ConfigError
from funcgraph.meta import Task
from funcgraph.runs import (
    MetaTrainConfig,
    TaskSources,
    default_config,
    evaluate_run,
    meta_train,
)
from funcgraph.runs.meta_training.loop import meta_lr_at
from funcgraph.train import Run

WAYS = 3
MODEL = {"name": "conv4", "ways": WAYS, "in_channels": 1, "hidden": 4, "image_size": 8,
         "variant": "strided"}


def step_key(step: int, seed: int = 0) -> torch.Tensor:
    """The key meta-step ``step`` (counted from 1) of a run of ``seed`` draws its tasks with."""
    from funcgraph.runs.meta_training.plan import RunKeys

    return RunKeys.of(seed).tasks(step - 1, 1)[0]


def synthetic_sampler(tag: int, interrupt_at: int | None = None) -> object:
    """Tasks whose classes differ in mean brightness: learnable, tiny, deterministic per key.
    ``interrupt_at``: Ctrl-C when meta-step ``interrupt_at``'s tasks are drawn (by their key,
    so the few tasks a run times before its first step do not count)."""
    stop = None if interrupt_at is None else step_key(interrupt_at)

    def sample(key: torch.Tensor, n: int) -> Task:
        if stop is not None and torch.equal(key, stop):
            raise KeyboardInterrupt
        k = random.split(random.fold_in(key, tag), 2)
        labels = torch.arange(WAYS).expand(n, -1)  # one shot, one query per class
        sx = random.normal(k[0], (n, WAYS, 1, 8, 8)) + labels[..., None, None, None]
        qx = random.normal(k[1], (n, WAYS, 1, 8, 8)) + labels[..., None, None, None]
        return Task(sx, labels.contiguous(), qx, labels.contiguous())

    return sample


def sources(interrupt_at: int | None = None) -> TaskSources:
    return TaskSources("classification", synthetic_sampler(0, interrupt_at),  # type: ignore[arg-type]
                       synthetic_sampler(1), synthetic_sampler(2), WAYS, 1, 8)  # type: ignore[arg-type]


def config(steps: int) -> MetaTrainConfig:
    return MetaTrainConfig(tasks=f"{WAYS}way1shot1query", steps=steps, meta_batch=2,
                           validate_every=2, val_episodes=4, test_episodes=6,
                           checkpoint_every=1, model=MODEL)


def run_quiet(cfg: MetaTrainConfig, out: Path, **kw: object) -> object:
    return meta_train(cfg, out, show_progress=False, echo=lambda _: None, **kw)  # type: ignore[arg-type]


def test_run_directory_holds_config_metrics_checkpoints_and_test(tmp_path: Path) -> None:
    result = run_quiet(config(2), tmp_path / "run", sources=sources())
    run = Run.open(tmp_path / "run")
    assert run.config["model"] == MODEL, "config.json says how to rebuild the model"
    kinds = [r["kind"] for r in run.metrics()]
    assert "validation" in kinds and kinds[-1] == "test"
    test = run.metrics()[-1]
    assert test["episodes"] == 6 and 0.0 <= test["acc"] <= 1.0 and test["acc_ci95"] >= 0
    # 6 tasks of WAYS queries: the accuracy counts correct queries, a multiple of 1/(6 WAYS),
    # and a 95% CI of six [0, 1] scores is at most 1.96 * 0.5 * sqrt(6/5) / sqrt(6).
    correct = test["acc"] * 6 * WAYS
    assert abs(correct - round(correct)) < 1e-6, f"acc {test['acc']} is no count of queries"
    assert test["acc_ci95"] <= 1.96 * 0.5 / 5 ** 0.5 + 1e-9, test
    assert run.has_checkpoint("last") and run.has_checkpoint("best")
    assert result.test.episodes == 6  # type: ignore[attr-defined]


def test_interrupted_and_resumed_run_is_bit_identical(tmp_path: Path) -> None:
    whole = run_quiet(config(4), tmp_path / "whole", sources=sources())
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C during the 3rd step
        run_quiet(config(4), tmp_path / "cut", sources=sources(interrupt_at=3))
    _, meta = Run.open(tmp_path / "cut").load("last")
    assert meta["step"] == 2, "Ctrl-C saved the completed steps"
    resumed = run_quiet(config(4), tmp_path / "cut", sources=sources(), resume=True)
    for n, p in whole.params.items():  # type: ignore[attr-defined]
        assert torch.equal(p, resumed.params[n]), f"{n} differs after resume"  # type: ignore[attr-defined]
    strip = [{k: v for k, v in r.items() if k != "tasks_per_s"}
             for r in Run.open(tmp_path / "whole").metrics()]
    again = [{k: v for k, v in r.items() if k != "tasks_per_s"}
             for r in Run.open(tmp_path / "cut").metrics()]
    assert again == strip, "metrics.jsonl reads as if the run had never stopped"


def test_resume_refuses_changed_options(tmp_path: Path) -> None:
    run_quiet(config(1), tmp_path / "run", sources=sources())
    changed = MetaTrainConfig(**{**config(2).to_json(), "inner_lr": 0.1})
    with pytest.raises(Exception, match="inner_lr"):
        run_quiet(changed, tmp_path / "run", sources=sources(), resume=True)


RESUMED = ["--dataset", "sinusoid", "--algo", "maml", "--meta-batch", "2", "--episodes", "3",
           "--val-episodes", "2", "--validate-every", "2", "--inner-lr", "0.02", "--seed", "3"]
"""A run whose options are none of the command's defaults (algorithm, rate, seed...)."""


def test_resume_alone_continues_the_run_with_its_recorded_options(tmp_path: Path) -> None:
    """``meta-train --resume --out RUN`` with no run options continues the run as recorded
    (the command's defaults are not compared) and ends bit-identical to the run never
    stopped; an option named beside it is checked as before: --steps may grow, another
    --inner-lr is refused, named alone."""
    from dataclasses import replace

    from funcgraph.runs import task_sources

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    result = runner.invoke(app, ["meta-train", *RESUMED, "--steps", "4", "--device", "cpu",
                                 "--out", str(whole)])
    assert result.exit_code == 0, result.output
    cfg = MetaTrainConfig.from_json(Run.open(whole).config)
    real = task_sources("sinusoid", spec=cfg.tasks)
    def train(key: torch.Tensor, n: int) -> Task:
        if torch.equal(key, step_key(3, seed=3)):  # Ctrl-C during the third meta-step
            raise KeyboardInterrupt
        return real.train(key, n)

    with pytest.raises(KeyboardInterrupt):
        run_quiet(cfg, cut, sources=replace(real, train=train), device="cpu")
    assert Run.open(cut).load("last")[1]["step"] == 2
    result = runner.invoke(app, ["meta-train", "--resume", "--out", str(cut), "--device", "cpu"])
    assert result.exit_code == 0 and "differ" not in result.output, result.output
    ends = [Run.open(d).load("last")[0]["params"] for d in (whole, cut)]
    assert ends[0].keys() == ends[1].keys()
    for name, value in ends[0].items():
        assert torch.equal(value, ends[1][name]), f"{name} differs after the resume"
    assert Run.open(cut).config == Run.open(whole).config, "the recorded options, unchanged"
    result = runner.invoke(app, ["meta-train", "--resume", "--out", str(cut)])
    assert result.exit_code == 0, f"a finished run resumes to its end:\n{result.output}"
    result = runner.invoke(app, ["meta-train", "--resume", "--out", str(cut), "--steps", "5",
                                 "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert Run.open(cut).config["steps"] == 5 and Run.open(cut).load("last")[1]["step"] == 5
    result = runner.invoke(app, ["meta-train", "--resume", "--out", str(cut), "--inner-lr",
                                 "0.5"])
    assert result.exit_code == 2, result.output
    assert f"options differ from the run in {cut}: inner_lr: 0.02 -> 0.5\n" in result.output, (
        result.output)


def test_resume_without_a_run_is_one_line_and_makes_no_directory(tmp_path: Path) -> None:
    result = runner.invoke(app, ["meta-train", "--resume", "--out", str(tmp_path / "none")])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert f"--resume: no run to resume in {tmp_path / 'none'}" in lines[0], lines
    assert not (tmp_path / "none").exists(), "a refused resume makes no run directory"
    with pytest.raises(CheckpointError, match="no run to resume"):
        run_quiet(config(2), tmp_path / "lib", sources=sources(), resume=True)
    assert not (tmp_path / "lib").exists(), "the library refuses it before the lock too"


BROKEN_LEARNER = """
import torch
from dataclasses import replace
from funcgraph.meta import register_algorithm
from funcgraph.meta.maml_family import build_maml
from funcgraph.meta.settings import MamlSettings


def build(apply, settings, info):
    def task_grad(params, task):
        return torch.zeros(2, 3) @ torch.zeros(4, 5)  # the mistake

    return replace(build_maml(apply, settings, info), task_grad=task_grad)


register_algorithm("broken_maml", settings=MamlSettings, build=build,
                   kinds=("regression",), summary="a learner with a shape mistake")
"""


def test_a_learners_own_torch_error_names_its_line(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch error in a plugin learner is one line before anything is written, and names
    the user's line (the model's fit is not the cause)."""
    import sys

    from funcgraph.meta.registry import unregister_algorithm

    plugin = tmp_path / "broken_learner.py"
    plugin.write_text(BROKEN_LEARNER)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        result = runner.invoke(app, ["meta-train", "--import", "broken_learner", "--algo",
                                     "broken_maml", "--dataset", "sinusoid", "--steps", "2",
                                     "--threads", "1", "--out", str(tmp_path / "run")])
    finally:
        unregister_algorithm("broken_maml")
        sys.modules.pop("broken_learner", None)
    assert result.exit_code == 2, result.output
    assert "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)" in result.output
    assert f"(at {plugin}:11)" in result.output, result.output


def test_remat_run_follows_the_default_run(tmp_path: Path) -> None:
    """The rematerialised meta-gradient trains the same model (equal to rounding)."""
    plain = run_quiet(config(3), tmp_path / "plain", sources=sources())
    remat = run_quiet(MetaTrainConfig(**{**config(3).to_json(), "remat": True}),
                      tmp_path / "remat", sources=sources())
    for n, p in plain.params.items():  # type: ignore[attr-defined]
        if n.endswith("conv.bias"):
            # Batch norm cancels these biases: their gradient is rounding noise, which Adam
            # scales up to a full step either way. The model's function does not see them.
            continue
        torch.testing.assert_close(remat.params[n], p, rtol=1e-4, atol=1e-5)  # type: ignore[attr-defined]


runner = CliRunner()


def meta_train_sinusoid(out: Path, *, steps: int, episodes: int, validate_every: int) -> str:
    """The output of ``funcgraph meta-train`` on sinusoid into ``out`` (meta-batch 2, three
    validation tasks, on the CPU), which must exit 0."""
    result = runner.invoke(app, ["meta-train", "--dataset", "sinusoid", "--steps", str(steps),
                                 "--meta-batch", "2", "--episodes", str(episodes),
                                 "--validate-every", str(validate_every), "--val-episodes", "3",
                                 "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("args,message", [
    (["--tasks", "5wayXshot"], "task spec"),
    (["--dataset", "omniglot", "--data-root", "/no/such/dir"], "/no/such/dir"),
    (["--tasks", "5way1shot", "--bogus"], "No such option"),
    (["--algo", "nope"], "nope"),
    (["--resume"], "--out"),
    (["--algo", "reptile", "--remat"], "--remat"),
    (["--inner-steps", "3"], "protonet has no inner loop"),
    (["--algo", "maml", "--inner-minibatches"], "--inner-minibatches applies to reptile"),
    (["--algo", "reptile", "--dataset", "sinusoid", "--inner-minibatches"],
     "sinusoid tasks are regression and have no classes"),
    (["--algo", "protonet", "--inner-lr", "0.1", "--inner-steps-eval", "5"],
     "--inner-steps-eval, --inner-lr: protonet has no inner loop"),
])
def test_bad_input_exits_2_with_a_message(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["meta-train", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_defaults_layer_class_then_algorithm_then_dataset_then_the_users_options() -> None:
    """MAML++'s tuned defaults (docs/meta-learning.md) apply only to MAML++, the dataset's
    defaults override them, and an option the user gives overrides both."""
    maml, mamlpp = default_config("maml"), default_config("mamlpp")
    assert (maml.inner_steps, maml.meta_batch, maml.steps, maml.cosine_meta_lr) == (
        1, 32, 500, False)
    assert (mamlpp.inner_steps, mamlpp.meta_batch, mamlpp.steps, mamlpp.cosine_meta_lr,
            mamlpp.train_queries, mamlpp.rotate, mamlpp.meta_lr) == (
        3, 16, 2775, True, 3, True, 3.95e-3)
    assert maml.train_queries == 1 and not maml.rotate
    given = default_config("mamlpp", meta_batch=8, steps=None, rotate=False)
    assert (given.meta_batch, given.steps, given.rotate) == (8, 2775, False)
    assert not default_config("mamlpp", dataset="sinusoid").rotate
    assert default_config("mamlpp", dataset="sinusoid").meta_batch == 25
    assert default_config("reptile").inner_minibatches
    assert not default_config("reptile", dataset="sinusoid").inner_minibatches
    assert not default_config("reptile", inner_minibatches=False).inner_minibatches


def test_user_errors_are_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["meta-train", "--dataset", "omniglot", "--data-root",
                                 str(tmp_path / "missing")])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_sinusoid_meta_train_then_evaluate_from_the_run_directory(tmp_path: Path) -> None:
    out = tmp_path / "sine"
    assert "mse" in meta_train_sinusoid(out, steps=2, episodes=4, validate_every=1)
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["name"] == "mlp" and config["dataset"] == "sinusoid"
    result = runner.invoke(app, ["evaluate", str(out), "--episodes", "5", "--device", "cpu",
                                 "--inner-steps-eval", "2"])
    assert result.exit_code == 0, result.output
    assert "5 tasks" in result.output
    res = evaluate_run(out, episodes=3, device="cpu").result
    assert res.episodes == 3 and res.metric_name == "mse"


def test_evaluate_scores_the_runs_own_test_tasks_and_prints_its_test_line(tmp_path: Path
                                                                          ) -> None:
    """With no options that draw tasks, evaluate gives the run's test figure exactly (same
    keys, task count and checkpoint) and prints the run's line beside it; --seed draws
    other tasks and says so."""
    out = tmp_path / "sine"
    meta_train_sinusoid(out, steps=3, episodes=7, validate_every=2)
    test = [r for r in Run.open(out).metrics() if r["kind"] == "test"][-1]
    scored = evaluate_run(out, device="cpu")
    assert scored.checkpoint == test["checkpoint"] == "best"
    assert scored.result.as_record() == {k: test[k] for k in ("mse", "mse_ci95", "loss",
                                                             "episodes")}, (scored, test)
    assert scored.recorded is not None and scored.other_tasks == ()
    assert scored.recorded.result == scored.result, (scored.recorded, scored.result)
    cli = runner.invoke(app, ["evaluate", str(out), "--device", "cpu"])
    assert cli.exit_code == 0, cli.output
    figure = str(scored.result)
    assert f"{out} (best checkpoint): {figure}\n" in cli.output, cli.output
    assert f"the run's own test (best checkpoint, 10shot): {figure}\n" in cli.output, cli.output
    assert "other tasks" not in cli.output, cli.output
    other = runner.invoke(app, ["evaluate", str(out), "--device", "cpu", "--seed", "5"])
    assert other.exit_code == 0, other.output
    assert "--seed drew other tasks than the run's test" in other.output, other.output
    assert f": {figure}\n" in other.output.split("the run's own test")[1], other.output
    assert other.output.splitlines()[0].split(": ")[-1] != figure, "another seed, other tasks"


def test_load_run_gives_the_runs_model_with_its_checkpoint(tmp_path: Path) -> None:
    """One call: the run's model and the best checkpoint's params, which the model runs on;
    the learner's own tensors stay behind (Meta-SGD's per-param rates)."""
    from funcgraph.errors import CheckpointError
    from funcgraph.runs import load_run

    out = tmp_path / "sgd"
    result = runner.invoke(app, ["meta-train", "--dataset", "sinusoid", "--algo", "metasgd",
                                 "--steps", "2", "--meta-batch", "2", "--episodes", "2",
                                 "--validate-every", "2", "--val-episodes", "2", "--device",
                                 "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    run = load_run(out)
    saved, meta = Run.open(out).load("best")
    assert (run.checkpoint, run.step, run.config["algo"]) == ("best", meta["step"], "metasgd")
    assert set(saved["params"]) - set(run.params), "Meta-SGD's rates are in the checkpoint"
    for name, value in run.params.items():
        assert torch.equal(value, saved["params"][name]), name
    x = torch.linspace(-5, 5, 4).reshape(4, 1)
    y, _ = run.model.apply(run.params, run.state, x)
    assert y.shape == (4, 1) and torch.isfinite(y).all()
    assert load_run(out, "last").checkpoint == "last"
    with pytest.raises(ConfigError, match="checkpoint must be 'best' or 'last', got 'first'"):
        load_run(out, "first")
    with pytest.raises(CheckpointError, match="not a run directory"):
        load_run(tmp_path)


def test_evaluate_rejects_a_directory_without_a_run(tmp_path: Path) -> None:
    result = runner.invoke(app, ["evaluate", str(tmp_path)])
    assert result.exit_code == 2 and "not a run directory" in result.output


def test_sinusoid_example_lowers_the_adapted_error_on_held_out_tasks(
        capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util
    import re

    path = Path(__file__).resolve().parents[1] / "examples" / "maml_sinusoid.py"
    spec = importlib.util.spec_from_file_location("maml_sinusoid", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # With 100 steps the example asserts the error fell on the same held-out tasks.
    mse = module.main(["--steps", "100", "--meta-batch", "5", "--episodes", "20"])
    before = re.search(r"before meta-training, 10 inner steps: mse (\d+\.\d+)",
                       capsys.readouterr().out)
    assert before, "the example prints the untrained error"
    assert 0 < mse < float(before[1]), (mse, before[1])


DROPOUT_MLP = {
    "name": "dropout_mlp", "vars": {"drop": 0.3}, "input_shape": [1, 1, 8, 8],
    "layers": ["flatten", {"type": "linear", "params": {"out_features": 16}}, "relu",
               {"type": "dropout", "params": {"drop_prob": "$drop"}},
               {"type": "linear", "name": "head", "params": {"out_features": WAYS}}],
}


def dropout_config(tmp_path: Path, *, steps: int = 3, seed: int = 0,
                   drop: float = 0.3) -> MetaTrainConfig:
    path = tmp_path / "dropout_mlp.json"
    path.write_text(json.dumps(DROPOUT_MLP))
    model = {"factory": str(path), "overrides": {"vars.drop": str(drop)}}
    return MetaTrainConfig(**{**config(steps).to_json(), "seed": seed, "model": model})


def test_meta_train_with_a_dropout_config_is_reproducible_and_resumable(tmp_path: Path) -> None:
    """Every task and inner step gets its own key: dropout trains, the same seed gives the same
    run, another seed another, and an interrupted run resumes bit for bit."""
    def params_of(name: str, **kw: Any) -> dict[str, torch.Tensor]:
        return run_quiet(dropout_config(tmp_path, **kw), tmp_path / name,  # type: ignore[attr-defined]
                         sources=sources()).params

    first, again = params_of("a"), params_of("b")
    other_seed, no_drop = params_of("c", seed=1), params_of("d", drop=0.0)
    for n in first:
        assert torch.equal(first[n], again[n]), f"{n}: the same seed gave a different run"
    assert any(not torch.equal(first[n], other_seed[n]) for n in first), "seed 1 == seed 0"
    assert any(not torch.equal(first[n], no_drop[n]) for n in first), (
        "drop_prob 0.3 trained exactly like 0.0: dropout never saw a key")
    assert Run.open(tmp_path / "a").metrics() != Run.open(tmp_path / "c").metrics()
    with pytest.raises(KeyboardInterrupt):
        run_quiet(dropout_config(tmp_path), tmp_path / "cut", sources=sources(interrupt_at=3))
    resumed = run_quiet(dropout_config(tmp_path), tmp_path / "cut", sources=sources(),
                        resume=True)
    for n, p in first.items():
        assert torch.equal(p, resumed.params[n]), f"{n} differs after resume"  # type: ignore[attr-defined]


@pytest.mark.parametrize("args,message", [
    (["--set", "hidden=0"], "hidden"),
    (["--set", "hidden=abc"], "hidden"),
    (["--algo", "maml", "--set", "ways=3"], "3"),  # MAML's head must match the 5 ways
    (["--set", "nosuch=1"], "nosuch"),
    (["--tasks", "[/x]"], "[/x]"),
    (["--tasks", "[bold]5way1shot"], "[bold]"),
])
def test_bad_model_or_spec_is_one_line_and_leaves_no_run_directory(
        tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "run"
    result = runner.invoke(app, ["meta-train", "--steps", "1", "--meta-batch", "2",
                                 "--device", "cpu", "--out", str(out), *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output, result.output
    lines = [line for line in result.output.strip().splitlines()
             if not line.startswith("run directory:")]
    assert len(lines) == 1 and message in lines[0], f"expected one line naming {message!r}: {lines}"
    assert not out.exists(), f"a failed start left {sorted(p.name for p in out.iterdir())}"


def assert_resume_is_bit_for_bit(cfg: MetaTrainConfig, tmp_path: Path) -> Any:
    """Run ``cfg`` whole, and cut by Ctrl-C at its third meta-batch then resumed; assert both
    end with equal params and return the whole run's result."""
    whole = run_quiet(cfg, tmp_path / "whole", sources=sources())
    with pytest.raises(KeyboardInterrupt):
        run_quiet(cfg, tmp_path / "cut", sources=sources(interrupt_at=3))
    resumed = run_quiet(cfg, tmp_path / "cut", sources=sources(), resume=True)
    for n, p in whole.params.items():  # type: ignore[attr-defined]
        assert torch.equal(p, resumed.params[n]), f"{cfg.algo}: {n} differs after resume"  # type: ignore[attr-defined]
    return whole


def test_reptile_recipe_sgd_meta_step_annealed_from_one_resumes_bit_for_bit(
        tmp_path: Path) -> None:
    """Reptile's recipe: Adam inner loop, plain SGD meta-step with a linearly annealed rate.
    SGD keeps no optimiser state, which a resume must accept; the rate follows the absolute
    meta-step, so a resumed run equals a whole one."""
    cfg = MetaTrainConfig(**{**config(4).to_json(), "algo": "reptile", "inner_steps": 2,
                             "inner_lr": 1e-2, "inner_optimizer": "adam",
                             "meta_optimizer": "sgd", "linear_meta_lr": True, "meta_lr": 1.0})
    assert [meta_lr_at(cfg, s) for s in (0, 2, 4)] == [1.0, 0.5, 0.0]
    assert_resume_is_bit_for_bit(cfg, tmp_path)


@pytest.mark.parametrize(("changes", "message"), [
    ({"inner_optimizer": "adam"}, "applies to reptile"),
    ({"algo": "reptile", "cosine_meta_lr": True, "linear_meta_lr": True}, "choose one"),
    ({"meta_optimizer": "lamb"}, "--meta-optimizer must be one of"),
    ({"algo": "reptile", "inner_optimizer": "lbfgs"}, "--inner-optimizer must be one of"),
])
def test_optimizer_options_that_contradict_are_refused(changes: dict[str, Any],
                                                       message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MetaTrainConfig(**{**config(2).to_json(), **changes})


@pytest.mark.parametrize("algo", ["mamlpp", "imaml"])
def test_mamlpp_and_imaml_meta_train_and_resume_bit_for_bit(tmp_path: Path, algo: str) -> None:
    """The step-dependent schedules (MAML++'s multi-step loss and derivative order, the cosine
    meta learning rate) follow the absolute meta-step, so a resumed run equals a whole one."""
    extra: dict[str, Any] = ({"cosine_meta_lr": True, "first_order_until": 2,
                              "msl_anneal_steps": 3} if algo == "mamlpp" else {"cg_steps": 2})
    cfg = MetaTrainConfig(**{**config(4).to_json(), "algo": algo, "inner_steps": 2, **extra})
    whole = assert_resume_is_bit_for_bit(cfg, tmp_path)
    if algo == "mamlpp":
        assert any(n.startswith("step_lr.") for n in whole.params), (  # type: ignore[attr-defined]
            "MAML++ learned no per-step rates")


def test_mamlpp_with_per_step_running_statistics_end_to_end(tmp_path: Path) -> None:
    """``--bn-running-stats``: validation and test use per-step running statistics;
    ``evaluate`` follows the run's setting or overrides it (``--batch-stats``)."""
    from test_meta_train_rgb import TINY, invoke, write_folder

    root, out = tmp_path / "data", tmp_path / "run"
    write_folder(root)
    common = ["--dataset", "folder", "--data-root", str(root), "--image-size", "16",
              "--tasks", "3way1shot2query"]
    output = invoke("meta-train", *common, "--algo", "mamlpp", "--bn-running-stats",
                    "--set", "hidden=4", "--out", str(out), *TINY)
    assert "test (best checkpoint, 3way1shot2query)" in output, output
    assert json.loads((out / "config.json").read_text())["bn_running_stats"] is True
    invoke("evaluate", str(out), "--episodes", "4", "--device", "cpu")
    invoke("evaluate", str(out), "--episodes", "4", "--device", "cpu", "--batch-stats")
    running, batch = [r["loss"] for r in Run.open(out).metrics() if r["kind"] == "evaluate"]
    assert running != batch, "the two normalisations score the same tasks differently"


@pytest.mark.parametrize(("args", "message"), [
    (["--algo", "maml"], "--bn-running-stats: per-step running statistics are MAML++'s"),
    (["--algo", "mamlpp", "--model", "resnet12", "--set", "widths=[4,4,8,8]"],
     "--bn-running-stats needs the built-in conv4"),
])
def test_running_statistics_are_refused_before_a_run_starts(tmp_path: Path, args: list[str],
                                                            message: str) -> None:
    from test_meta_train_rgb import TINY, write_folder

    write_folder(tmp_path / "data")
    result = runner.invoke(app, ["meta-train", "--dataset", "folder", "--data-root",
                                 str(tmp_path / "data"), "--image-size", "16", "--tasks",
                                 "3way1shot2query", "--bn-running-stats", *args, "--out",
                                 str(tmp_path / "run"), *TINY])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "run").exists(), "a refused start left a run directory"


def test_dry_run_estimates_the_time_per_step() -> None:
    """``--dry-run`` times a short meta-step and prints its estimate for the whole run."""
    result = runner.invoke(app, ["meta-train", "--dataset", "sinusoid", "--steps", "40",
                                 "--dry-run"])
    assert result.exit_code == 0, result.output
    [line] = [x for x in result.output.splitlines() if x.startswith("time: about ")]
    seconds = float(line.split()[2])
    assert 0 < seconds < 60 and "min for 40 steps (one step measured on 4 task(s)" in line


def test_a_run_from_before_the_precision_setting_resumes(tmp_path: Path) -> None:
    """A run whose config.json predates ``precision`` ran in float32 and resumes as such."""
    out = tmp_path / "old"
    args = ["meta-train", "--dataset", "sinusoid", "--episodes", "3", "--out", str(out)]
    assert runner.invoke(app, [*args, "--steps", "2"]).exit_code == 0
    config = json.loads((out / "config.json").read_text())
    del config["precision"]
    (out / "config.json").write_text(json.dumps(config))
    result = runner.invoke(app, [*args, "--steps", "3", "--resume"])
    assert result.exit_code == 0, result.output
    refused = runner.invoke(app, [*args, "--steps", "4", "--resume", "--precision", "bf16"])
    assert refused.exit_code == 2 and "precision" in refused.output


def test_auto_says_when_its_strategy_needs_much_more_memory_than_the_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from funcgraph.runs.meta_training import plan as meta_plan
    from funcgraph.runs.meta_training.config import default_config
    from funcgraph.runs.meta_training.plan import (
        AUTO_MEMORY_RATIO,
        auto_memory_note,
        plan_meta_train,
    )
    from funcgraph.runs.task_sources import sources_for

    # The process's resident memory counts on both sides of the ratio: 10 task graphs of
    # 10 MB beside 1 GB already held is no note, beside nothing it is.
    mb = 2**20
    assert auto_memory_note("vmap", 100 * mb, 10 * mb, 1024 * mb) is None
    note = auto_memory_note("vmap", 100 * mb, 10 * mb, 0)
    assert note is not None and "10.0x the loop's 10.0 MiB" in note, note
    held = auto_memory_note("vmap", 3000 * mb, 10 * mb, 100 * mb)
    assert held is not None and "with the 100.0 MiB this process holds" in held, held
    assert "28.2x the loop's 110.0 MiB" in held, held

    monkeypatch.setattr(meta_plan, "resident_bytes", lambda: 0)  # sinusoid's graphs are tiny
    auto = default_config("maml", "sinusoid", meta_batch=16)
    plan = plan_meta_train(auto, sources_for(auto), torch.device("cpu"))
    assert plan.memory_note is not None and "strategy vmap (auto" in plan.memory_note
    ratio = float(plan.memory_note.split("x the loop's")[0].rsplit(" ", 1)[-1])
    assert ratio > AUTO_MEMORY_RATIO, plan.memory_note
    loop = default_config("maml", "sinusoid", meta_batch=16, strategy="loop")
    assert plan_meta_train(loop, sources_for(loop), torch.device("cpu")).memory_note is None
    one = default_config("maml", "sinusoid", meta_batch=1)
    assert plan_meta_train(one, sources_for(one), torch.device("cpu")).memory_note is None


def test_max_memory_maps_fewer_tasks_at_a_time_and_refuses_what_cannot_fit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from funcgraph.runs.memory import parse_bytes
    from funcgraph.runs.meta_training import plan as meta_plan
    from funcgraph.runs.meta_training.config import default_config
    from funcgraph.runs.meta_training.plan import bounded_tasks, plan_meta_train
    from funcgraph.runs.task_sources import sources_for

    assert parse_bytes("--max-memory", "2GiB") == 2 * 2**30
    assert parse_bytes("--max-memory", "1.5 GB") == 1_500_000_000
    assert parse_bytes("--max-memory", "800M") == 800 * 2**20
    assert parse_bytes("--max-memory", "4096") == 4096
    for bad in ("lots", "-1GB", "0", "2 parsecs", ""):
        with pytest.raises(ConfigError, match="expected a size such as 2GiB"):
            parse_bytes("--max-memory", bad)

    mb = 2**20
    assert bounded_tasks(100 * mb, "vmap", 16, 40 * mb, 10 * mb) == 6
    assert bounded_tasks(1000 * mb, "vmap", 16, 40 * mb, 10 * mb) == 16
    with pytest.raises(ConfigError, match="needs at least 50.0 MiB"):
        bounded_tasks(45 * mb, "loop", 1, 40 * mb, 10 * mb)
    with pytest.raises(ConfigError, match="use --strategy loop"):
        bounded_tasks(55 * mb, "threads", 2, 40 * mb, 10 * mb)

    monkeypatch.setattr(meta_plan, "resident_bytes", lambda: 0)
    free = default_config("maml", "sinusoid", meta_batch=16, strategy="vmap")
    plan = plan_meta_train(free, sources_for(free), torch.device("cpu"))
    assert plan.chunk_size is None
    tight = replace(free, max_memory=plan.memory.needed // 2)
    bounded = plan_meta_train(tight, sources_for(tight), torch.device("cpu"))
    assert bounded.chunk_size is not None and 1 <= bounded.chunk_size < 16, bounded.chunk_size
    assert bounded.memory.needed <= plan.memory.needed // 2, bounded.memory
    assert f"{bounded.chunk_size} task graph(s)" in bounded.memory.detail


def test_max_memory_scores_one_task_at_a_time_where_several_would_not_fit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from funcgraph.runs.memory import allocated_bytes
    from funcgraph.runs.meta_training import plan as meta_plan
    from funcgraph.runs.meta_training.config import default_config
    from funcgraph.runs.meta_training.plan import eval_strategy, one_task, plan_meta_train
    from funcgraph.runs.task_sources import sources_for

    mb = 2**20
    monkeypatch.setattr(meta_plan, "resident_bytes", lambda: 40 * mb)
    cfg = default_config("maml", "sinusoid", strategy="vmap")
    sources = sources_for(cfg)
    plan = plan_meta_train(cfg, sources, torch.device("cpu"))
    val = one_task(sources.val)
    _, per_task = allocated_bytes(lambda: plan.learner.task_eval(plan.params, val))
    chunk = 16  # vmap's default chunk on CPU

    def strategy(max_memory: int | None) -> str:
        return eval_strategy(replace(cfg, max_memory=max_memory), sources,
                             torch.device("cpu"), plan.learner, plan.params)

    assert strategy(None) == "vmap" and strategy(40 * mb + chunk * per_task) == "vmap"
    assert strategy(40 * mb + chunk * per_task - 1) == "loop", "a chunk would not fit"
    with pytest.raises(ConfigError, match="scoring one validation task needs about"):
        strategy(40 * mb + per_task - 1)


def test_a_bounded_chunk_gives_the_same_meta_step() -> None:
    from funcgraph.meta import MetaTrainer, maml
    from funcgraph.models import mlp

    model = mlp(hidden=(8,), dtype=torch.float64)
    learner = maml(model, kind="regression", inner_steps=1, inner_lr=0.05)
    x = random.uniform(random.key(1), (6, 8, 1), dtype=torch.float64)
    batch = Task(x[:, :4], torch.sin(x[:, :4]), x[:, 4:], torch.sin(x[:, 4:]))
    states = []
    for chunk in (None, 1, 4):
        trainer = MetaTrainer(learner, strategy="vmap", chunk_size=chunk)
        state = trainer.init(random.key(0))
        states.append(trainer.step(state, batch)[0].params)
    for other in states[1:]:
        for name in states[0]:
            torch.testing.assert_close(other[name], states[0][name], rtol=1e-12, atol=1e-12)
    with pytest.raises(ConfigError, match="chunk_size"):
        MetaTrainer(learner, chunk_size=0)


def test_max_memory_refusals_are_one_line_with_exit_2() -> None:
    bad = runner.invoke(app, ["meta-train", "--dataset", "sinusoid", "--max-memory", "lots",
                              "--dry-run"])
    assert bad.exit_code == 2, bad.output
    assert bad.output.strip().splitlines() == [
        "error: --max-memory: expected a size such as 2GiB, 1.5GB or 800MiB, got 'lots'"]
    tiny = runner.invoke(app, ["meta-train", "--dataset", "sinusoid", "--max-memory", "1KiB",
                               "--dry-run"])
    assert tiny.exit_code == 2, tiny.output
    lines = tiny.output.strip().splitlines()
    assert len(lines) == 1 and "--max-memory 1.0 KiB: a meta-step needs at least" in lines[0], (
        tiny.output)
