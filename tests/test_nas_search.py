"""run_search on synthetic tensors: outputs, resume bit-identical, collapse guard; CLI errors."""

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from search_checks import stopped_after_step_1_then_resumed, synthetic_data
from typer.testing import CliRunner

from funcgraph import random
from funcgraph.cli import app
from funcgraph.errors import CheckpointError, ConfigError, ShapeError
from funcgraph.nas import (
    BilevelConfig,
    Genotype,
    SearchConfig,
    arch_weights,
    derive_genotype,
)
from funcgraph.runs import run_search
from funcgraph.train import Run

CFG = SearchConfig(C=2, layers=3, epochs=2, batch_size=8, stop_skips=None, select="argmax")
DATA = synthetic_data(8)  # one step per epoch


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("search") / "whole"
    return path, run_search(path, DATA, CFG, show_progress=False)


def test_search_writes_genotype_history_heatmap_and_summary(whole: tuple[Path, Any]) -> None:
    run, result = whole
    assert Genotype.load(run / "genotype.json") == result.genotype
    history = [json.loads(line) for line in (run / "alpha_history.jsonl").read_text().splitlines()]
    assert [h["epoch"] for h in history] == [1, 2], "one record per epoch"
    for h in history:
        rows = torch.tensor(h["normal"])
        assert rows.shape == (14, 8)
        torch.testing.assert_close(rows.sum(-1), torch.ones(14), atol=1e-4, rtol=0)
        assert isinstance(h["skips_normal"], int)
    assert (run / "alphas.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((run / "search.json").read_text())
    assert summary["steps_done"] == 2 and not summary["stopped_early"], summary
    records = Run.open(run).metrics()
    kinds = {r["kind"] for r in records}
    assert {"train", "validation"} <= kinds, kinds
    # The genotype: two edges into each of the 4 nodes, from two distinct earlier nodes, and
    # it is the one derived from the final alphas in the last checkpoint (whose softmax is
    # the last history record).
    g = result.genotype
    for kind in ("normal", "reduce"):
        edges = getattr(g, kind)
        assert len(edges) == 8, f"{kind}: {len(edges)} edges, expected 2 per node x 4 nodes"
        for node in range(4):
            (_, a), (_, b) = edges[2 * node:2 * node + 2]
            assert a != b and 0 <= a < node + 2 and 0 <= b < node + 2, (
                f"{kind} node {node}: inputs {a}, {b} must be distinct earlier nodes")
        assert getattr(g, f"{kind}_concat") == (2, 3, 4, 5), f"{kind} concat"
    weights = arch_weights(Run.open(run).load("last")[0]["arch"])
    assert g == derive_genotype(weights, skip_cap=CFG.skip_cap), (
        "the written genotype is not the derivation of the final alphas")
    for kind in ("normal", "reduce"):
        torch.testing.assert_close(torch.tensor(history[-1][kind]), weights[kind], atol=1e-6,
                                   rtol=0, msg=f"last history record vs final {kind} alphas")
    assert 0.0 <= result.val_acc <= 1.0 and summary["val_acc"] == result.val_acc, summary
    correct = result.val_acc * len(DATA.val_y)  # a count of validation images, not a mean
    assert abs(correct - round(correct)) < 1e-9, f"val_acc {result.val_acc} of 8 images"
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses), losses


def test_resume_after_ctrl_c_is_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole: tuple[Path, Any]
) -> None:
    whole_path, whole_result = whole
    resumed = stopped_after_step_1_then_resumed(tmp_path / "split", DATA, CFG, monkeypatch)
    assert resumed.genotype == whole_result.genotype
    a = Run.open(whole_path).load("last")[0]
    b = Run.open(tmp_path / "split").load("last")[0]
    for group in ("weights", "arch", "state", "opt_w", "opt_a"):
        for n in a[group]:
            assert torch.equal(a[group][n], b[group][n]), f"{group}/{n} differs after resume"
    h1 = (whole_path / "alpha_history.jsonl").read_text().splitlines()
    h2 = (tmp_path / "split" / "alpha_history.jsonl").read_text().splitlines()
    assert h1 == h2, "the alpha history reads as if the run never stopped"


def test_collapse_guard_stops_early_and_resume_respects_it(tmp_path: Path) -> None:
    cfg = SearchConfig(**{**CFG.__dict__, "epochs": 3, "stop_skips": 0})
    result = run_search(tmp_path / "run", DATA, cfg, show_progress=False)
    assert result.stopped_early and result.steps_done == 1, "stops at the first epoch end"
    assert any(r["kind"] == "collapse_guard" for r in Run.open(tmp_path / "run").metrics())
    again = run_search(tmp_path / "run", DATA, cfg, resume=True, show_progress=False)
    assert again.stopped_early and again.steps_done == 1


def test_second_order_and_partial_channels_run(tmp_path: Path) -> None:
    cfg = SearchConfig(C=4, layers=3, steps=1, batch_size=8, partial_channels=2, skip_cap=1,
                       stop_skips=None, bilevel=BilevelConfig(order="second"), select="argmax")
    result = run_search(tmp_path / "run", DATA, cfg, show_progress=False)
    g = result.genotype
    assert g.skips("normal") <= 1 and g.skips("reduce") <= 1, f"skip_cap=1 exceeded: {g}"
    assert len(g.normal) == len(g.reduce) == 8, f"2 edges per node x 4 nodes: {g}"
    weights = arch_weights(Run.open(tmp_path / "run").load("last")[0]["arch"])
    assert g == derive_genotype(weights, skip_cap=1), "not derived from the final alphas"
    assert result.steps_done == 1 and 0.0 <= result.val_acc <= 1.0, result
    correct = result.val_acc * len(DATA.val_y)
    assert abs(correct - round(correct)) < 1e-9, f"val_acc {result.val_acc} of 8 images"


def test_user_mistakes_are_clear_errors(tmp_path: Path, whole: tuple[Path, Any]) -> None:
    with pytest.raises(ConfigError, match="already holds a run"):
        run_search(whole[0], DATA, CFG, show_progress=False)
    with pytest.raises(ConfigError, match="options differ"):
        run_search(whole[0], DATA, SearchConfig(**{**CFG.__dict__, "C": 4}), resume=True,
                   show_progress=False)
    with pytest.raises(CheckpointError, match="no run to resume"):
        run_search(tmp_path / "empty", synthetic_data(16), CFG, resume=True, show_progress=False)
    with pytest.raises(ConfigError, match="batch_size"):
        run_search(tmp_path / "b", synthetic_data(16), SearchConfig(batch_size=64),
                   show_progress=False)
    with pytest.raises(ShapeError, match="divisible by 4"):
        synthetic_data(16, size=6)


def test_cli_rejects_bad_options_in_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["search", "--partial-channels", "3", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "partial-channels" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["search", "--image-size", "18", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "multiple of 4" in r.output
    r = runner.invoke(app, ["search", "--order", "third"])
    assert r.exit_code == 2
    r = runner.invoke(app, ["search", "--help"])
    assert r.exit_code == 0 and "Example: funcgraph search" in r.output


def test_class_halves_takes_any_classification_dataset_and_the_search_its_channels() -> None:
    from funcgraph.runs import class_halves
    from funcgraph.runs.search_plan import plan_search

    data = class_halves("rgb-shapes", split="test", num_classes=3, image_size=8)
    assert data.train_x.shape == (90, 3, 8, 8) and data.val_x.shape == (90, 3, 8, 8)
    assert data.train_x.dtype == torch.float32 and 0 <= data.train_x.min() <= 1
    assert data.train_y.tolist() == [c for c in range(3) for _ in range(30)]
    assert not any(torch.equal(a, b) for a in data.train_x[:30] for b in data.val_x[:30]), \
        "train and validation halves hold different images of a class"
    assert data.name == "rgb-shapes/test:3x8px"
    plan = plan_search(data, CFG)
    params, _ = plan.model.init(random.key(0))
    assert plan.model.apply(params, _, data.val_x[:2])[0].shape == (2, 3)
    with pytest.raises(ConfigError, match=r"num_classes \(--classes\) must be in \[2, 20\] for "
                                          "rgb-shapes's test split, got 21"):
        class_halves("rgb-shapes", split="test", num_classes=21, image_size=8)
    with pytest.raises(ConfigError, match="'sinusoid' is regression"):
        class_halves("sinusoid")


def test_edge_order_strength_lists_the_same_cell_as_darts_code_does(
        tmp_path: Path, whole: tuple[Path, Any]) -> None:
    from dataclasses import replace

    from funcgraph.nas import derive_genotype

    _, by_input = whole
    result = run_search(tmp_path / "strength", DATA, replace(CFG, edge_order="strength"),
                        show_progress=False)
    history = [json.loads(line) for line in
               (tmp_path / "strength" / "alpha_history.jsonl").read_text().splitlines()]
    weights = {k: torch.tensor(history[-1][k]) for k in ("normal", "reduce")}
    assert result.genotype == derive_genotype(weights, edge_order="strength")
    for kind in ("normal", "reduce"):
        mine, theirs = getattr(by_input.genotype, kind), getattr(result.genotype, kind)
        assert [sorted(mine[i:i + 2]) for i in range(0, len(mine), 2)] == \
            [sorted(theirs[i:i + 2]) for i in range(0, len(theirs), 2)], "the same cell"
    with pytest.raises(ConfigError, match=r"edge_order \(--edge-order\) 'strength' lists the "
                                          "argmax derivation's edges"):
        SearchConfig(edge_order="strength", select="perturbation")
    with pytest.raises(ConfigError, match="edge_order .* must be one of"):
        SearchConfig(edge_order="weight")  # type: ignore[arg-type]
