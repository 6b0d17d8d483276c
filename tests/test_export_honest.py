"""Export says what it wrote: a model whose outputs depend on the batch is refused unless
asked for, an artifact that claims per-sample outputs has them, errors are one line (torch's
report goes to a file the line names), ``--out`` a directory is refused, and the ONNX side
file is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_helpers import invoke

from funcgraph import nn as fnn
from funcgraph import random
from funcgraph.errors import ExportError
from funcgraph.export import batch_coupling, export, read_metadata
from funcgraph.models import conv4
from funcgraph.runs.export import FAILURE_FILE
from funcgraph.runs.resolve import resolve_model
from funcgraph.train import Run


def running_stats_net() -> fnn.Model:
    return fnn.serial({
        "conv": fnn.conv2d(1, 3, 3, padding=1), "bn": fnn.batch_norm(3), "act": fnn.relu(),
        "pool": fnn.adaptive_avg_pool2d(1), "flat": fnn.flatten(), "fc": fnn.linear(3, 2),
    })


def error_line(output: str) -> str:
    lines = [ln for ln in output.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, output
    return lines[0]


def make_run(tmp_path: Path, model_spec: dict, input_shape: list[int]) -> Path:
    model = resolve_model(model_spec)
    params, state = model.init(random.key(0))
    with Run.create(tmp_path / "run", {"model": model_spec, "input_shape": input_shape}) as run:
        run.save("last", {"params": params, "state": state}, {"step": 1})
    return run.path


def test_a_batch_statistics_model_is_refused_and_exported_only_when_asked(tmp_path: Path
                                                                           ) -> None:
    model = conv4(5, hidden=8, image_size=8)  # meta-learning's conv4: batch statistics
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (2, 1, 8, 8))
    assert batch_coupling(model, params, state, (x,)) is not None
    with pytest.raises(ExportError, match=r"export of 'conv4': its outputs depend on the batch "
                                          r"\(a sample alone and beside another differ by up "
                                          r"to .*running statistics.*batch_dependent=True"):
        export(model, params, state, x, path=tmp_path / "m.pt2")
    assert not (tmp_path / "m.pt2").exists()
    export(model, params, state, x, path=tmp_path / "m.pt2", batch_dependent=True)
    assert read_metadata(tmp_path / "m.pt2")["per_sample"] is False


def test_an_artifact_that_claims_per_sample_outputs_has_them(tmp_path: Path) -> None:
    model = running_stats_net()
    params, state = model.init(random.key(0))
    _, state = model.apply(params, state, random.normal(random.key(5), (8, 1, 6, 6)),
                           train=True)  # running statistics that are not 0 / 1
    export(model, params, state, random.normal(random.key(1), (2, 1, 6, 6)),
           path=tmp_path / "m.pt2")
    assert read_metadata(tmp_path / "m.pt2")["per_sample"] is True
    program = torch.export.load(str(tmp_path / "m.pt2")).module()  # plain torch
    batch = random.normal(random.key(2), (7, 1, 6, 6))
    together = program(batch)
    for i in range(7):
        torch.testing.assert_close(program(batch[i:i + 1]), together[i:i + 1], rtol=0,
                                   atol=1e-6, msg=f"sample {i}: alone vs in the batch")


def test_export_to_an_existing_directory_is_one_line(tmp_path: Path) -> None:
    run = make_run(tmp_path, {"name": "mlp", "in_features": 2, "out_features": 3,
                              "hidden": [4]}, [1, 2])
    target = tmp_path / "somewhere"
    target.mkdir()
    code, output = invoke("export", str(run), "--out", str(target))
    assert code == 2 and error_line(output) == (
        f"error: --out {target} is a directory; name the file to write, e.g. "
        f"{target / 'model.pt2'}"), output
    model = resolve_model({"name": "mlp", "in_features": 2, "out_features": 3, "hidden": [4]})
    params, state = model.init(random.key(0))
    with pytest.raises(ExportError, match="is a directory"):
        export(model, params, state, torch.ones(2, 2), path=target)


def test_the_cli_refuses_a_batch_dependent_run_and_says_how(tmp_path: Path) -> None:
    run = make_run(tmp_path, {"name": "conv4", "ways": None, "in_channels": 1, "hidden": 8,
                              "image_size": 8}, [1, 1, 8, 8])
    code, output = invoke("export", str(run), "--out", str(tmp_path / "m.pt2"))
    assert code == 2 and "--batch-dependent" in error_line(output), output
    code, output = invoke("export", str(run), "--out", str(tmp_path / "m.pt2"),
                          "--batch-dependent")
    assert code == 0 and "outputs depend on the batch" in output, output
    # ProtoNet exports its embedding network: [N, 64]-style features, not class logits
    features = torch.export.load(str(tmp_path / "m.pt2")).module()(torch.ones(3, 1, 8, 8))
    assert features.shape == (3, 8), features.shape


def test_a_failed_export_is_one_line_and_the_report_goes_to_a_named_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(tmp_path, {"name": "mlp", "in_features": 2, "out_features": 3,
                              "hidden": [4]}, [1, 2])
    report = "\n".join(["cannot trace this"] + [f"    graph line {i}" for i in range(47)])

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError(report)

    monkeypatch.setattr(torch.export, "export", fail)
    code, output = invoke("export", str(run), "--out", str(tmp_path / "m.pt2"))
    line = error_line(output)
    assert code == 2 and len(output.strip().splitlines()) == 1, output
    assert "export of 'mlp' failed: cannot trace this" in line, line
    assert f"torch's full report: {run / FAILURE_FILE}" in line, line
    assert "graph line 46" in (run / FAILURE_FILE).read_text()
    assert not (tmp_path / "m.pt2").exists()


def test_onnx_export_names_its_side_file(tmp_path: Path) -> None:
    run = make_run(tmp_path, {"name": "mlp", "in_features": 2, "out_features": 3,
                              "hidden": [4]}, [1, 2])
    onnx = tmp_path / "m.onnx"
    code, output = invoke("export", str(run), "--out", str(tmp_path / "m.pt2"), "--onnx",
                          str(onnx))
    assert code == 0, output
    assert (tmp_path / "m.onnx.data").exists()
    assert f"wrote ONNX to {onnx} with its weights in {onnx}.data" in output, output
    assert json.loads(json.dumps(read_metadata(tmp_path / "m.pt2")))["per_sample"] is True


META = ["meta-train", "--tasks", "3way1shot", "--steps", "1", "--meta-batch", "1",
        "--episodes", "1", "--val-episodes", "1", "--validate-every", "0", "--image-size", "8",
        "--set", "hidden=4", "--device", "cpu", "--threads", "1"]


@pytest.mark.parametrize("algo", ["maml", "fomaml", "metasgd", "anil", "mamlpp", "imaml",
                                  "reptile", "protonet"])
def test_every_algorithms_export_refusal_names_a_remedy_its_commands_accept(
        tmp_path: Path, algo: str) -> None:
    """The main job's model exports, or its refusal names a remedy that the same run's
    commands take: --batch-dependent, which then exports the meta-initialisation (MAML++:
    its first inner step's batch-norm weights) equal to the run's model."""
    run, model = tmp_path / "run", tmp_path / "m.pt2"
    code, output = invoke(*META, "--algo", algo, "--out", str(run))
    assert code == 0, output
    code, output = invoke("export", str(run), "--out", str(model))
    if code == 0:
        return
    line = error_line(output)
    assert f"as {algo} evaluates" in line and "--batch-dependent" in line, line
    assert "--bn-running-stats" not in line, "no retraining option gives a per-sample program"
    code, again = invoke("export", str(run), "--out", str(model), "--batch-dependent")
    assert code == 0, f"the remedy {line!r} fails: {again}"
