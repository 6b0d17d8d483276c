"""Supervised step/eval against torch.optim, and ``funcgraph train`` end to end on tiny data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor
from typer.testing import CliRunner

from funcgraph import nn, random
from funcgraph.cli import app
from funcgraph.runs import train as train_run
from funcgraph.train import adam
from funcgraph.train import supervised as sup
from funcgraph.train.supervised import (
    batches,
    class_split,
    classification_loss,
    evaluate_batches,
    train_step,
)

runner = CliRunner()


def test_train_step_equals_torch_optim_adam() -> None:
    model = nn.linear(3, 4)
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (5, 3))
    y = torch.tensor([0, 1, 2, 3, 0])
    step = train_step(model, adam(0.1))
    opt_state = adam(0.1).init(params)
    module = torch.nn.Linear(3, 4)
    module.load_state_dict(params)
    reference = torch.optim.Adam(module.parameters(), lr=0.1)
    for _ in range(3):
        params, state, opt_state, metrics = step(params, state, opt_state, (x, y), random.key(2))
        reference.zero_grad()
        loss = torch.nn.functional.cross_entropy(module(x), y)
        loss.backward()
        reference.step()
        assert metrics["loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    for n, t in module.state_dict().items():
        torch.testing.assert_close(params[n], t, msg=f"{n} after 3 Adam steps")


def test_evaluate_weights_batches_by_size_and_class_split() -> None:
    images = torch.arange(5 * 4 * 4, dtype=torch.float32).reshape(5, 4, 1, 2, 2)
    train, val = class_split(images, num_classes=3, val_per_class=1)
    assert train[0].shape == (9, 1, 2, 2) and val[0].shape == (3, 1, 2, 2)
    assert train[1].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and val[1].tolist() == [0, 1, 2]
    torch.testing.assert_close(val[0][1], images[1, 3])
    model = nn.serial(nn.flatten(), nn.linear(4, 3))
    params, state = model.init(random.key(0))
    whole = evaluate_batches(model, params, state, [train])
    parts = evaluate_batches(model, params, state, batches(train, 4))
    assert whole == pytest.approx(parts)
    logits, _ = model.apply(params, state, train[0])
    assert whole["loss"] == pytest.approx(float(classification_loss(logits, train[1])[0]))


def _placeholder_glyphs(split: str, classes: int, val_per_class: int,
                        image_size: int) -> tuple[sup.Batch, sup.Batch]:
    """Test-only stand-in for the glyph set: class c is noise around brightness c / classes."""
    noise = random.uniform(random.key(7), (classes, 6, 1, image_size, image_size))
    images = 0.3 * noise + torch.arange(classes).reshape(-1, 1, 1, 1, 1) / classes
    return class_split(images, num_classes=classes, val_per_class=val_per_class)


@pytest.fixture
def tiny_glyphs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train_run, "glyph_classes", _placeholder_glyphs)


TINY_RESNET = ["--set", "depth=8", "--set", "width=4", "--set", "data.classes=4",
               "--set", "data.image_size=8", "--device", "cpu"]


def _train(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["train", *args])
    return result.exit_code, result.output


def _params(out: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    files = sorted((out / "checkpoints").glob("last*.safetensors"))
    assert files, f"no last checkpoint in {out}"
    return load_file(str(files[0]))


def test_train_resnet_sd_writes_a_run_survives_ctrl_c_and_resumes_bit_identically(
        tiny_glyphs: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, output = _train("--steps", "4", "--out", str(tmp_path / "full"), *TINY_RESNET)
    assert code == 0, output
    assert "validation after 4 steps" in output
    records = [json.loads(line) for line in (tmp_path / "full/metrics.jsonl").read_text()
               .splitlines()]
    assert any(r["kind"] == "validation" and "accuracy" in r for r in records)
    assert all("blocks_ran" in r for r in records if r["kind"] == "train")
    val = [r["loss"] for r in records if r["kind"] == "validation"]
    assert len(val) == 4 and val[-1] < val[0], f"validation loss did not decrease: {val}"
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in records), records
    assert records[-1]["kind"] == "final" and records[-1]["loss"] == val[-1], records[-1]
    last_val = [r for r in records if r["kind"] == "validation"][-1]
    assert records[-1]["accuracy"] == last_val["accuracy"], "final record = last validation"
    config = json.loads((tmp_path / "full/config.json").read_text())
    assert config["model"]["name"] == "resnet" and config["model"]["num_classes"] == 4
    # Ctrl-C during step 3 of 4, then --resume: the same tensors as the uninterrupted run.
    real = train_run.train_step

    def interrupted_after_two(*args: Any, **kwargs: Any) -> Any:
        step = real(*args, **kwargs)
        done: list[int] = []

        def wrapped(*a: Any, **k: Any) -> Any:
            if len(done) == 2:
                raise KeyboardInterrupt
            done.append(1)
            return step(*a, **k)

        return wrapped

    part = str(tmp_path / "part")
    monkeypatch.setattr(train_run, "train_step", interrupted_after_two)
    code, output = _train("--steps", "4", "--out", part, *TINY_RESNET)
    assert code == 130, output
    monkeypatch.setattr(train_run, "train_step", real)
    # --resume alone continues with the run's recorded options, not the command's defaults
    code, output = _train("--resume", "--out", part, "--device", "cpu")
    assert code == 0 and "differ" not in output, output
    full, resumed = _params(tmp_path / "full"), _params(Path(part))
    assert full.keys() == resumed.keys()
    for n in full:
        assert torch.equal(full[n], resumed[n]), f"{n} differs after resume"
    code, output = _train("--steps", "4", "--out", part, "--resume", *TINY_RESNET)
    assert code == 0, f"the run's own options, repeated, are its own:\n{output}"
    code, output = _train("--resume", "--out", part, "--lr", "0.5")
    assert code == 2 and f"options differ from the run in {part}: lr: 0.002 -> 0.5\n" in (
        output), output


def test_train_rnn_and_early_exit(tiny_glyphs: None, tmp_path: Path) -> None:
    code, output = _train("--model", "rnn", "--steps", "3", "--out", str(tmp_path / "rnn"),
                          "--set", "hidden_size=8", "--set", "embed_dim=4",
                          "--set", "data.max_length=5", "--set", "data.val_size=16",
                          "--device", "cpu")
    assert code == 0, output
    code, output = _train("--model", "early-exit", "--steps", "3", "--out",
                          str(tmp_path / "ee"), "--set", "width=4", "--set", "data.classes=4",
                          "--set", "data.image_size=8", "--device", "cpu")
    assert code == 0, output
    assert "exit_rate" in output
    for run in ("rnn", "ee"):
        records = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text()
                   .splitlines()]
        val = [r["loss"] for r in records if r["kind"] == "validation"]
        assert len(val) == 3 and val[-1] < val[0], f"{run}: validation loss rose: {val}"
        assert all(0.0 <= r["accuracy"] <= 1.0 for r in records), f"{run}: {records}"
        assert records[-1]["kind"] == "final", f"{run}: last record {records[-1]}"
        last_val = [r for r in records if r["kind"] == "validation"][-1]
        assert records[-1]["accuracy"] == last_val["accuracy"], f"{run}: final != validation"
        if run == "rnn":  # 16 validation sequences: the accuracy counts them
            correct = records[-1]["accuracy"] * 16
            assert abs(correct - round(correct)) < 1e-6, records[-1]
    ee = [r for r in records if r["kind"] == "train"]
    assert ee and all(0.0 <= r["exit_rate"] <= 1.0 for r in ee), f"early exit: {ee}"


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "depth=21"], "6n + 2"),
    (["--set", "data.colour=1"], "data.colour"),
    (["--model", "no-such-model"], "no-such-model"),
    (["--resume"], "--resume"),
    (["--genotype", "missing.json"], "genotype"),
    (["--set", "nonsense"], "KEY=VALUE"),
    (["--model", "mlp"], "cannot run on the glyphs inputs"),
])
def test_train_user_errors_exit_2_in_one_line(tiny_glyphs: None, tmp_path: Path,
                                              args: list[str], message: str) -> None:
    code, output = _train("--steps", "1", "--out", str(tmp_path / "r"), "--device", "cpu", *args)
    assert code == 2, output
    assert message in output and "Traceback" not in output


def test_train_genotype_hook(tiny_glyphs: None, tmp_path: Path) -> None:
    from funcgraph import nas
    path = tmp_path / "genotype.json"
    nas.random_genotype(random.key(0)).save(path)
    code, output = _train("--genotype", str(path), "--steps", "2", "--out", str(tmp_path / "g"),
                          "--set", "C=4", "--set", "layers=2", "--set", "data.classes=4",
                          "--set", "data.image_size=8", "--device", "cpu")
    assert code == 0, output
    config = json.loads((tmp_path / "g" / "config.json").read_text())
    assert config["model"]["genotype"] == str(path), config["model"]
    records = [json.loads(line) for line in (tmp_path / "g" / "metrics.jsonl").read_text()
               .splitlines()]
    final, last_val = records[-1], [r for r in records if r["kind"] == "validation"][-1]
    assert final["kind"] == "final" and final["step"] == 2, final
    assert 0.0 <= final["accuracy"] <= 1.0 and final["loss"] == last_val["loss"], records
    assert final["accuracy"] == last_val["accuracy"], records
