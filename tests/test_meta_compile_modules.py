"""The short path compiles a user's own ``nn.Module`` whole: ``MetaTrainer(maml(net),
compile=...)`` builds graphs (a counting backend sees them), says so (``trainer.compiled``),
and steps as the eager trainer does in float64; a module with batch norm (running statistics
or not) compiles through the fused chain and through its own forward alike.

Graphs are counted with ``torch._dynamo.testing.CompileCounterWithBackend("aot_eager")``: a
compile flag that were dropped, or a fallback to eager, leaves the count at zero. Shapes are
tiny, as ``aot_eager`` (no code generation) takes a few seconds per graph on a small CPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import funcgraph.meta as meta
from funcgraph import from_module, random
from funcgraph.meta import CompileFallback, MetaTrainer, Task
from funcgraph.train import sgd

pytestmark = pytest.mark.usefixtures("float64_default")  # tests/conftest.py


def regression_tasks() -> Task:
    g = torch.Generator().manual_seed(0)
    return Task(*(torch.randn(2, 4, 1, generator=g) for _ in range(4)))


def image_tasks(size: int = 8) -> Task:
    g = torch.Generator().manual_seed(0)
    labels = torch.tensor([0, 1, 0, 1]).repeat(2, 1)
    return Task(torch.randn(2, 4, 1, size, size, generator=g), labels,
                torch.randn(2, 4, 1, size, size, generator=g), labels)


class OwnForward(nn.Module):
    """A forward of its own that is no chain (a skip connection): the exact path, where
    batch norm runs under the transform-safe router, running statistics kept."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.norm = nn.BatchNorm2d(3)
        self.head = nn.Linear(3 * 4 * 4, 2)
        self.flat = nn.BatchNorm1d(2, track_running_stats=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.norm(self.conv(x))) + x  # (B, 3, 8, 8): the skip broadcasts
        h = F.avg_pool2d(h, 2).flatten(1)
        return torch.tanh(self.flat(self.head(h)))


def chain() -> nn.Module:
    """Every layer the fused chain reads, batch norm with and without running statistics."""
    return nn.Sequential(nn.Conv2d(1, 3, 3, padding=1),
                         nn.BatchNorm2d(3, track_running_stats=False), nn.GELU(),
                         nn.AvgPool2d(2), nn.Flatten(), nn.Linear(3 * 4 * 4, 4),
                         nn.BatchNorm1d(4), nn.Tanh(), nn.Dropout(0.0), nn.Linear(4, 2))


MODULES: dict[str, tuple[Callable[[], nn.Module], str, Callable[[], Task]]] = {
    # the two modules of the short path's docs, as written there
    "mlp": (lambda: nn.Sequential(nn.Linear(1, 16), nn.ReLU(), nn.Linear(16, 1)),
            "regression", regression_tasks),
    "cnn": (lambda: nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 2)),
            "classification", image_tasks),
    "chain": (chain, "classification", image_tasks),
    "own_forward": (OwnForward, "classification", image_tasks),
}

CASES = [("mlp", "loop"), ("mlp", "vmap"), ("cnn", "loop"), ("cnn", "vmap"),
         ("chain", "vmap"), ("own_forward", "loop")]


@pytest.mark.parametrize(("name", "strategy"), CASES)
def test_a_modules_meta_step_compiles_whole_and_equals_the_eager_one(name: str,
                                                                     strategy: str) -> None:
    make, kind, tasks = MODULES[name]
    learner = meta.maml(make(), kind=kind)
    counter = CompileCounterWithBackend("aot_eager")
    # plain SGD: Adam would blow a conv bias's zero-up-to-rounding gradient (before batch
    # norm) up to a full step whose sign is the rounding's
    eager = MetaTrainer(learner, sgd(0.5), strategy=strategy)
    compiled = MetaTrainer(learner, sgd(0.5), strategy=strategy, compile=counter)
    state = eager.init(random.key(0))
    want, _ = eager.step(state, tasks())
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileFallback)  # compiled whole, or the test fails
        got, _ = compiled.step(state, tasks())
    assert counter.frame_count >= 1, f"{name} {strategy}: no graph was compiled"
    assert compiled.compiled is True and compiled.compile_reason is None, compiled.compile_reason
    assert eager.compiled is False and eager.compile_reason == "compile=False"
    for n in want.params:
        assert torch.allclose(got.params[n], want.params[n], rtol=1e-9, atol=1e-12), (
            f"{name} {strategy}: {n} differs by "
            f"{float((got.params[n] - want.params[n]).abs().max()):.2e}")


def test_a_module_with_dropout_meta_trains_compiled_and_with_vmap() -> None:
    """torch's dropout draws from torch's generator: vmap draws it per task, as the loop."""
    net = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 1))
    learner = meta.maml(net, kind="regression")
    eager = MetaTrainer(learner, strategy="vmap")
    state = eager.init(random.key(0))
    _, metrics = eager.step(state, regression_tasks())
    assert torch.isfinite(metrics.loss), "eager vmap over a module with dropout"
    counter = CompileCounterWithBackend("aot_eager")
    compiled = MetaTrainer(learner, strategy="loop", compile=counter)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileFallback)
        _, metrics = compiled.step(state, regression_tasks())
    assert counter.frame_count >= 1 and compiled.compiled, compiled.compile_reason
    assert torch.isfinite(metrics.loss)


def test_a_converted_modules_batch_norm_under_compile_keeps_its_running_statistics() -> None:
    """The exact path's router returns the new running statistics under compile too."""
    model = from_module(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)), fuse=False)
    params, state = model.init(random.key(0))
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))

    def forward(p: dict[str, torch.Tensor], s: dict[str, torch.Tensor], x: torch.Tensor
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return torch.func.vmap(lambda xi: model.apply(p, s, xi, train=True))(x[None])

    counter = CompileCounterWithBackend("aot_eager")
    want_y, want_state = forward(params, state, x)
    got_y, got_state = torch.compile(forward, fullgraph=True, backend=counter)(params, state, x)
    assert counter.frame_count == 1
    assert torch.allclose(got_y, want_y, atol=1e-12)
    for n in want_state:
        assert torch.allclose(got_state[n].double(), want_state[n].double(), atol=1e-12), n
    assert not torch.equal(got_state["1.running_mean"][0], state["1.running_mean"]), (
        "the running mean moved")


@pytest.mark.slow
def test_inductors_compiled_meta_gradient_equals_the_eager_one_in_float64() -> None:
    """inductor generates the kernels (about a minute per graph on a small CPU): the
    compiled second-order meta-gradient of the short path's module equals the eager one."""
    make, kind, tasks = MODULES["cnn"]
    learner = meta.maml(make(), kind=kind)
    params = learner.init(learner.model.init(random.key(0))[0])  # type: ignore[union-attr]
    want = meta.mean_task_grads(learner.task_grad, params, tasks(), strategy="vmap")
    counter = CompileCounterWithBackend("inductor")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileFallback)
        got = meta.mean_task_grads(learner.task_grad, params, tasks(), strategy="vmap",
                                   compile=counter)
    assert counter.frame_count == 1, "inductor built no graph"
    for n in want[0]:
        assert torch.allclose(got[0][n], want[0][n], rtol=1e-9, atol=1e-12), (
            f"{n} differs by {float((got[0][n] - want[0][n]).abs().max()):.2e}")
