"""The dataset registry: the built-in table, registration checks, and a user's own dataset
meta-trained from the command line with ``--import``."""

from __future__ import annotations

import ast
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import funcgraph.data as data
from funcgraph import random
from funcgraph.cli import app
from funcgraph.data import ClassDataset, register_dataset
from funcgraph.data.registry import (
    check_data_root,
    dataset_help,
    dataset_names,
    dataset_type,
    image_size_help,
    reads_data_root,
    unregister_dataset,
)
from funcgraph.errors import ConfigError, DataError
from funcgraph.runs import task_sources

runner = CliRunner()


@pytest.fixture
def forget() -> Iterator[list[str]]:
    """Names a test registers; unregistered afterwards so the table stays the built-in one."""
    names: list[str] = []
    yield names
    for name in names:
        unregister_dataset(name)


def tiny(split: str, *, image_size: int) -> ClassDataset:
    """Four classes of six constant images, a different shade per class and split."""
    offset = {"train": 0, "val": 4, "test": 8}[split]
    shade = (torch.arange(4, dtype=torch.float32) + offset + 1) / 13
    images = shade[:, None, None, None, None].expand(4, 6, 1, image_size, image_size)
    return ClassDataset(images.contiguous(), [f"{split}{c}" for c in range(4)], f"tiny/{split}")


def test_the_built_in_table() -> None:
    assert dataset_names() == ["glyphs", "omniglot", "rgb-shapes", "patterns", "folder",
                               "mini-imagenet", "cub", "sinusoid"]
    sizes = {n: dataset_type(n).image_size for n in dataset_names()}
    assert sizes == {"glyphs": 28, "omniglot": 28, "rgb-shapes": 84, "patterns": 28,
                     "folder": 84, "mini-imagenet": 84, "cub": 84, "sinusoid": None}, sizes
    assert [n for n in dataset_names() if reads_data_root(n)] == [
        "omniglot", "folder", "mini-imagenet", "cub"]
    assert dataset_type("glyphs").splits == ("background", "validation", "evaluation")
    assert dataset_type("sinusoid").kind == "regression"
    assert dataset_help() == ("glyphs, rgb-shapes, patterns (generated); omniglot, folder, "
                              "mini-imagenet, cub (need --data-root); sinusoid (regression)")
    assert image_size_help() == ("glyphs, omniglot, patterns (28px); rgb-shapes, folder, "
                                 "mini-imagenet, cub (84px)")


def test_a_split_loads_through_the_registry_as_through_its_loader(tmp_path: Path,
                                                                  forget: list[str]) -> None:
    """load_split maps the run's split to the dataset's own name and passes the root first
    for a dataset that reads one."""
    calls: list[tuple] = []

    def on_disk(root: Path, split: str, *, image_size: int) -> ClassDataset:
        calls.append((root, split, image_size))
        return tiny("train", image_size=image_size)

    forget.append("disk")
    entry = register_dataset("disk", load=on_disk, splits=("a", "b", "c"), image_size=8,
                             reads_data_root=True)
    entry.load_split("val", root=str(tmp_path))
    entry.load_split("test", root=tmp_path, image_size=12)
    assert calls == [(tmp_path, "b", 8), (tmp_path, "c", 12)], calls
    with pytest.raises(DataError, match=r"^--dataset disk needs --data-root DIR"):
        entry.load_split("train")
    with pytest.raises(ConfigError, match=r"load_split: unknown split 'background'; expected "
                                          r"one of \['train', 'val', 'test'\]"):
        entry.load_split("background", root=tmp_path)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, r"register_dataset\('x'\): a classification dataset needs load= a function or "
         r"'module:attribute', got None"),
    ({"load": "no_colon"}, "needs load= a function or 'module:attribute', got 'no_colon'"),
    ({"load": tiny, "sample": tiny, "image_size": 8},
     "a classification dataset takes load=, not sample="),
    ({"kind": "ranking", "load": tiny},
     r"kind must be one of \['classification', 'regression'\], got 'ranking'"),
    ({"load": tiny}, r"register_dataset\('x'\): image_size must be an int >= 8, got None"),
    ({"load": tiny, "image_size": 4}, "image_size must be an int >= 8, got 4"),
    ({"load": tiny, "image_size": 8, "splits": ("a", "a", "b")},
     r"splits must be three different split names \(for train, val, test\), got \('a', 'a', "
     r"'b'\)"),
    ({"load": tiny, "image_size": 8, "splits": ("a", "b")}, "splits must be three different"),
    ({"kind": "regression", "sample": tiny, "image_size": 8},
     "a regression dataset has no images and reads no data root"),
    ({"kind": "regression", "load": tiny}, "a regression dataset needs sample="),
])
def test_an_incomplete_entry_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        register_dataset("x", **kwargs)
    assert "x" not in dataset_names()


def test_names_are_checked_and_not_taken_twice(forget: list[str]) -> None:
    with pytest.raises(ConfigError, match="name must be a non-empty string without "
                                          "surrounding spaces, got ' x'"):
        register_dataset(" x", load=tiny, image_size=8)
    with pytest.raises(ConfigError, match="'glyphs' is already registered; pick another name "
                                          "or pass replace=True"):
        register_dataset("glyphs", load=tiny, image_size=8)
    forget.append("mine")
    register_dataset("mine", load=tiny, image_size=8)
    register_dataset("mine", load=tiny, image_size=16, replace=True)
    assert dataset_type("mine").image_size == 16


def test_an_unknown_name_lists_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"dataset 'glyph' is not registered \(did you mean "
                                          r"'glyphs'\?\); expected one of \['glyphs', "):
        dataset_type("glyph")
    with pytest.raises(ConfigError, match="a dataset of your own registers with "
                                          "funcgraph.data.register_dataset in a module loaded "
                                          "by --import MODULE"):
        task_sources("mine")


def test_a_target_that_does_not_import_names_itself(forget: list[str]) -> None:
    forget.append("gone")
    register_dataset("gone", load="no_such_module_here:load", image_size=8)
    with pytest.raises(ConfigError, match="dataset 'gone' needs no_such_module_here:load, "
                                          "which is not available: ModuleNotFoundError"):
        task_sources("gone")


def test_each_kind_refuses_the_other_kinds_function() -> None:
    with pytest.raises(ConfigError, match="dataset 'sinusoid' is regression: it has no splits "
                                          "to load"):
        dataset_type("sinusoid").load_split("train")
    with pytest.raises(ConfigError, match="dataset 'glyphs' is classification: it loads "
                                          "splits, it does not sample regression tasks"):
        dataset_type("glyphs").sampler()


def test_a_data_root_is_refused_for_a_generated_dataset() -> None:
    check_data_root("omniglot", "/data")
    check_data_root("glyphs", None)
    with pytest.raises(ConfigError, match=r"^--data-root is read by --dataset omniglot, folder, "
                                          r"mini-imagenet, cub; rgb-shapes is generated$"):
        check_data_root("rgb-shapes", "/data")
    with pytest.raises(ConfigError, match="dataset 'nope' is not registered"):
        check_data_root("nope", None)


def test_kinds_are_called_by_their_own_conventions(forget: list[str]) -> None:
    """A classification entry's splits become N-way tasks; a regression entry's sampler is
    called as sample(key, num_tasks, shots, queries), one key stream per split."""
    forget.extend(["tiny", "ramp"])
    register_dataset("tiny", load=tiny, image_size=8)
    sources = task_sources("tiny", spec="2way1shot2query", image_size=10)
    assert (sources.kind, sources.ways, sources.in_channels, sources.image_size) == (
        "classification", 2, 1, 10)
    batch = sources.val(random.key(0), 3)
    assert batch.support_x.shape == (3, 2, 1, 10, 10), batch.support_x.shape
    val_shades = torch.arange(5.0, 9.0) / 13  # the val split's classes, offset 4
    assert torch.isin(batch.support_x.unique(), val_shades).all(), "val tasks from another split"

    seen: list[tuple[int, int, int]] = []

    def ramp(key: torch.Tensor, n: int, shots: int, queries: int) -> object:
        seen.append((n, shots, queries))
        return data.sinusoid_tasks(key, n, shots, queries)

    register_dataset("ramp", kind="regression", sample=ramp)
    sources = task_sources("ramp", spec="4shot6query")
    first, again = sources.train(random.key(1), 2), sources.train(random.key(1), 2)
    assert torch.equal(first.support_x, again.support_x)
    other = sources.test(random.key(1), 2)
    assert not torch.equal(first.support_x, other.support_x), "splits share a key stream"
    assert seen == [(2, 4, 6)] * 3, seen
    with pytest.raises(Exception, match=r"ramp task spec '5way' is not of the form"):
        task_sources("ramp", spec="5way")


def test_a_users_regression_dataset_gets_regressions_defaults_and_refusals(
        forget: list[str]) -> None:
    """What meta-train does for sinusoid it does for any registered regression dataset:
    MAML by default, the MAML paper's regression settings, no ways, rotation or image size."""
    from funcgraph.runs.meta_training.config import default_algo, default_config

    forget.append("ramp")
    register_dataset("ramp", kind="regression", sample=data.sinusoid_tasks)
    assert default_algo("ramp") == "maml"
    cfg = default_config(dataset="ramp")
    assert (cfg.algo, cfg.tasks, cfg.inner_lr, cfg.meta_batch) == ("maml", "10shot", 0.01, 25)
    assert default_config(dataset="ramp") == default_config(dataset="sinusoid").__class__(
        **{**default_config(dataset="sinusoid").to_json(), "dataset": "ramp"})
    for given, message in [({"tasks": "5way1shot"}, "ramp tasks are regression and have no ways"),
                           ({"rotate": True}, "ramp tasks are regression and have none"),
                           ({"image_size": 16}, "ramp tasks are regression")]:
        with pytest.raises(ConfigError, match=message):
            default_config(dataset="ramp", **given)


def test_the_package_surface_is_listed_once_for_runtime_and_alike_for_type_checkers() -> None:
    """data/__init__.py's TYPE_CHECKING imports name exactly the names of _EXPORTS, each from
    its module; every name resolves at run time."""
    tree = ast.parse(Path(data.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If)
                 and getattr(n.test, "id", "") == "TYPE_CHECKING")
    typed = {(node.module, alias.name) for node in block.body
             if isinstance(node, ast.ImportFrom) for alias in node.names}
    listed = {(module, name) for module, names in data._EXPORTS.items() for name in names}
    assert typed == listed, typed ^ listed
    for name in data.__all__:
        assert getattr(data, name) is not None, name


PLUGIN = '''
"""A user's own few-shot dataset, registered from their module."""
import torch
from funcgraph import random
from funcgraph.data import ClassDataset, register_dataset

def load_shades(split, *, image_size):
    """Five classes of eight noisy images of one grey level each, per split."""
    offset = {"train": 0, "val": 5, "test": 10}[split]
    noise = random.uniform(random.key(offset), (5, 8, 1, image_size, image_size)) * 0.1
    shade = (torch.arange(5.0) + offset + 1)[:, None, None, None, None] / 16
    return ClassDataset((shade + noise).clamp(0, 1), [f"s{c}" for c in range(5)], split)

register_dataset("shades", load=load_shades, image_size=8)
'''


def test_a_users_own_dataset_meta_trains_with_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forget: list[str]
) -> None:
    module = f"user_shades_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    forget.append("shades")
    out = tmp_path / "run"
    args = ["meta-train", "--dataset", "shades", "--tasks", "2way1shot2query", "--steps", "2",
            "--meta-batch", "2", "--episodes", "2", "--val-episodes", "1",
            "--validate-every", "0", "--device", "cpu", "--set", "hidden=8", "--out", str(out)]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2, refused.output
    assert "dataset 'shades' is not registered" in refused.output, refused.output
    result = runner.invoke(app, [*args[:1], "--import", module, *args[1:]])
    assert result.exit_code == 0, result.output
    assert "test (last checkpoint, 2way1shot2query): acc" in result.output, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["dataset"] == "shades" and config["model"]["image_size"] == 8, config
    assert config["model"]["in_channels"] == 1, config
    result = runner.invoke(app, ["evaluate", str(out), "--import", module, "--episodes", "3",
                                 "--device", "cpu"])
    assert result.exit_code == 0 and "3 tasks" in result.output, result.output


def test_reading_the_table_loads_no_dataset_module() -> None:
    """The CLI builds --dataset's help from the table when it starts: the built-in entries'
    "module:attribute" strings keep every loader, generator and image reader unloaded."""
    import subprocess
    import sys

    probe = ("import json, sys\nfrom funcgraph.data import registry\n"
             "registry.dataset_help(), registry.image_size_help(), registry.dataset_type('cub')\n"
             "print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                       text=True, check=True).stdout.splitlines()[-1])
    modules = [m for m in loaded if m.startswith(("funcgraph.data.", "PIL"))]
    assert modules == ["funcgraph.data.registry"], modules
