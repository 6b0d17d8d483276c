"""The early-exit CNN exported: the per-sample program decides each exit with ``torch.cond``
(its exit branch runs no convolution), the masked program takes any batch, both equal the
eager model for samples that exit and that continue, a run exports from the command line,
and the artifact loads in a process without funcgraph. A failed export is one line, whatever
torch logs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from funcgraph import Model, random
from funcgraph.cli import app
from funcgraph.errors import ConfigError, ShapeError
from funcgraph.export import export
from funcgraph.models import early_exit_cnn
from funcgraph.nn import masked_exits, per_sample_exits, with_threshold


@pytest.fixture(scope="module")
def setup() -> tuple[Model, dict, dict, torch.Tensor, float]:
    model = early_exit_cnn(num_classes=6, width=4)
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (12, 1, 16, 16))
    out, _ = model.apply(params, state, x)
    middle = float(out.continue_prob.median())  # half the samples exit, half continue
    return model, params, state, x, middle


def assert_same(a: tuple, b: tuple, rows: slice | None = None) -> None:
    for got, want in zip(b, a, strict=True):
        torch.testing.assert_close(got, want if rows is None else want[rows])


def test_per_sample_and_masked_equal_eager_for_exits_and_continues(setup: tuple) -> None:
    model, params, state, x, middle = setup
    model = with_threshold(model, middle)
    eager, _ = model.apply(params, state, x)
    assert 0 < int(eager.exited.sum()) < len(x), "both branches must be covered"
    masked, _ = masked_exits(model).apply(params, state, x)
    assert_same(eager, masked)
    one = per_sample_exits(model)
    for i in range(len(x)):
        assert_same(eager, one.apply(params, state, x[i:i + 1])[0], slice(i, i + 1))


def test_the_exported_exit_branch_skips_the_later_blocks(setup: tuple) -> None:
    model, params, state, x, middle = setup
    program = export(per_sample_exits(with_threshold(model, middle)), params, state, x[:1],
                     dynamic_batch=False)
    conds = [n for n in program.graph.nodes if "cond" in str(n.target)]
    assert len(conds) == 1, "one exit, one torch.cond"
    branches = [getattr(program.graph_module, a.target) for a in conds[0].args[1:3]]
    convs = [sum("conv2d" in str(n.target) for n in b.graph.nodes) for b in branches]
    assert sorted(convs) == [0, 3], f"continue branch: block2's 3 convs; exit branch: none {convs}"
    module = program.module()
    eager, _ = with_threshold(model, middle).apply(params, state, x)
    for i in range(len(x)):
        assert_same(eager, module(x[i:i + 1]), slice(i, i + 1))


def test_per_sample_refuses_batches_and_training(setup: tuple) -> None:
    model, params, state, x, _ = setup
    with pytest.raises(ShapeError, match="one sample"):
        per_sample_exits(model).apply(params, state, x[:2])
    with pytest.raises(ConfigError, match="for evaluation"):
        masked_exits(model).apply(params, state, x, key=random.key(0), train=True)


def test_an_early_exit_run_exports_and_loads_without_funcgraph(tmp_path: Path) -> None:
    runner = CliRunner()
    run = tmp_path / "ee"
    result = runner.invoke(app, ["train", "--model", "early-exit", "--steps", "2",
                                 "--out", str(run)])
    assert result.exit_code == 0, result.output
    one, many = tmp_path / "one.pt2", tmp_path / "many.pt2"
    result = runner.invoke(app, ["export", str(run), "--out", str(one)])
    assert result.exit_code == 0 and "static batch, input [1, 1, 28, 28]" in result.output
    result = runner.invoke(app, ["export", str(run), "--out", str(many), "--batched-exits"])
    assert result.exit_code == 0 and "dynamic batch" in result.output, result.output
    x = random.normal(random.key(3), (3, 1, 28, 28))
    torch.save(x, tmp_path / "x.pt")
    script = (
        "import sys, torch, json\n"
        "sys.modules['funcgraph'] = None  # loading must not need funcgraph\n"
        f"x = torch.load({str(tmp_path / 'x.pt')!r})\n"
        f"one = torch.export.load({str(one)!r}).module()\n"
        f"many = torch.export.load({str(many)!r}).module()\n"
        "rows = [one(x[i:i + 1])[0] for i in range(len(x))]\n"
        "err = (torch.cat(rows) - many(x)[0]).abs().max().item()\n"
        "print(json.dumps({'err': err, 'fields': len(many(x))}))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["fields"] == 4 and found["err"] < 1e-5, found  # batch 1 vs 3: kernel rounding


def test_a_failed_export_is_one_line_whatever_torch_logs(tmp_path: Path) -> None:
    script = (
        "import torch\n"
        "from funcgraph import Model, random\n"
        "from funcgraph.export import export\n"
        "def init(key): return {'w': torch.ones(3)}, {}\n"
        "def apply(p, s, x, *, key=None, train=False):\n"
        "    if x.sum() > 1e9:  # a Python if on a tensor: not exportable\n"
        "        return x * p['w'], s\n"
        "    return x - p['w'], s\n"
        "m = Model(init, apply, 'branchy', {})\n"
        "p, s = m.init(random.key(0))\n"
        "try:\n"
        "    export(m, p, s, torch.randn(2, 3))\n"
        "except Exception as e:\n"
        "    print(e)\n"
        "    print('notes' if any('log during the export' in n for n in\n"
        "                         getattr(e.__cause__, '__notes__', [])) else 'no notes')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.stderr.strip() == "", f"torch printed {len(proc.stderr.splitlines())} lines"
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2 and "cannot be exported" in lines[0] and lines[1] == "notes", lines


def test_export_refuses_what_an_early_exit_program_cannot_take(tmp_path: Path) -> None:
    runner = CliRunner()
    mlp_run, ee_run = tmp_path / "mlp", tmp_path / "ee"
    assert runner.invoke(app, ["meta-train", "--dataset", "sinusoid", "--steps", "1",
                               "--episodes", "2", "--out", str(mlp_run)]).exit_code == 0
    result = runner.invoke(app, ["export", str(mlp_run), "--out", str(tmp_path / "a.pt2"),
                                 "--batched-exits"])
    assert result.exit_code == 2 and "--batched-exits: 'mlp' has no early exits" in (
        result.output), result.output
    assert runner.invoke(app, ["train", "--model", "early-exit", "--steps", "1",
                               "--out", str(ee_run)]).exit_code == 0
    result = runner.invoke(app, ["export", str(ee_run), "--out", str(tmp_path / "b.pt2"),
                                 "--input-shape", "4,1,28,28"])
    assert result.exit_code == 2 and "per-sample program of an early-exit model takes one " \
        "sample" in result.output, result.output
    assert not (tmp_path / "a.pt2").exists() and not (tmp_path / "b.pt2").exists()
