"""The meta-gradient compiled whole (``compile=``): for every built-in learner and both
compiled strategies it builds graphs (a counting backend sees them) and equals the eager
meta-gradient in float64; a function that cannot be compiled whole warns once, naming what
failed and where, and runs eagerly; MAML++ compiles from its first step (its annealed weights
are tensors), and a schedule that builds a new function every step warns once.

The comparisons compile with the ``aot_eager`` backend: Dynamo and AOTAutograd trace the same
whole graph as for inductor (second order and vmap included) and run it with torch's kernels,
in seconds where inductor's code generation takes about a minute per graph on a small CPU
(``benchmarks/meta_step.py`` checks inductor's gradient against the eager one before timing).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from typer.testing import CliRunner

import funcgraph.meta as meta
from funcgraph import bind, random
from funcgraph.cli import app
from funcgraph.errors import ConfigError
from funcgraph.meta import CompileFallback, MetaTrainer, Task, mean_task_grads, meta_step
from funcgraph.models import mlp
from funcgraph.train import adam

BACKEND = "aot_eager"
pytestmark = pytest.mark.usefixtures("float64_default")  # tests/conftest.py


def regression_tasks(num: int = 3) -> Task:
    g = torch.Generator().manual_seed(0)
    return Task(*(torch.randn(num, 4, 1, generator=g) for _ in range(4)))


MODEL = mlp(1, 1, hidden=(8,))


def model_params() -> dict[str, torch.Tensor]:
    return MODEL.init(random.key(0))[0]


def learner_and_tasks(name: str) -> tuple[meta.MetaLearner, Task]:
    apply = bind(MODEL, MODEL.init(random.key(0))[1])
    if name == "protonet":
        labels = torch.tensor([0, 1, 0, 1]).repeat(3, 1)
        tasks = regression_tasks()
        return meta.protonet(apply, ways=2), Task(tasks.support_x, labels, tasks.query_x,
                                                  labels)
    if name == "anil":
        return meta.anil(apply, kind="regression", head="layers.1"), regression_tasks()
    return getattr(meta, name)(apply, kind="regression"), regression_tasks()


def init_params(learner: meta.MetaLearner) -> dict[str, torch.Tensor]:
    return learner.init(model_params())


def assert_same(got: tuple, want: tuple, what: str) -> None:  # type: ignore[type-arg]
    grads, loss, metric = got
    assert set(grads) == set(want[0]), what
    for n in want[0]:
        assert torch.allclose(grads[n], want[0][n], rtol=1e-10, atol=1e-12), (
            f"{what}: {n} differs by {float((grads[n] - want[0][n]).abs().max()):.2e}")
    assert torch.allclose(loss, want[1], rtol=1e-10) and torch.allclose(metric, want[2],
                                                                         rtol=1e-10), what


LEARNERS = ["maml", "fomaml", "metasgd", "anil", "mamlpp", "imaml", "reptile", "protonet"]


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
@pytest.mark.parametrize("name", LEARNERS)
def test_the_compiled_meta_gradient_equals_the_eager_one(name: str, strategy: str) -> None:
    learner, tasks = learner_and_tasks(name)
    params = init_params(learner)
    # iMAML's eager loop stops its conjugate gradient at the tolerance; inside a transform or
    # a compiled graph it runs every step: the vmapped eager gradient is its reference.
    reference = "vmap" if name == "imaml" else strategy
    eager = mean_task_grads(learner.task_grad, params, tasks, strategy=reference)
    counter = CompileCounterWithBackend(BACKEND)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileFallback)  # compiled whole, or the test fails
        compiled = mean_task_grads(learner.task_grad, params, tasks, strategy=strategy,
                                   compile=counter)
    assert counter.frame_count == 1, f"{name} {strategy}: {counter.frame_count} graphs built"
    assert_same(compiled, eager, f"{name} {strategy}")


def test_a_function_that_cannot_compile_whole_warns_once_and_runs_eagerly() -> None:
    learner, tasks = learner_and_tasks("maml")
    params = init_params(learner)

    def task_grad(meta_params, task):  # type: ignore[no-untyped-def]
        if float(task.support_x.sum()) > 1e9:  # reads a value: a graph break
            raise AssertionError
        return learner.task_grad(meta_params, task)

    eager = mean_task_grads(task_grad, params, tasks, strategy="loop")
    with pytest.warns(CompileFallback, match="did not compile") as caught:
        first = mean_task_grads(task_grad, params, tasks, strategy="loop", compile=BACKEND)
    said = [str(w.message) for w in caught if w.category is CompileFallback]
    assert len(said) == 1, said
    assert 'test_meta_compiled.py", line' in said[0] and "in task_grad" in said[0], (
        f"the warning names the file and line of what failed: {said[0]}")
    assert_same(first, eager, "the eager fallback")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileFallback)
        again = mean_task_grads(task_grad, params, tasks, strategy="loop", compile=BACKEND)
    assert_same(again, eager, "the eager fallback, not compiled again")


def test_mamlpp_compiles_from_its_first_step_and_once_per_phase() -> None:
    learner = meta.mamlpp(bind(MODEL, MODEL.init(random.key(0))[1]), kind="regression",
                          msl_anneal_steps=3, meta_steps=10, first_order_until=0)
    assert learner.at_step(0) is not learner.at_step(1), "annealing: a learner per step"
    assert learner.at_step(3) is learner.at_step(7), "after the anneal: one learner"
    params = init_params(learner)
    optimizer, tasks = adam(1e-3), regression_tasks()
    counter = CompileCounterWithBackend(BACKEND)
    built = []
    for step in (0, 1, 2, 3, 4):  # annealing (weights as tensors), then after the anneal
        want = meta_step(learner, optimizer, params, optimizer.init(params), tasks, step=step,
                         strategy="vmap")
        with warnings.catch_warnings():
            warnings.simplefilter("error", CompileFallback)
            got = meta_step(learner, optimizer, params, optimizer.init(params), tasks,
                            step=step, strategy="vmap", compile=counter)
        built.append(counter.frame_count)
        for n in want[0]:
            assert torch.allclose(got[0][n], want[0][n], rtol=1e-10, atol=1e-12), (step, n)
    assert built == [1, 1, 1, 2, 2], (
        f"graphs after each step {built}: one for the anneal from step 0, one after it")


def test_a_schedule_that_builds_a_new_learner_each_step_warns_once_and_runs_eagerly() -> None:
    apply = bind(MODEL, MODEL.init(random.key(0))[1])

    def schedule(step: int) -> meta.MetaLearner:
        from dataclasses import replace

        fresh = meta.maml(apply, kind="regression", inner_lr=0.1 / (1 + step))
        return replace(fresh, schedule=schedule)

    learner = schedule(0)
    params, optimizer, tasks = init_params(learner), adam(1e-3), regression_tasks()
    counter = CompileCounterWithBackend(BACKEND)
    with pytest.warns(CompileFallback, match="new meta-gradient function every") as caught:
        for step in range(4):
            meta_step(learner, optimizer, params, optimizer.init(params), tasks, step=step,
                      strategy="loop", compile=counter)
    assert len([w for w in caught if w.category is CompileFallback]) == 1
    assert counter.frame_count == 0, "nothing compiled for one step's use"


def test_meta_trainer_steps_compiled_as_eagerly() -> None:
    learner, tasks = learner_and_tasks("maml")
    counter = CompileCounterWithBackend(BACKEND)
    eager, compiled = MetaTrainer(learner, strategy="vmap"), MetaTrainer(
        learner, strategy="vmap", compile=counter)
    assert compiled.compiled is None, "no step yet"
    state = eager.init(random.key(1), model_params())
    warnings.simplefilter("error", CompileFallback)  # keyed tasks compile whole too
    (a, _), (b, _) = eager.step(state, tasks), compiled.step(state, tasks)
    assert counter.frame_count == 1 and compiled.compiled is True
    assert compiled.compile_seconds > 0 and eager.compile_seconds == 0
    for n in a.params:
        assert torch.allclose(a.params[n], b.params[n], rtol=1e-10, atol=1e-12), n
    with pytest.raises(ConfigError, match="not 'threads'"):
        MetaTrainer(learner, strategy="threads", compile=True)
    with pytest.raises(ConfigError, match="compile must be True, False or"):
        MetaTrainer(learner, compile=3)  # type: ignore[arg-type]


def test_meta_train_takes_compile_and_refuses_it_with_threads() -> None:
    runner = CliRunner()
    args = ["meta-train", "--dataset", "sinusoid", "--steps", "2", "--dry-run"]
    result = runner.invoke(app, [*args, "--compile", "--strategy", "threads"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "--compile runs tasks" in lines[0], (
        result.output)
    result = runner.invoke(app, [*args, "--compile"])
    assert result.exit_code == 0 and '"compile": true' in result.output, result.output


def test_a_backends_failure_says_what_it_raised_and_where() -> None:
    """A backend that fails says what it raised (not an empty ``raised:``) and a file and
    line; here a tensor of a transform left through a closure, which AOTAutograd refuses."""
    store: dict[str, torch.Tensor] = {}

    def leaky(x: torch.Tensor) -> torch.Tensor:
        def inner(y: torch.Tensor) -> torch.Tensor:
            store["kept"] = (y * 3).detach()
            return (y * y).sum()

        return torch.func.grad(inner)(x)

    with pytest.raises(Exception) as caught:
        torch.compile(leaky, fullgraph=True, backend=BACKEND)(torch.randn(3))
    reason = meta.compiled.compile_failure(caught.value)
    assert reason is not None and "raised: NotImplementedError: " in reason, reason
    assert '; at File "' in reason and ", line " in reason, reason
