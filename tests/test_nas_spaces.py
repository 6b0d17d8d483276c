"""Open search spaces: user ops in mixed ops, cells, derivation and the discrete network;
registered op names, space files, and the errors for spaces that cannot work."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from funcgraph import random
from funcgraph.errors import ArgumentTypeError, ConfigError, ShapeError
from funcgraph.model import Model
from funcgraph.nas import (
    PRIMITIVES,
    REGISTERED_OPS,
    Genotype,
    SearchConfig,
    SearchData,
    build_search_model,
    derive_genotype,
    is_arch,
    load_space,
    make_op,
    mixed_op,
    network_from_genotype,
    num_edges,
    random_genotype,
    register_op,
    search_cell,
    search_network,
)
from funcgraph.nn import conv2d, relu, serial
from funcgraph.params import partition, select

C = 4


def conv_1x1(c: int, stride: int) -> Model:
    """The user op of these tests: ReLU and a strided 1x1 conv."""
    return serial(relu(), conv2d(c, c, 1, stride=stride, bias=False))


SPACE = ("skip_connect", ("conv_1x1", conv_1x1), "max_pool_3x3")


def _x(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return random.normal(random.key(seed), shape)


@pytest.fixture
def registered() -> Iterator[str]:
    name = "custom.test_conv_1x1"
    register_op(name, conv_1x1)
    yield name
    REGISTERED_OPS.pop(name, None)


@pytest.mark.parametrize("stride", [1, 2])
def test_one_hot_weights_reduce_the_mixed_op_to_the_user_op(stride: int) -> None:
    mixed = mixed_op(C, stride, primitives=SPACE)
    params, state = mixed.init(random.key(0))
    assert params["ops.1.1.weight"].shape == (C, C, 1, 1), f"user op params: {sorted(params)}"
    x = _x((2, C, 8, 8), 1)
    y, _ = mixed.apply(params, state, (x, torch.tensor([0.0, 1.0, 0.0])), train=True)
    alone, _ = conv_1x1(C, stride).apply(select(params, "ops.1"), {}, x, train=True)
    torch.testing.assert_close(y, alone, msg="one-hot on the user op must be the op itself")


def test_a_cell_over_a_three_op_space_has_three_alpha_columns() -> None:
    net = search_network(2, 3, num_classes=3, primitives=SPACE)
    params, state = net.init(random.key(0))
    arch, _ = partition(params, is_arch)
    shapes = {n: tuple(t.shape) for n, t in arch.items()}
    assert shapes == {"arch.normal": (num_edges(), 3), "arch.reduce": (num_edges(), 3)}, shapes
    assert net.meta["primitives"] == ["skip_connect", "conv_1x1", "max_pool_3x3"], net.meta
    logits, _ = net.apply(params, state, _x((2, 1, 8, 8)), train=True)
    assert logits.shape == (2, 3), f"supernet logits {tuple(logits.shape)}"
    cell = search_cell(6, 6, 2, reduction=True, reduction_prev=False, primitives=SPACE)
    p, s = cell.init(random.key(1))
    weights = torch.softmax(_x((num_edges(), 3), 2), -1)
    y, _ = cell.apply(p, s, (_x((2, 6, 8, 8), 3), _x((2, 6, 8, 8), 4), weights), train=True)
    assert y.shape == (2, 8, 4, 4), f"reduction cell output {tuple(y.shape)}"


def test_derivation_names_the_custom_ops_and_builds_the_discrete_network() -> None:
    w = torch.full((num_edges(), 3), 0.1)
    w[:, 1] = 0.8  # conv_1x1 strongest everywhere
    genotype = derive_genotype({"normal": w, "reduce": w}, primitives=SPACE)
    assert {op for op, _ in genotype.normal + genotype.reduce} == {"conv_1x1"}, genotype
    net = network_from_genotype(genotype, C=2, layers=3, num_classes=5, primitives=SPACE)
    params, state = net.init(random.key(0))
    logits, _ = net.apply(params, state, _x((2, 1, 8, 8)), train=True)
    assert logits.shape == (2, 5), f"discrete network logits {tuple(logits.shape)}"
    with pytest.raises(ConfigError, match=r"unknown op 'conv_1x1'.*sep_conv_3x3"):
        network_from_genotype(genotype, C=2, layers=3, num_classes=5)  # no space given


def test_random_genotypes_and_genotype_files_stay_in_their_space(tmp_path: Path) -> None:
    genotype = random_genotype(random.key(0), primitives=SPACE)
    ops = {op for op, _ in genotype.normal + genotype.reduce}
    assert ops <= {"skip_connect", "conv_1x1", "max_pool_3x3"}, ops
    path = tmp_path / "g.json"
    genotype.save(path)
    assert Genotype.load(path, primitives=SPACE) == genotype, "round trip in its space"
    darts = random_genotype(random.key(1))
    darts.save(path)
    with pytest.raises(ConfigError, match=r"unknown op .*expected one of \['skip_connect'"):
        Genotype.load(path, primitives=["skip_connect", "max_pool_3x3"])


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"primitives\[1\]: unknown op 'nope'.*sep_conv_3x3"):
        mixed_op(C, 1, primitives=["skip_connect", "nope"])
    with pytest.raises(ConfigError, match=r"make_op: unknown op 'nope'; known ops: \['none'"):
        make_op("nope", C, 1)
    with pytest.raises(ConfigError, match=r"unknown op 'sep_conv_3x3'; the space's ops"):
        make_op("sep_conv_3x3", C, 1, primitives=SPACE)


@pytest.mark.parametrize("primitives,error,match", [
    ([("conv", conv_1x1(C, 1))], ArgumentTypeError, "got the Model"),
    ([("conv", "not callable")], ArgumentTypeError, "expected a factory"),
    ([("sep_conv_3x3", conv_1x1)], ConfigError, "already a known op"),
    (["skip_connect", "skip_connect"], ConfigError, "appears twice"),
    (["none"], ConfigError, "besides 'none'"),
    ("skip_connect", ConfigError, "non-empty list"),
    ([], ConfigError, "non-empty list"),
    ([3], ConfigError, r"op name or a \(name, factory\) pair, got 3"),
])
def test_spaces_that_cannot_work_are_refused(primitives: object, error: type[Exception],
                                             match: str) -> None:
    with pytest.raises(error, match=match):
        mixed_op(C, 1, primitives=primitives)  # type: ignore[arg-type]


def test_a_user_op_with_the_wrong_output_shape_is_named() -> None:
    def halves_channels(c: int, stride: int) -> Model:
        return conv2d(c, c // 2, 1, stride=stride, bias=False)

    mixed = mixed_op(C, 1, primitives=["skip_connect", ("halves", halves_channels)])
    params, state = mixed.init(random.key(0))
    with pytest.raises(ShapeError, match=r"op 'halves' \(C=4, stride=1\): expected output"):
        mixed.apply(params, state, (_x((2, C, 8, 8)), torch.tensor([0.5, 0.5])))


def test_registered_ops_are_known_by_name(registered: str) -> None:
    genotype = random_genotype(random.key(2), primitives=[registered])
    net = network_from_genotype(genotype, C=2, layers=3, num_classes=2)  # default: known ops
    params, state = net.init(random.key(0))
    logits, _ = net.apply(params, state, _x((2, 1, 8, 8)), train=True)
    assert logits.shape == (2, 2), f"discrete network of a registered op: {tuple(logits.shape)}"
    with pytest.raises(ConfigError, match="already known"):
        register_op(registered, conv_1x1)
    with pytest.raises(ConfigError, match="already known"):
        register_op("skip_connect", conv_1x1, replace=True)


def test_load_space_round_trip_into_the_search_config(tmp_path: Path, registered: str) -> None:
    path = tmp_path / "space.json"
    names = ["sep_conv_3x3", "skip_connect", registered]
    path.write_text(json.dumps({"name": "small", "primitives": names}))
    space = load_space(path)
    assert space == tuple(names), space
    cfg = SearchConfig(C=2, layers=3, primitives=space)
    data = SearchData(_x((4, 1, 8, 8)), torch.arange(4) % 2, _x((4, 1, 8, 8), 1),
                      torch.arange(4) % 2, num_classes=2)
    params, _ = build_search_model(cfg, data).init(random.key(0))
    assert params["arch.normal"].shape == (num_edges(), 3), "alpha columns = the file's ops"
    assert SearchConfig().space == PRIMITIVES and SearchConfig().to_dict()["primitives"] is None, \
        "the default search keeps DARTS' space and its config"


@pytest.mark.parametrize("text,match", [
    (None, "not found"),
    ("{nope", "not valid JSON"),
    ('["sep_conv_3x3"]', "expected a JSON object"),
    ('{"primitives": ["sep_conv_3x3"], "ops": []}', r"unknown keys \['ops'\]"),
    ('{"primitives": "sep_conv_3x3"}', "must be a list of op names"),
    ('{"primitives": [1]}', "must be a list of op names"),
    ('{"primitives": ["sep_conv_3x3", "conv_9x9"]}', r"primitives\[1\]: unknown op 'conv_9x9'"),
    ('{"name": 3, "primitives": ["sep_conv_3x3"]}', "name must be a string"),
])
def test_load_space_errors_name_the_file_and_the_key(tmp_path: Path, text: str | None,
                                                     match: str) -> None:
    path = tmp_path / "space.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=match) as info:
        load_space(path)
    assert str(path) in str(info.value), f"the message names the file: {info.value}"


def test_search_command_takes_a_space_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from funcgraph.cli import app

    space = tmp_path / "space.json"
    space.write_text(json.dumps({"primitives": ["skip_connect", "max_pool_3x3", "none"]}))
    result = CliRunner().invoke(app, ["search", "--steps", "2", "--classes", "4", "-C", "4",
                                      "--layers", "3", "--batch-size", "8", "--space",
                                      str(space), "--select", "argmax", "--device", "cpu",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    genotype = json.loads((tmp_path / "run" / "genotype.json").read_text())
    ops = {op for op, _ in genotype["normal"] + genotype["reduce"]}
    assert ops <= {"skip_connect", "max_pool_3x3"}, f"ops outside the space: {ops}"
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["primitives"] == ["skip_connect", "max_pool_3x3", "none"], config
