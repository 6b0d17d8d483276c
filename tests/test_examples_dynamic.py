"""Smoke tests: the dynamic-architecture examples run end to end with tiny settings, and what
they print holds (the numbers are parsed and checked, not only the labels)."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"


def _line(out: str, start: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith(start)]
    assert len(lines) == 1, f"expected one line starting {start!r} in:\n{out}"
    return lines[0]


def _list_after(out: str, start: str) -> list[float]:
    """The first ``[...]`` list of numbers on the line that starts with ``start``."""
    m = re.search(r"\[[^\[\]]*\]", _line(out, start)[len(start):])
    assert m, f"no list on the {start!r} line"
    return [float(v) for v in json.loads(m[0])]


def check_cond(out: str) -> None:
    # double_or_halve(x) is 2 x when sum(x) > 0, else x / 2; its gradient is that factor.
    x = _list_after(out, "x ")
    factor = 2.0 if sum(x) > 0 else 0.5
    eager = _list_after(out, "eager   double_or_halve")
    assert eager == pytest.approx([factor * v for v in x]), f"eager {eager} for x {x}"
    grad = _list_after(out, "grad of sum")
    assert grad == [factor] * len(x), f"grad {grad}, expected {factor} everywhere"
    rows = json.loads(_line(out, "vmap over rows")[len("vmap over rows"):].strip())
    assert len(rows) == 2 and all(len(r) == len(x) for r in rows), rows


def check_stochastic_depth(out: str) -> None:
    # The mean prediction over sampled depths estimates the evaluation-mode prediction.
    m = re.search(rf"\|mean over 50 keys - eval\| = ({NUMBER}) \(standard error ({NUMBER})\)",
                  out)
    assert m, f"no 'mean over 50 keys' line in:\n{out}"
    gap, se = float(m[1]), float(m[2])
    assert gap <= 3 * se, f"mean over keys is {gap / se:.1f} standard errors from eval"
    runs = re.findall(r"blocks run ([#.]+) ", out)
    assert runs and all(len(r) == 3 for r in runs), f"depth 8 has 3 blocks: {runs}"


def check_early_exit(out: str) -> None:
    rows = [tuple(float(v) for v in line.split()) for line in out.splitlines()
            if re.fullmatch(rf"\s*{NUMBER}(\s+{NUMBER}){{3}}\s*", line)]
    assert len(rows) >= 3, f"no threshold table in:\n{out}"
    by_threshold = sorted(rows)
    rates = [r[1] for r in by_threshold]
    assert rates == sorted(rates), f"exit rate must grow with the threshold: {by_threshold}"
    assert by_threshold[0][:2] == (0.0, 0.0) and by_threshold[-1][:2] == (1.0, 1.0), (
        f"threshold 0 exits nothing, threshold 1 everything: {by_threshold}")
    assert all(0.0 <= r[2] <= 1.0 for r in rows), f"accuracies out of [0, 1]: {rows}"


def check_rnn(out: str) -> None:
    m = re.search(rf"max \|funcgraph - nn.LSTM packed\| = ({NUMBER})", out)
    assert m and float(m[1]) < 1e-5, f"funcgraph's LSTM differs from nn.LSTM: {m and m[0]}"
    accs = [float(a) for a in re.findall(rf"validation accuracy ({NUMBER})", out)]
    assert len(accs) == 4 and all(0.0 <= a <= 1.0 for a in accs), accs
    # Parity of digit sums: chance is about 0.5; 100 steps on sequences up to 4 long learn it.
    assert accs[-1] > 0.9, f"validation accuracy {accs} never rose clear of chance"


@pytest.mark.parametrize(("script", "argv", "check"), [
    ("cond.py", ["--no-export"], check_cond),
    ("stochastic_depth.py", ["--depth", "8", "--steps", "1", "--keys", "50"],
     check_stochastic_depth),
    ("early_exit.py", ["--steps", "2", "--classes", "3", "--width", "4", "--image-size", "8",
                       "--synthetic"], check_early_exit),
    ("rnn.py", ["--steps", "100", "--max-length", "4", "--hidden", "16"], check_rnn),
])
def test_example_runs(script: str, argv: list[str], check: Callable[[str], None],
                      capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location(f"example_{script[:-3]}", EXAMPLES / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(argv)
    check(capsys.readouterr().out)
