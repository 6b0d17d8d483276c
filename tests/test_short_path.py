"""The short path of meta-learning: a learner straight from an ``nn.Module`` or a Model, a
``MetaTrainer`` over a frozen ``TrainState``, and ``tasks`` for meta-batches.

It must equal the long path it wraps (the same meta-gradient as ``from_module`` + ``bind(...,
train=True)``), keep its refusals (batch norm bound for evaluation), be pure (the same state
gives the same next state) and stay short (the example's funcgraph names are counted).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

import funcgraph as fg
from funcgraph.errors import ConfigError
from funcgraph.meta import (
    STEP_BN_PREFIX,
    MetaTrainer,
    Task,
    TaskStream,
    TrainState,
    imaml,
    maml,
    mamlpp,
    mean_task_grads,
    metasgd,
    protonet,
    reptile,
    tasks,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "maml_short.py"
MAX_NAMES = 6


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("example_maml_short", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Regressor(nn.Module):
    """A small module with batch norm (running statistics) for sinusoid tasks."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def sinusoid_batch(seed: int = 1, n: int = 3) -> Task:
    return next(iter(tasks("sinusoid", "5shot", batch=n, seed=seed)))


def equal_dicts(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


# --- (a) the example trains -----------------------------------------------------------------

def test_the_short_example_raises_the_held_out_accuracy(
        capsys: pytest.CaptureFixture[str]) -> None:
    before, after = load_example().main(["--steps", "30", "--meta-batch", "4",
                                         "--episodes", "25"])
    out = capsys.readouterr().out
    assert after > before, f"held-out accuracy {before:.3f} -> {after:.3f}: {out}"
    assert "after 30 meta-steps" in out, out


# --- (b) the example is short ---------------------------------------------------------------

def funcgraph_names(source: str) -> set[str]:
    """The distinct funcgraph names ``source`` uses: names imported from funcgraph, and
    attribute chains off a module alias of funcgraph (``fg.meta.maml`` counts once, as
    ``meta.maml``; ``fg.meta`` alone is no name of its own when something hangs off it)."""
    tree = ast.parse(source)
    aliases: set[str] = set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "funcgraph":
                    aliases.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("funcgraph"):
            sub = (node.module or "").removeprefix("funcgraph").lstrip(".")
            names |= {f"{sub}.{a.name}".lstrip(".") for a in node.names}
    chains: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts, inner = [], node
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in aliases:
                chains.add(".".join(reversed(parts)))
    # keep the longest chains: fg.meta.maml also walks fg.meta
    names |= {c for c in chains if not any(o.startswith(c + ".") for o in chains)}
    return names


def test_the_name_counter_counts_chains_and_imports() -> None:
    source = ("import funcgraph as fg\nfrom funcgraph.meta import maml, tasks\n"
              "fg.meta.MetaTrainer(maml(1)); fg.random.key(0); fg.random.key(1); tasks\n")
    assert funcgraph_names(source) == {"meta.MetaTrainer", "random.key", "meta.maml",
                                       "meta.tasks"}


def guide_first_example() -> str:
    """The first code block of the meta-learning guide: the short path as a reader meets it."""
    guide = (EXAMPLE.parents[1] / "docs" / "meta-learning.md").read_text()
    return guide.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("source", [EXAMPLE.read_text, guide_first_example],
                         ids=["examples/maml_short.py", "the guide's first example"])
def test_the_short_example_uses_at_most_six_funcgraph_names(source) -> None:
    names = funcgraph_names(source())
    assert len(names) <= MAX_NAMES, f"the short path grew to {len(names)} names: {sorted(names)}"
    assert {"meta.maml", "meta.MetaTrainer", "meta.tasks"} <= names, sorted(names)


def test_the_short_example_is_about_fifteen_lines_of_user_code() -> None:
    user = EXAMPLE.read_text().split("# --- the user code")[1].split("# -----")[0]
    lines = [line for line in user.splitlines()[1:] if line.strip()]
    assert len(lines) <= 15, f"the user code grew to {len(lines)} lines:\n" + "\n".join(lines)


# --- (c) the same meta-gradient as the long path --------------------------------------------

@pytest.mark.parametrize("strategy", ["vmap", "loop"])
def test_maml_on_a_module_equals_maml_on_its_bound_conversion(strategy: str) -> None:
    torch.manual_seed(0)
    module = Regressor()
    short = maml(module, kind="regression", inner_steps=2, inner_lr=0.05)
    model = fg.from_module(module)
    params, state = model.init(fg.random.key(3))
    long = maml(fg.bind(model, state, train=True), kind="regression", inner_steps=2,
                inner_lr=0.05)
    assert short.model is not None and long.model is None
    short_params, _ = short.model.init(fg.random.key(3))
    assert equal_dicts(short_params, params), "the same key must draw the same params"
    batch = sinusoid_batch()
    by_short, loss_s, _ = mean_task_grads(short.task_grad, params, batch, strategy=strategy)
    by_long, loss_l, _ = mean_task_grads(long.task_grad, params, batch, strategy=strategy)
    assert torch.allclose(loss_s, loss_l, rtol=1e-6, atol=1e-7), (loss_s, loss_l)
    for n in by_long:
        assert torch.allclose(by_short[n], by_long[n], rtol=1e-5, atol=1e-7), (
            f"{n}: meta-gradient of maml(module) differs from the long path's by "
            f"{float((by_short[n] - by_long[n]).abs().max()):.2e}")


def test_maml_on_a_model_equals_maml_on_the_model_bound_for_training() -> None:
    model = fg.nn.serial(fg.nn.linear(1, 8), fg.nn.batch_norm(8), fg.nn.relu(),
                         fg.nn.linear(8, 1))
    params, state = model.init(fg.random.key(0))
    short = maml(model, kind="regression", inner_steps=1, inner_lr=0.05)
    long = maml(fg.bind(model, state, train=True), kind="regression", inner_steps=1,
                inner_lr=0.05)
    assert short.model is model and short.uses_keys and long.uses_keys
    batch = sinusoid_batch().with_keys(fg.random.split(fg.random.key(2), 3))
    by_short, _, _ = mean_task_grads(short.task_grad, params, batch, strategy="vmap")
    by_long, _, _ = mean_task_grads(long.task_grad, params, batch, strategy="vmap")
    assert all(torch.allclose(by_short[n], by_long[n], atol=1e-7) for n in by_long)


LEARNERS = {"maml": maml, "metasgd": metasgd, "mamlpp": mamlpp, "imaml": imaml,
            "reptile": reptile, "protonet": lambda m: protonet(m, ways=5)}


@pytest.mark.parametrize("name", list(LEARNERS))
def test_every_learner_takes_a_module_or_a_model_and_keeps_it(name: str) -> None:
    build = LEARNERS[name]
    module = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(),
                           nn.Linear(2 * 4 * 4, 5))
    from_module = build(module)
    assert isinstance(from_module.model, fg.Model) and not from_module.uses_keys
    model = fg.nn.serial(fg.nn.conv2d(1, 2, 3), fg.nn.batch_norm(2), fg.nn.flatten(),
                         fg.nn.linear(2 * 4 * 4, 5))
    learner = build(model)
    assert learner.model is model and learner.at_step(7).model is model
    state = MetaTrainer(learner).init(fg.random.key(0))
    drawn, _ = model.init(fg.random.key(0))
    missing = [n for n in drawn if n not in state.params and STEP_BN_PREFIX + n not in
               state.params]
    assert not missing and state.step == 0, f"init lost the model's params {missing}"


# --- (d) batch norm bound for evaluation is still refused ------------------------------------

def test_batch_norm_bound_for_evaluation_is_refused_with_the_fix() -> None:
    model = fg.from_module(Regressor())
    _, state = model.init(fg.random.key(0))
    with pytest.raises(ConfigError, match=r"bound for evaluation \(train=False\).*pass "
                                          r"funcgraph\.bind\(model, state, train=True\), or "
                                          r"the Model itself"):
        maml(fg.bind(model, state), kind="regression")


# --- (e) pure ------------------------------------------------------------------------------

def test_step_is_pure_the_same_state_gives_the_same_next_state() -> None:
    trainer = MetaTrainer(maml(Regressor(), kind="regression", inner_lr=0.05))
    state = trainer.init(fg.random.key(0))
    kept = {n: p.clone() for n, p in state.params.items()}
    batch = sinusoid_batch()
    first, m1 = trainer.step(state, batch)
    second, m2 = trainer.step(state, batch)
    assert equal_dicts(state.params, kept) and state.step == 0, "step must not change its input"
    assert first.step == second.step == 1 and torch.equal(first.key, second.key)
    assert equal_dicts(first.params, second.params), "the same state must give the same params"
    assert equal_dicts(first.opt_state, second.opt_state)
    assert torch.equal(m1.loss, m2.loss) and not equal_dicts(first.params, state.params)
    again = trainer.evaluate(first, batch), trainer.evaluate(first, batch)
    assert again[0] == again[1], "evaluate must depend only on the state and the tasks"


def test_a_keyed_model_gets_its_task_keys_from_the_state() -> None:
    model = fg.nn.serial(fg.nn.linear(1, 8), fg.nn.dropout(0.5), fg.nn.linear(8, 1))
    trainer = MetaTrainer(maml(model, kind="regression", inner_lr=0.05))
    state = trainer.init(fg.random.key(0))
    a, _ = trainer.step(state, sinusoid_batch())
    b, _ = trainer.step(state, sinusoid_batch())
    other, _ = trainer.step(TrainState(state.params, state.opt_state, 0, fg.random.key(9)),
                            sinusoid_batch())
    assert equal_dicts(a.params, b.params), "the same state's keys give the same step"
    assert not equal_dicts(a.params, other.params), "another root key draws other dropout"


# --- the trainer's and the stream's contracts ----------------------------------------------

def test_the_default_optimiser_is_adam_at_the_algorithms_meta_rate() -> None:
    model = fg.nn.serial(fg.nn.linear(1, 8), fg.nn.relu(), fg.nn.linear(8, 5))
    assert MetaTrainer(maml(model)).optimizer.hparams["lr"] == 3e-3
    assert MetaTrainer(protonet(model, ways=5)).optimizer.hparams["lr"] == 1e-3
    assert MetaTrainer(mamlpp(model)).optimizer.hparams["lr"] == pytest.approx(3.95e-3)
    assert MetaTrainer(maml(model, name="mine")).optimizer.hparams["lr"] == 3e-3


def test_a_learner_from_a_function_needs_the_params_at_init() -> None:
    model = fg.nn.serial(fg.nn.linear(1, 8), fg.nn.relu(), fg.nn.linear(8, 1))
    params, _ = model.init(fg.random.key(0))
    trainer = MetaTrainer(maml(fg.bind(model, {}, train=True), kind="regression"))
    with pytest.raises(ConfigError, match=r"pass them, init\(key, params\)"):
        trainer.init(fg.random.key(0))
    assert equal_dicts(trainer.init(fg.random.key(0), params).params, params)


def test_a_model_without_parameters_is_refused_at_init() -> None:
    class NoWeights(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    trainer = MetaTrainer(maml(NoWeights(), kind="regression"))
    with pytest.raises(ConfigError, match="has no parameters, so there is nothing to meta-train"):
        trainer.init(fg.random.key(0))


def test_evaluating_on_a_stream_scores_the_tasks_it_yields() -> None:
    trainer = MetaTrainer(maml(Regressor(), kind="regression", inner_lr=0.05))
    state = trainer.init(fg.random.key(0))
    stream = tasks("sinusoid", "5shot", batch=4, count=2, split="test", seed=3)
    batches = list(stream)
    assert len(batches) == 2 and stream.episodes == 8
    assert all(torch.equal(a.query_y, b.query_y) for a, b in zip(batches, stream, strict=True))
    whole = trainer.evaluate(state, stream)
    parts = [trainer.evaluate(state, b) for b in batches]
    assert whole.episodes == 8
    assert whole.loss == pytest.approx(sum(p.loss for p in parts) / 2, rel=1e-5)
    with pytest.raises(ConfigError, match="endless stream"):
        trainer.evaluate(state, tasks("sinusoid", "5shot", batch=4))


def test_splits_of_a_regression_set_are_independent_streams() -> None:
    train, test = (next(iter(tasks("sinusoid", "5shot", batch=2, split=s))) for s in
                   ("train", "test"))
    assert not torch.equal(train.support_x, test.support_x)
    assert train.support_x.shape == (2, 5, 1) and train.query_x.shape == (2, 5, 1)


def test_tasks_from_a_class_dataset_of_your_own() -> None:
    from funcgraph.data import ClassDataset

    images = torch.rand(6, 4, 1, 8, 8)
    ds = ClassDataset(images, [f"c{i}" for i in range(6)], "mine")
    stream = tasks(ds, "3way1shot2query", batch=2, count=1)
    (batch,) = list(stream)
    assert isinstance(stream, TaskStream) and batch.support_x.shape == (2, 3, 1, 8, 8)
    assert batch.query_y.shape == (2, 6)
    with pytest.raises(ConfigError, match="one split already"):
        tasks(ds, "3way1shot", batch=2, split="test")
