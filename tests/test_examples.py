"""Every example in ``examples/`` runs in the test command, with small settings, and what it
demonstrates is checked: each example asserts its own claim (the finite difference converges
to the exact hypergradient, meta-training beats the untrained model on the same held-out
tasks, ...) and returns the figures, which these tests check again.

The dynamic-architecture examples run in ``tests/test_examples_dynamic.py``, the testing and
own-module examples beside the features they show; the last test here checks that no example
is left unrun.
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def load(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module_name = f"_example_{name}"
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, module_name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_darts_search_moves_the_architecture_and_builds_the_network(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    losses = load("darts_search", monkeypatch).main(
        ["--steps", "5", "--batch", "8", "--C", "4", "--layers", "3", "--classes", "4"])
    assert len(losses) == 5 and all(math.isfinite(v) for v in losses), losses
    # Four classes at initialisation: the cross-entropy starts near log(4), then falls.
    assert abs(losses[0] - math.log(4)) < 0.5, losses
    assert losses[-1] < 0.7 * losses[0], f"five steps should lower the train loss: {losses}"
    out = capsys.readouterr().out
    assert '"normal"' in out and "logits (4, 4)" in out, out[-500:]
    acc = re.search(r"supernet accuracy on the validation half: (\d\.\d+) \(chance 0\.25\)", out)
    assert acc, f"the example prints the supernet's validation accuracy:\n{out[-800:]}"
    assert float(acc[1]) > 0.5, f"validation accuracy {acc[1]} is not clear of chance 0.25"


def test_darts_hypergradient_finite_difference_converges_to_the_exact_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    errors = load("darts_hypergradient", monkeypatch).main(
        ["--C", "2", "--layers", "3", "--batch", "4", "--classes", "3", "--radii", "1e-2,1e-7"])
    assert errors["fd 1e-07"] < 1e-6, errors
    # First order drops the second-order term: it is a different direction, not a rounding
    # of the exact one; the paper's radius 0.01 is far off on this ReLU network.
    assert errors["first"] > 0.1 and errors["fd 0.01"] > 0.1, errors


def test_inspect_graph_names_the_blocks_a_training_draw_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = load("inspect_graph", monkeypatch).main(["--depth", "8"])
    assert seen.eval_ops > max(seen.train_ops), seen  # depth 8 at key 10 / 11 drops a block
    assert seen.only_a + seen.only_b, "keys 10 and 11 drop different residual bodies"
    assert all(re.fullmatch(r"layer\d\.\d\.body", b) for b in seen.only_a + seen.only_b), seen


def test_inspect_nan_stops_at_the_log_and_the_stable_loss_is_finite(
        monkeypatch: pytest.MonkeyPatch) -> None:
    message, finite = load("inspect_nan", monkeypatch).main()
    assert message.startswith("aten.log (op #") and "produced Inf" in message, message
    assert "inspect_nan.py:" in message, "the message names the user's source line"
    assert finite


def test_maml_glyphs_beats_the_untrained_model_on_the_same_tasks(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    acc = load("maml_glyphs", monkeypatch).main(
        ["--steps", "50", "--meta-batch", "2", "--episodes", "20", "--image-size", "16"])
    before = re.search(r"before meta-training: acc (\d+\.\d+)%", capsys.readouterr().out)
    assert before, "the example prints the untrained accuracy"
    assert 0.2 < float(before[1]) / 100 < acc <= 1.0, (before[1], acc)


def test_every_example_runs_in_some_test() -> None:
    """An example only imported (``tests/test_docs.py``) is not run; each must be named by a
    test that runs it."""
    tests = {p: p.read_text() for p in (ROOT / "tests").glob("test_*.py")
             if p.name != "test_docs.py"}
    unrun = [e.name for e in sorted(EXAMPLES.glob("*.py"))
             if not any(f'"{e.stem}' in text or f"'{e.stem}" in text or f"/{e.name}" in text
                        for text in tests.values())]
    assert not unrun, f"examples no test runs: {unrun}"
