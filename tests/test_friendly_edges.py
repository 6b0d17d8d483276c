"""Errors at the edges say what to do: a missing test extra, a Python ``if`` on a tensor under
``vmap``, and a model that ``torch.export`` cannot trace."""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

import funcgraph as fg
from funcgraph import nn, random
from funcgraph.errors import ExportError, TransformError
from funcgraph.export import export

_VMAP_IF = ("a Python `if` on a tensor value cannot run under vmap; use "
            "funcgraph.cond(pred, true_fn, false_fn, *operands)")


@pytest.mark.parametrize("statement", [
    "from funcgraph.testing import strategies",
    "import funcgraph.testing.strategies",
])
def test_strategies_without_hypothesis_say_how_to_install_it(statement: str) -> None:
    script = ("import sys\nsys.modules['hypothesis'] = None\n"
              f"try:\n    {statement}\nexcept ImportError as e:\n    print('ImportError:', e)\n"
              "import funcgraph.testing\nprint('testing still imports')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, f"the script failed:\n{out.stderr}"
    assert 'ImportError: funcgraph.testing.strategies needs hypothesis: pip install ' \
           '"funcgraph[test]"' in out.stdout, f"no install hint in:\n{out.stdout}"
    assert "testing still imports" in out.stdout, "the assertions must not need hypothesis"


def _branchy(pick: str) -> fg.Model:
    """A composite that doubles its linear layer's output when the sum is positive, with a
    Python ``if`` or with ``funcgraph.cond``."""

    def forward(run: nn.Children, x: Tensor) -> Tensor:
        h = run("fc", x)
        if pick == "cond":
            return fg.cond(h.sum() > 0, lambda v: v * 2, lambda v: v, h)
        return h * 2 if h.sum() > 0 else h

    return nn.composite("branchy", {"fc": nn.linear(3, 2)}, forward)


def _line_of(fn: object, text: str) -> int:
    """The number of the line of ``fn``'s source that holds ``text``."""
    lines, start = inspect.getsourcelines(fn)  # type: ignore[arg-type]
    return start + next(i for i, line in enumerate(lines) if text in line)


_BRANCH_LINE = _line_of(_branchy, "if h.sum() > 0")


def test_python_if_under_vmap_names_funcgraph_cond() -> None:
    model = nn.serial(_branchy("if"))  # nested: translated once, by the innermost composite
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (4, 3))
    with pytest.raises(TransformError) as info:
        torch.func.vmap(lambda row: model.apply(params, state, row)[0])(x)
    message = str(info.value)
    first, blank, *torch_text = message.splitlines()
    line = _BRANCH_LINE
    problem, fix = _VMAP_IF.split("; ")
    assert first == f"{problem} (at {__file__}:{line}, `h.sum() > 0`); {fix}" and blank == "", (
        f"first lines:\n{message}")
    assert "data-dependent control flow" in "\n".join(torch_text), (
        f"torch's message must follow:\n{message}")
    assert message.count(problem) == 1, f"translated more than once:\n{message}"
    assert isinstance(info.value, RuntimeError), "still a RuntimeError, like torch's"
    fixed = _branchy("cond")
    fixed_params, _ = fixed.init(random.key(0))
    ys = torch.func.vmap(lambda row: fixed.apply(fixed_params, {}, row)[0])(x)
    want = torch.stack([fixed.apply(fixed_params, {}, row)[0] for row in x])
    torch.testing.assert_close(ys, want, msg="funcgraph.cond is the fix: vmap equals a loop")


def test_other_runtime_errors_in_a_forward_pass_through() -> None:
    def forward(run: nn.Children, x: Tensor) -> Tensor:
        raise RuntimeError("boom")

    model = nn.composite("fails", {}, forward)
    with pytest.raises(RuntimeError, match="^boom$") as info:
        model.apply({}, {}, torch.ones(1))
    assert type(info.value) is RuntimeError, f"not translated: {type(info.value)}"


def test_export_error_leads_with_one_line_naming_the_fix() -> None:
    model = _branchy("if")
    params, state = model.init(random.key(0))
    with pytest.raises(ExportError) as info:
        export(model, params, state, torch.ones(2, 3))
    message = str(info.value)
    assert "\n" not in message and len(message) < 200, f"not one short line: {message}"
    assert "'branchy'" in message and "funcgraph.cond(" in message, f"what and the fix: {message}"
    assert "data-dependent" in str(info.value.__cause__), (
        f"torch's report is kept as the cause:\n{info.value.__cause__}")


def test_meta_learning_under_vmap_points_at_cond_for_a_python_if() -> None:
    """A plain function (no composite) with a Python `if` on a tensor, meta-trained with the
    vmap strategy, gets the same hint."""
    import torch

    from funcgraph.errors import TransformError
    from funcgraph.meta import Task, maml, mean_task_grads

    def apply(params: dict, x: torch.Tensor) -> torch.Tensor:
        y = x @ params["w"]
        return y if y.sum() > 0 else -y  # data-dependent Python branch

    learner = maml(apply, kind="regression", inner_steps=1, inner_lr=0.1)
    x = torch.randn(3, 4, 2)
    tasks = Task(x, torch.randn(3, 4, 1), x, torch.randn(3, 4, 1))
    with pytest.raises(TransformError, match="use funcgraph.cond"):
        mean_task_grads(learner.task_grad, {"w": torch.randn(2, 1)}, tasks, strategy="vmap")


def _one_hot_learner(ways: int) -> fg.meta.MetaLearner:
    """A learner of one's own whose loss builds its targets with ``F.one_hot``."""
    from funcgraph.meta import MetaLearner, objective
    from funcgraph.meta.learner import task_grad_of

    def task_loss(p: dict[str, Tensor], task: fg.meta.Task) -> tuple[Tensor, Tensor]:
        logits = task.query_x @ p["w"]
        targets = torch.nn.functional.one_hot(task.query_y, ways).float()
        loss = ((logits.softmax(-1) - targets) ** 2).mean()
        return loss, (logits.argmax(-1) == task.query_y).float().mean()

    return MetaLearner("one-hot", init=lambda p: dict(p), task_grad=task_grad_of(task_loss),
                       task_eval=task_loss, objective=objective("classification"))


_ONE_HOT_LINE = _line_of(_one_hot_learner, "one_hot(task.query_y")


def test_one_hot_under_vmap_is_named_with_the_users_line_and_the_fix() -> None:
    """Torch refuses F.one_hot under vmap with the message of a Python ``if``: funcgraph's
    first line names F.one_hot, the line that calls it and the comparison (or the loop) to
    use, and the loop strategy runs the same learner."""
    from funcgraph.meta import Task, mean_task_grads

    learner = _one_hot_learner(3)
    k = random.split(random.key(0), 2)
    labels = torch.arange(3).repeat(2, 1)
    tasks = Task(random.normal(k[0], (2, 3, 4)), labels, random.normal(k[1], (2, 3, 4)), labels)
    params = {"w": random.normal(random.key(2), (4, 3))}
    with pytest.raises(TransformError) as info:
        mean_task_grads(learner.task_grad, params, tasks, strategy="vmap")
    first = str(info.value).splitlines()[0]
    assert first.startswith("F.one_hot cannot run under vmap"), first
    assert f"(at {__file__}:{_ONE_HOT_LINE}, `torch.nn.functional.one_hot(task.query_y, ways)`)" \
        in first, first
    assert "`(y[..., None] == torch.arange(ways)).float()`" in first and 'strategy="loop"' in \
        first, f"the fix: {first}"
    assert "Python `if`" not in first and "funcgraph.cond" not in first, first
    grads, loss, _ = mean_task_grads(learner.task_grad, params, tasks, strategy="loop")
    assert set(grads) == {"w"} and torch.isfinite(loss), "the loop runs F.one_hot"


def test_item_under_vmap_is_named_with_the_users_line() -> None:
    def f(x: Tensor) -> Tensor:
        return x * x.sum().item()

    model = nn.composite("c", {}, lambda run, v: f(v))
    with pytest.raises(TransformError) as info:
        torch.func.vmap(lambda x: model.apply({}, {}, x)[0])(torch.ones(2, 3))
    first = str(info.value).splitlines()[0]
    line = _line_of(f, "x.sum().item()")
    assert first.startswith(f".item() cannot run under vmap: it reads a tensor's value into "
                            f"Python (at {__file__}:{line}, `x.sum().item()`); "), first


def test_an_op_sized_by_values_under_vmap_is_named() -> None:
    def f(x: Tensor) -> Tensor:
        return x.nonzero().sum()

    with pytest.raises(TransformError) as info:
        mean_task_grads_of(f)
    first = str(info.value).splitlines()[0]
    assert first.startswith(f"nonzero cannot run under vmap: the size of its output depends on "
                            f"the values (at {__file__}:{_line_of(f, 'x.nonzero()')}, "
                            "`x.nonzero()`)"), first


def mean_task_grads_of(f: Callable[[Tensor], Tensor]) -> None:
    """The vmap strategy over a learner whose loss is ``f`` of the query images."""
    from funcgraph.meta import MetaLearner, Task, mean_task_grads, objective
    from funcgraph.meta.learner import task_grad_of

    def task_loss(p: dict[str, Tensor], task: Task) -> tuple[Tensor, Tensor]:
        loss = (f(task.query_x) * p["w"]).sum()
        return loss, loss.detach()

    learner = MetaLearner("own", init=lambda p: dict(p), task_grad=task_grad_of(task_loss),
                          task_eval=task_loss, objective=objective("regression"))
    x = torch.ones(2, 3, 4)
    mean_task_grads(learner.task_grad, {"w": torch.ones(())}, Task(x, x, x, x), strategy="vmap")
