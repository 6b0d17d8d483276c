"""``funcgraph graph``: formats, config files, --seed paths with stochastic depth, user errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from funcgraph.cli import app

runner = CliRunner()
RESNET = ["--model", "resnet", "--set", "depth=8", "--set", "width=4", "--set", "num_classes=3",
          "--input-shape", "1,3,8,8"]


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["graph", *args])
    return result.exit_code, result.output


def test_registered_model_as_dot_with_blocks() -> None:
    code, out = invoke("--model", "mlp", "--set", "hidden=[3]", "--input-shape", "2,1",
                       "--format", "dot")
    assert code == 0, out
    assert out.startswith("digraph funcgraph {") and 'label="layers.0";' in out
    assert out.count("addmm") == 2 and "n0 -> n1;" in out


def test_config_file_supplies_the_input_shape(tmp_path: Path) -> None:
    config = {"name": "tiny", "input_shape": [1, 3],
              "layers": [{"type": "linear", "params": {"out_features": 4}}, "relu",
                         {"type": "linear", "name": "head", "params": {"out_features": 2}}]}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(config))
    code, out = invoke("--model", str(path))
    assert code == 0, out
    assert "#0 input [1x3]" in out and "head:" in out and "addmm [1x2]" in out


def test_seed_shows_which_stochastic_depth_path_ran() -> None:
    train = {invoke(*RESNET, "--train", "--seed", str(s), "--depth", "2")[1] for s in range(4)}
    assert len(train) > 1, "different seeds should drop different blocks in train mode"
    evals = {invoke(*RESNET, "--seed", str(s), "--depth", "2")[1] for s in range(2)}
    assert len(evals) == 1, "evaluation runs every block whatever the seed"
    full = next(iter(evals))
    assert all(f"layer{i}.0 (" in full for i in (1, 2, 3)), full


def test_out_writes_the_file(tmp_path: Path) -> None:
    out_file = tmp_path / "g" / "graph.mmd"
    code, out = invoke("--model", "mlp", "--input-shape", "1,1", "--format", "mermaid",
                       "--out", str(out_file))
    assert code == 0 and "wrote mermaid graph" in out, out
    assert out_file.read_text().startswith("flowchart TD")


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "mlp", "--input-shape", "2,x"], "--input-shape: expected positive ints"),
    (["--model", "mlp", "--input-shape", "2,3"], "failed on input shape [2, 3]"),
    (["--model", "no_such_model", "--input-shape", "2,3"], "no_such_model"),
    (["--model", "mlp", "--input-shape", "2,1", "--device", "tpu"], "device: expected"),
    (["--model", "mlp", "--input-shape", "1,1", "--set", "hidden"], "KEY=VALUE"),
])
def test_user_errors_exit_2_with_one_line(args: list[str], message: str) -> None:
    code, out = invoke(*args)
    assert code == 2, out
    assert message in out and "Traceback" not in out, out


@pytest.mark.skipif(shutil.which("dot") is not None, reason="Graphviz is installed")
def test_svg_without_graphviz_is_a_clear_error() -> None:
    code, out = invoke("--model", "mlp", "--input-shape", "1,1", "--format", "svg")
    assert code == 2 and "Graphviz" in out, out
