"""torch.export artifacts: round trip in a process without funcgraph, cond branches, dynamic
batch, clear errors, and the ``funcgraph export RUN_DIR`` command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

import funcgraph
from funcgraph import nn as fnn
from funcgraph import random
from funcgraph.cli import app
from funcgraph.control import cond
from funcgraph.errors import ExportError
from funcgraph.export import (
    InputSpec,
    export,
    export_onnx,
    load,
    onnx_available,
    read_metadata,
)
from funcgraph.runs import resolve_model
from funcgraph.train.run_dir import Run


def convnet() -> funcgraph.Model:
    return fnn.serial({
        "conv": fnn.conv2d(1, 3, 3, padding=1), "bn": fnn.batch_norm(3), "act": fnn.relu(),
        "pool": fnn.adaptive_avg_pool2d(1), "flat": fnn.flatten(), "fc": fnn.linear(3, 2),
    })


def branchy() -> funcgraph.Model:
    """``fc`` (no bias), then ``2 * head(h)`` if ``sum(h) > 0`` else ``tanh(h) - 1``.

    The branch reads the head's params directly: calling ``run("head", h)`` inside a branch
    records the call in the Children handle, a side effect ``torch.cond`` refuses to export.
    """

    def forward(run: fnn.Children, x: torch.Tensor) -> torch.Tensor:
        h = run("fc", x)
        w, b = run.params["head.weight"], run.params["head.bias"]
        return cond(h.sum() > 0, lambda h: F.linear(h, w, b) * 2, lambda h: h[:, :2].tanh() - 1,
                    h)

    def own_init(key: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        head, _ = fnn.linear(4, 2).init(key)
        return {f"head.{n}": t for n, t in head.items()}, {}

    return fnn.composite("branchy", {"fc": fnn.linear(3, 4, bias=False)}, forward,
                         own_init=own_init)


LOADER = textwrap.dedent("""
    import sys
    import torch
    cases = torch.load(sys.argv[1])
    for case in cases:
        program = torch.export.load(case["path"])
        graph_ops = {str(n.target) for n in program.graph.nodes}
        if case["cond"] and not any("cond" in op for op in graph_ops):
            raise SystemExit(f"no cond in {case['path']}: {sorted(graph_ops)}")
        module = program.module()
        for x, want in zip(case["inputs"], case["outputs"]):
            got = module(x)
            if not torch.allclose(got, want, atol=1e-6):
                raise SystemExit(f"{case['path']} batch {x.shape[0]}: {got} != {want}")
        try:  # the dtype check the program carries, without funcgraph
            module(case["inputs"][0].double())
        except RuntimeError as e:
            if "dtype mismatch" not in str(e):
                raise SystemExit(f"{case['path']}: float64 input: {e}")
        else:
            raise SystemExit(f"{case['path']}: a float64 input ran")
    assert "funcgraph" not in sys.modules, "the loader imported funcgraph"
    print("checked", sum(len(c["inputs"]) for c in cases), "inputs")
""")


def test_artifacts_round_trip_in_a_process_without_funcgraph(tmp_path: Path) -> None:
    cases = []
    conv = convnet()
    params, state = conv.init(random.key(0))
    state = {n: t + 0.25 if t.is_floating_point() else t for n, t in state.items()}  # non-trivial
    xs = [random.normal(random.key(i), (b, 1, 5, 5)) for i, b in ((1, 3), (2, 5))]
    export(conv, params, state, xs[0], path=tmp_path / "conv.pt2")
    cases.append({"path": str(tmp_path / "conv.pt2"), "cond": False, "inputs": xs,
                  "outputs": [conv.apply(params, state, x)[0] for x in xs]})

    model = branchy()
    params, state = model.init(random.key(3))
    x = random.normal(random.key(4), (2, 3))
    inputs = [x, -x, torch.cat([x, x]), -torch.cat([x, x])]  # both branches, two batch sizes
    took = {bool((v @ params["fc.weight"].T).sum() > 0) for v in inputs}
    assert took == {False, True}, "the inputs must reach both branches"
    # the branch reads a batch-wide sum: batch-dependent by design, exported as it is
    export(model, params, state, x, path=tmp_path / "cond.pt2", batch_dependent=True)
    cases.append({"path": str(tmp_path / "cond.pt2"), "cond": True, "inputs": inputs,
                  "outputs": [model.apply(params, state, v)[0] for v in inputs]})

    torch.save(cases, tmp_path / "cases.pt")
    done = subprocess.run([sys.executable, "-c", LOADER, str(tmp_path / "cases.pt")],
                          capture_output=True, text=True, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "checked 6 inputs" in done.stdout


def test_program_carries_the_funcgraph_names_and_metadata(tmp_path: Path) -> None:
    model = convnet()
    params, state = model.init(random.key(0))
    program = export(model, params, state, random.normal(random.key(1), (1, 1, 4, 4)),
                     path=tmp_path / "m.pt2")
    assert set(program.state_dict) == set(params) | set(state)
    assert all(torch.equal(program.state_dict[n], t) for n, t in params.items())
    meta = read_metadata(tmp_path / "m.pt2")
    assert meta["model"] == "serial" and meta["dynamic_batch"] is True
    assert meta["input_shapes"] == [[2, 1, 4, 4]], "a batch of 1 is traced as 2"
    assert meta["inputs"] == [{"shape": [None, 1, 4, 4], "dtype": "float32"}], meta["inputs"]
    y = program.module()(random.normal(random.key(2), (7, 1, 4, 4)))
    assert y.shape == (7, 2)


def test_static_batch_is_static() -> None:
    model = convnet()
    params, state = model.init(random.key(0))
    program = export(model, params, state, torch.ones(3, 1, 4, 4), dynamic_batch=False)
    assert program.module()(torch.ones(3, 1, 4, 4)).shape == (3, 2)
    with pytest.raises(Exception, match="3"):
        program.module()(torch.ones(4, 1, 4, 4))


def test_python_if_on_a_tensor_is_a_clear_export_error() -> None:
    def forward(run: fnn.Children, x: torch.Tensor) -> torch.Tensor:
        h = run("fc", x)
        return h * 2 if h.sum() > 0 else h

    model = fnn.composite("pyif", {"fc": fnn.linear(3, 2)}, forward)
    params, state = model.init(random.key(0))
    with pytest.raises(ExportError, match="pyif.*torch.cond"):
        export(model, params, state, torch.ones(2, 3))


def test_bad_inputs_are_export_errors() -> None:
    model = convnet()
    params, state = model.init(random.key(0))
    with pytest.raises(ExportError, match="example_inputs"):
        export(model, params, state, [])
    with pytest.raises(ExportError, match="scalar"):
        export(model, params, state, torch.tensor(1.0))


def test_load_checks_inputs_with_readable_errors(tmp_path: Path) -> None:
    model = convnet()
    params, state = model.init(random.key(0))
    path = tmp_path / "m.pt2"
    export(model, params, state, torch.ones(2, 1, 4, 4), path=path)
    checked = load(path)
    assert checked.inputs == (InputSpec((None, 1, 4, 4), torch.float32),), checked.inputs
    x = random.normal(random.key(1), (3, 1, 4, 4))
    torch.testing.assert_close(checked(x), model.apply(params, state, x)[0],
                               msg="the checked module runs the program")
    bad = [
        (torch.ones(1, 4, 4), "expected 4 dims, got 3 (shape (1, 4, 4))"),
        (torch.ones(3, 2, 4, 4), "dim 1 must be 1, got 2 (shape (3, 2, 4, 4))"),
        (torch.ones(3, 1, 4, 5), "dim 3 must be 4, got 5 (shape (3, 1, 4, 5))"),
        (x.double(), "expected dtype float32, got float64 (convert with x.to(torch.float32))"),
        ([1.0], "expected a tensor, got list"),
    ]
    for value, needle in bad:
        with pytest.raises(ExportError) as info:
            checked(value)
        message = str(info.value)
        assert message == f"{path}: input 0 (batch, 1, 4, 4) float32: {needle}", message
    too_many = "expected 1 input(s) [(batch, 1, 4, 4) float32], got 2"
    with pytest.raises(ExportError, match=re.escape(too_many)):
        checked(x, x)
    plain = torch.export.load(str(path)).module()
    with pytest.raises(RuntimeError, match="Tensor dtype mismatch"):
        plain(x.double())
    export(model, params, state, torch.ones(3, 1, 4, 4), dynamic_batch=False, path=path)
    with pytest.raises(ExportError, match=r"input 0 \(3, 1, 4, 4\) float32: dim 0 must be 3"):
        load(path)(torch.ones(4, 1, 4, 4))


def test_load_of_a_missing_or_foreign_file_is_an_export_error(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="no such exported model file"):
        load(tmp_path / "missing.pt2")
    (tmp_path / "junk.pt2").write_bytes(b"not a zip archive")
    with pytest.raises(ExportError, match="junk.pt2: not a saved torch.export program"):
        load(tmp_path / "junk.pt2")
    with pytest.raises(ExportError, match="not a saved torch.export program"):
        read_metadata(tmp_path / "junk.pt2")


@pytest.mark.parametrize("missing", ["onnx", "onnxscript"])
def test_onnx_without_onnx_says_what_to_install(tmp_path: Path, missing: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Either package missing (simulated: a ``None`` entry in ``sys.modules`` makes it
    unimportable) is named with the install command, and nothing is written."""
    import sys

    monkeypatch.setitem(sys.modules, missing, None)
    assert not onnx_available()
    model = convnet()
    params, state = model.init(random.key(0))
    with pytest.raises(ExportError, match=r"ONNX export needs the onnx and onnxscript packages.*"
                                          r"pip install"):
        export_onnx(model, params, state, torch.ones(2, 1, 4, 4), tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not onnx_available(), reason="onnx/onnxscript not installed")
def test_onnx_export_writes_a_model(tmp_path: Path) -> None:  # pragma: no cover - optional
    model = convnet()
    params, state = model.init(random.key(0))
    out = export_onnx(model, params, state, torch.ones(2, 1, 4, 4), tmp_path / "m.onnx")
    assert out.exists() and out.stat().st_size > 0


def make_run(tmp_path: Path, config: dict) -> tuple[Path, funcgraph.Model, dict, dict]:
    model = resolve_model(config["model"])
    params, state = model.init(random.key(0))
    run = Run.create(tmp_path / "run", config)
    run.save("last", {"params": params, "state": state}, {"step": 3})
    return run.path, model, params, state


def test_export_command_rebuilds_the_run_model(tmp_path: Path) -> None:
    config = {"model": {"name": "mlp", "in_features": 2, "out_features": 3, "hidden": [5]},
              "input_shape": [1, 2]}
    run_dir, model, params, state = make_run(tmp_path, config)
    out = tmp_path / "model.pt2"
    result = CliRunner().invoke(app, ["export", str(run_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "max |reloaded - eager| = 0.00e+00" in result.output, result.output
    x = random.normal(random.key(9), (6, 2))
    torch.testing.assert_close(torch.export.load(str(out)).module()(x),
                               model.apply(params, state, x)[0])


def test_export_command_user_errors_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["export", str(tmp_path), "--out", str(tmp_path / "m.pt2")])
    assert result.exit_code == 2 and "not a run directory" in result.output
    # conv4 recorded without its image size: nothing says what input it takes.
    config = {"model": {"name": "conv4", "ways": 2, "in_channels": 1, "hidden": 4}}
    run_dir, *_ = make_run(tmp_path, config)
    result = runner.invoke(app, ["export", str(run_dir), "--out", str(tmp_path / "m.pt2")])
    assert result.exit_code == 2 and "--input-shape" in result.output, result.output
    result = runner.invoke(app, ["export", str(run_dir), "--checkpoint", "best",
                                 "--input-shape", "1,1,28,28"])
    assert result.exit_code == 2 and "best" in result.output, result.output


@pytest.mark.parametrize(("names", "message"), [
    (["forward"], "not usable in an nn.Module"),
    (["a.b", "a"], "used twice or also names a scope"),
    (["a", "a.b"], "nests under the tensor 'a'"),
    (["a..b"], "empty dotted component"),
])
def test_tensor_names_that_cannot_be_module_attributes(names: list[str], message: str) -> None:
    from funcgraph.export import ExportWrapper

    with pytest.raises(ExportError, match=message):
        ExportWrapper(convnet(), {n: torch.ones(1) for n in names}, {})


def test_export_command_refuses_a_checkpoint_of_another_model(tmp_path: Path) -> None:
    config = {"model": {"name": "mlp", "in_features": 2, "hidden": [3]}, "input_shape": [1, 2]}
    run_dir, *_ = make_run(tmp_path, config)
    other = {"model": {"name": "mlp", "in_features": 2, "hidden": [4]}, "input_shape": [1, 2]}
    (run_dir / "config.json").write_text(json.dumps(other))
    result = CliRunner().invoke(app, ["export", str(run_dir), "--out", str(tmp_path / "m.pt2")])
    assert result.exit_code == 2 and "does not match the model" in result.output, result.output
