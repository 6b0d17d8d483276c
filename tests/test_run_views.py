"""Runs you can see and extend: curves.png, the runs table, plot, TensorBoard, --import,
--place."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_helpers import run_ok as invoke
from typer.testing import CliRunner

from funcgraph.cli import app

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SINE = ["meta-train", "--dataset", "sinusoid", "--meta-batch", "2", "--episodes", "2",
        "--val-episodes", "2", "--validate-every", "2", "--device", "cpu"]


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished, an interrupted and a failed run under one folder."""
    root = tmp_path_factory.mktemp("runs")
    invoke(*SINE, "--steps", "4", "--out", str(root / "finished"))
    invoke(*SINE, "--steps", "6", "--seed", "1", "--out", str(root / "interrupted"))
    # Cut the second run back to a mid-run state: its last checkpoint, no final record.
    metrics = root / "interrupted" / "metrics.jsonl"
    kept = [ln for ln in metrics.read_text().splitlines() if json.loads(ln)["kind"] != "test"]
    metrics.write_text("\n".join(kept) + "\n")
    result = CliRunner().invoke(app, [*SINE, "--steps", "40", "--meta-lr", "1e30",
                                      "--inner-lr", "1e30", "--out", str(root / "failed")])
    assert result.exit_code == 2 and "diverged" in result.output, result.output
    return root


def test_every_run_writes_a_png_of_its_curves_that_follows_its_metrics(three_runs: Path) -> None:
    from funcgraph.runs.curves import write_curves

    png = three_runs / "finished" / "curves.png"
    first = png.read_bytes()
    assert first.startswith(PNG_MAGIC) and len(first) > 5000, "curves.png is not a PNG"
    metrics = three_runs / "finished" / "metrics.jsonl"
    records = [json.loads(ln) for ln in metrics.read_text().splitlines()]
    for r in records:
        if r["kind"] == "train":
            r["loss"] = r["loss"] * 10 + 5
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    write_curves(three_runs / "finished")
    assert png.read_bytes() != first, "curves.png did not change with the metrics"


def test_runs_lists_each_status_and_its_json_round_trips(three_runs: Path) -> None:
    out = invoke("runs", str(three_runs), "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert {n: r["status"] for n, r in rows.items()} == {
        "finished": "finished", "interrupted": "interrupted", "failed": "failed"}, rows
    finished = rows["finished"]
    assert finished["command"] == "meta-train" and finished["steps_done"] == 4 == finished[
        "steps_planned"], finished
    assert finished["metric"] == "mse" and finished["test"] is not None, finished
    assert json.loads(json.dumps(list(rows.values()))) == list(rows.values())
    table = invoke("runs", str(three_runs), "--sort", "status")
    assert "interrupted" in table and "finished" in table, table
    lines = table.splitlines()
    assert max(map(len, lines)) <= 80, "readable at 80 columns"
    names = [line.split()[0] for line in lines if line and not line.startswith(" ")]
    assert set(names) >= {"finished", "interrupted", "failed"}, lines  # names unbroken
    assert any(line.strip() == "meta-train maml (mlp) sinusoid 10shot" for line in lines), lines


def test_runs_says_in_use_while_a_process_holds_the_run(three_runs: Path) -> None:
    from funcgraph.runs.summaries import summarize
    from funcgraph.train import Run

    config = json.loads((three_runs / "finished" / "config.json").read_text())
    with Run.create(three_runs / "finished", config, resume=True):
        assert summarize(three_runs / "finished").status == "in use"
    assert summarize(three_runs / "finished").status == "finished"


def test_plot_overlays_runs(three_runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "both.png"
    invoke("plot", str(three_runs / "finished"), str(three_runs / "interrupted"),
           "--metric", "loss", "--out", str(out))
    assert out.read_bytes().startswith(PNG_MAGIC), "plot wrote no PNG"
    result = CliRunner().invoke(app, ["plot", str(three_runs / "finished"), "--metric", "nope",
                                      "--out", str(tmp_path / "x.png")])
    assert result.exit_code == 2 and "none of the runs logged it" in result.output


def test_tensorboard_events_carry_the_logged_scalars(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    invoke(*SINE, "--steps", "4", "--tensorboard", "--out", str(tmp_path / "run"))
    events = EventAccumulator(str(tmp_path / "run" / "events"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "validation/mse", "test/mse"} <= tags, tags


def test_tensorboard_without_the_package_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    result = CliRunner().invoke(app, [*SINE, "--steps", "1", "--tensorboard"])
    assert result.exit_code == 2 and "pip install tensorboard" in result.output, result.output


PLUGIN = """
from funcgraph import nn
from funcgraph.factory import register_layer

@register_layer("scaled_tanh_mlp")
def scaled_tanh_mlp(in_features: int, out_features: int, scale: float = 2.0):
    return nn.serial(nn.flatten(), nn.linear(in_features, out_features), nn.tanh())
"""


def test_import_registers_a_plugin_layer_for_model_check_and_train(tmp_path: Path) -> None:
    (tmp_path / "my_layers.py").write_text(textwrap.dedent(PLUGIN))
    config = tmp_path / "net.json"
    config.write_text(json.dumps({"input_shape": [1, 1, 8, 8], "layers": [
        {"type": "scaled_tanh_mlp", "params": {"in_features": 64, "out_features": 4}}]}))
    env = {"PYTHONPATH": str(tmp_path)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        import os

        return subprocess.run([sys.executable, "-m", "funcgraph", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, **env})

    missing = cli("model", "check", str(config))
    assert missing.returncode == 2 and "--import" in missing.stderr, missing.stderr
    checked = cli("model", "check", str(config), "--import", "my_layers")
    assert checked.returncode == 0 and "scaled_tanh_mlp" in checked.stdout, checked.stderr
    trained = cli("train", "--model", str(config), "--import", "my_layers", "--steps", "2",
                  "--set", "data.classes=4", "--set", "data.image_size=8", "--device", "cpu",
                  "--out", str(tmp_path / "run"))
    assert trained.returncode == 0, trained.stderr
    assert "validation after 2 steps" in trained.stdout, trained.stdout


def test_a_cpu_placement_plan_trains_exactly_like_no_plan(tmp_path: Path) -> None:
    import torch

    from funcgraph.train import Run

    base = ["train", "--model", "early-exit", "--steps", "2", "--set", "data.classes=4",
            "--set", "data.image_size=8", "--set", "width=4", "--device", "cpu"]
    invoke(*base, "--out", str(tmp_path / "plain"))
    invoke(*base, "--place", "block1=cpu,*=cpu", "--out", str(tmp_path / "placed"))
    plain, _ = Run.open(tmp_path / "plain").load("last")
    placed, _ = Run.open(tmp_path / "placed").load("last")
    for n, t in plain["params"].items():
        assert torch.equal(t, placed["params"][n]), f"{n} differs under a CPU placement plan"
    result = CliRunner().invoke(app, [*base, "--place", "nosuch=cpu", "--out",
                                      str(tmp_path / "bad")])
    assert result.exit_code == 2 and "matches no parameter" in result.output, result.output
    assert not (tmp_path / "bad").exists(), "a bad plan left a run directory"
