"""Every size a user controls is checked from shapes before anything is allocated: a run too
big for the free memory is one line with the estimate and the free memory, exit 2.

The free memory is fixed (``available_bytes`` patched) where a verdict depends on it, so the
tests mean the same on any machine; the extreme sizes are refused on every machine. A
resource limit on the address space (where the platform has one) proves that nothing big is
allocated on the way to the refusal."""

from __future__ import annotations

import json
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from funcgraph.cli import app
from funcgraph.errors import ConfigError
from funcgraph.factory import build
from funcgraph.factory.config import MAX_LAYERS
from funcgraph.runs import memory

GIB = 2**30


@pytest.fixture
def little_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device with 256 MiB free, whatever this one has."""
    monkeypatch.setattr(memory, "available_bytes", lambda device: GIB // 4)


@pytest.fixture(autouse=True)
def bounded_address_space() -> Iterator[None]:
    """Cap the address space 6 GiB above what the process already maps: an allocation of
    the sizes refused here would fail with torch's error instead of passing unnoticed."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, AttributeError):
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (mapped + 6 * GIB, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def refused(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [ln for ln in result.output.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, result.output
    line = lines[0]
    assert "this run needs about" in line and "is free" in line, line
    return line


def wide_config(tmp_path: Path, hidden: int) -> str:
    path = tmp_path / "wide.json"
    path.write_text(json.dumps({
        "name": "wide", "input_shape": [1, 1, 28, 28],
        "layers": ["flatten", {"type": "linear", "params": {"out_features": hidden}},
                   {"type": "linear", "params": {"out_features": 100}}]}))
    return str(path)


def test_a_meta_batch_of_task_data_beyond_the_free_memory_is_refused(little_memory: None
                                                                     ) -> None:
    line = refused("meta-train", "--tasks", "5way1shot", "--meta-batch", "100000", "--steps",
                   "1", "--dry-run", "--device", "cpu")
    assert "GiB of data" in line and "256.0 MiB is free" in line, line
    assert "lower --meta-batch" in line, line


def test_a_hundred_million_shot_sinusoid_task_is_refused_before_it_is_sampled() -> None:
    line = refused("meta-train", "--dataset", "sinusoid", "--tasks", "100000000shot",
                   "--steps", "1", "--dry-run", "--device", "cpu")
    # refused on the data alone where that exceeds the free memory, else with activations
    assert "GiB of data, before activations" in line or (
        "200,000,000 examples of one task" in line and "TiB" in line), line


def test_a_long_sequence_is_refused_from_its_scaled_estimate() -> None:
    line = refused("train", "--model", "rnn", "--set", "data.max_length=100000", "--steps", "1",
                   "--dry-run", "--device", "cpu")
    assert "192 example forwards" in line and "TiB" in line, line


def test_a_wide_model_is_refused_before_its_params_exist(tmp_path: Path) -> None:
    config = wide_config(tmp_path, 10**8)
    line = refused("train", "--model", config, "--steps", "1", "--dry-run", "--device", "cpu")
    assert "TiB of params, gradients and optimiser state" in line, line
    line = refused("graph", "--model", config, "--device", "cpu")
    assert "of params," in line and "use a smaller --input-shape or model" in line, line


def test_a_huge_graph_input_is_refused(little_memory: None) -> None:
    line = refused("graph", "--model", "conv4", "--set", "ways=5", "--input-shape",
                   "150000,1,28,28", "--device", "cpu")
    assert "448.6 MiB of data" in line and "256.0 MiB is free" in line, line


def test_sizes_that_fit_pass_and_the_estimate_counts_them() -> None:
    model = build({"name": "m", "input_shape": [1, 8],
                   "layers": [{"type": "linear", "params": {"out_features": 16}}]}).model
    x = memory.meta_example((1, 8))
    estimate = memory.check_sizes(model, x, memory.Sizes(10, 1000), torch.device("cpu"),
                                  "advice")
    params, output, weight = (8 * 16 + 16) * 4, 16 * 4, 8 * 16 * 4
    # one example's activations: at least its output, at most that and a view of the weight
    assert 4 * params + 1000 + 10 * output <= estimate.needed, estimate
    assert estimate.needed <= 4 * params + 1000 + 10 * (output + weight), estimate


def test_an_input_no_tensor_can_hold_is_a_config_error() -> None:
    config = {"name": "m", "input_shape": [10**12, 10**12],
              "layers": [{"type": "linear", "params": {"out_features": 4}}]}
    with pytest.raises(ConfigError, match=r"input_shape: \[1000000000000, 1000000000000\] "
                                          r"has 1e\+24 elements"):
        build(config)
    with pytest.raises(ConfigError, match="has 1e\\+24 elements"):
        memory.meta_example((10**12, 10**12))


def test_layer_count_is_bounded_before_building() -> None:
    layers = [{"type": "linear", "params": {"out_features": 4}}] * 10**5
    with pytest.raises(ConfigError, match=f"layers: 100000 layers; a config builds at most "
                                          f"{MAX_LAYERS}"):
        build({"name": "deep", "input_shape": [1, 4], "layers": layers})
    nested = {"type": "serial", "layers": ["relu"] * (MAX_LAYERS // 2)}
    with pytest.raises(ConfigError, match=f"more than {MAX_LAYERS} layers"):
        build({"name": "deep", "input_shape": [1, 4], "layers": [nested, nested, nested]})


def test_evaluate_checks_the_task_size_it_is_given(tmp_path: Path) -> None:
    out = tmp_path / "sine"
    result = CliRunner().invoke(app, ["meta-train", "--dataset", "sinusoid", "--steps", "1",
                                      "--meta-batch", "1", "--episodes", "1", "--val-episodes",
                                      "1", "--validate-every", "0", "--device", "cpu", "--out",
                                      str(out)])
    assert result.exit_code == 0, result.output
    line = refused("evaluate", str(out), "--tasks", "100000000shot", "--episodes", "1",
                   "--device", "cpu")
    assert "200,000,000 examples of one task" in line, line


def test_a_search_past_the_default_scale_is_counted_and_refused(little_memory: None) -> None:
    line = refused("search", "--batch-size", "4096", "--dry-run", "--steps", "1", "--device",
                   "cpu")
    assert "24,576 example forwards" in line and "lower -C, --layers" in line, line
    result = CliRunner().invoke(app, ["search", "--dry-run", "--steps", "1", "--device", "cpu"])
    assert result.exit_code == 0, result.output  # the default scale is not counted at all


def test_the_plan_counts_the_meta_batchs_data() -> None:
    """With one task graph alive at a time (the loop strategy), doubling the meta-batch adds
    exactly the new tasks' data to the estimate, and the line says how much data it counts."""
    from funcgraph.runs import task_sources
    from funcgraph.runs.meta_training.config import default_config
    from funcgraph.runs.meta_training.plan import plan_meta_train, task_bytes

    sources = task_sources("sinusoid", spec="10shot")
    plans = [plan_meta_train(default_config(dataset="sinusoid", meta_batch=n, strategy="loop"),
                             sources, torch.device("cpu")) for n in (4, 8)]
    one_task = task_bytes(sources.train)
    assert one_task == 4 * (10 + 10 + 10 + 10), "10 support and 10 query (x, y) float32 pairs"
    assert plans[1].memory.needed - plans[0].memory.needed == 4 * one_task
    assert "of meta-batch data" in plans[0].memory.detail, plans[0].memory.detail
