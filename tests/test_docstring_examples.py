"""Every ``Example::`` block in the docstrings of :mod:`funcgraph.testing` runs as written,
on a model with batch norm (running statistics) in float32 and float64: a helper's
documented call works on the models it is for. A block that defines ``test_*`` functions
(the strategies') has them called, so their ``@given`` draws run too."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given

import funcgraph as fg
from funcgraph import bind, random
from funcgraph.testing import strategies as fst

TESTING = Path(fg.__file__).parent / "testing"


def examples() -> list[tuple[str, str]]:
    """``(where, code)`` of each ``Example::`` block of a docstring in funcgraph/testing."""
    found = []
    for path in sorted(TESTING.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.ClassDef | ast.Module):
                continue
            doc = ast.get_docstring(node, clean=True) or ""
            for i, block in enumerate(doc.split("Example::")[1:]):
                lines = block.split("\n")[1:]  # the blank line after "Example::", then code
                code = []
                for line in lines:
                    if line.strip() and not line.startswith("    "):
                        break  # back to the docstring's own indentation: the block ended
                    code.append(line)
                name = getattr(node, "name", path.stem)
                found.append((f"{path.name}:{name}#{i}", textwrap.dedent("\n".join(code))))
    return found


def namespace(dtype: torch.dtype) -> dict[str, Any]:
    """What the examples take as given: a conv model with batch norm, its params and state,
    a batch ``x`` with labels ``y`` and a stack of batches ``xs``, in ``dtype``."""
    model = fg.nn.serial(fg.nn.conv2d(1, 4, 3, padding=1), fg.nn.batch_norm(4), fg.nn.relu(),
                         fg.nn.flatten(), fg.nn.linear(4 * 4 * 4, 3))
    params, state = model.init(random.key(0))
    params = {n: t.to(dtype) for n, t in params.items()}
    state = {n: t.to(dtype) if t.is_floating_point() else t for n, t in state.items()}
    k = random.split(random.key(1), 2)
    return {
        "torch": torch, "F": F, "fg": fg, "bind": bind, "random": random, "fst": fst,
        "given": given,
        "model": model, "params": params, "state": state,
        "x": random.normal(k[0], (2, 1, 4, 4)).to(dtype), "y": torch.tensor([0, 2]),
        "xs": random.normal(k[1], (3, 2, 1, 4, 4)).to(dtype),
        "double_or_halve": lambda t: t * 2 if t.sum() > 0 else t / 2,
        **{name: getattr(fg.testing, name) for name in fg.testing.__all__},
    }


def test_the_examples_are_found() -> None:
    names = {where.split("#")[0].split(":")[1] for where, _ in examples()}
    assert {"assert_pure", "assert_grad_matches_finite_differences", "assert_matches_module",
            "assert_vmap_matches_loop", "record_branches", "tensors", "params_for"} <= names, \
        names


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize(("where", "code"), examples(), ids=[w for w, _ in examples()])
def test_a_docstring_example_runs_as_written(where: str, code: str, dtype: torch.dtype
                                             ) -> None:
    scope = namespace(dtype)
    exec(compile(code, where, "exec"), scope)  # noqa: S102 - the docs' own code
    for name, value in list(scope.items()):
        if name.startswith("test_") and inspect.isfunction(value):
            value()  # a @given test draws its own arguments
