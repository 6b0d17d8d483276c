"""Cells, the search network, the discrete network: shapes, layout, param partition."""

import pytest
import torch

from funcgraph import random
from funcgraph.errors import ConfigError, KeyMissingError
from funcgraph.nas import (
    PRIMITIVES,
    discrete_cell,
    is_arch,
    layout,
    network_from_genotype,
    num_edges,
    random_genotype,
    search_cell,
    search_network,
)
from funcgraph.nas.cell import preprocess
from funcgraph.params import partition, select


def _x(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return random.normal(random.key(seed), shape)


@pytest.mark.parametrize("reduction", [False, True])
@pytest.mark.parametrize("reduction_prev", [False, True])
def test_search_cell_output_shape(reduction: bool, reduction_prev: bool) -> None:
    c = 4
    cell = search_cell(6, 8, c, reduction=reduction, reduction_prev=reduction_prev)
    params, state = cell.init(random.key(0))
    h = 8
    s0 = _x((2, 6, 2 * h if reduction_prev else h, 2 * h if reduction_prev else h), 1)
    s1 = _x((2, 8, h, h), 2)
    weights = torch.softmax(_x((num_edges(), len(PRIMITIVES)), 3), -1)
    y, _ = cell.apply(params, state, (s0, s1, weights), train=True)
    out = h // 2 if reduction else h
    assert y.shape == (2, 4 * c, out, out), f"reduction={reduction}: {tuple(y.shape)}"
    assert cell.meta["out_channels"] == 4 * c


def test_layout_reduces_at_one_and_two_thirds() -> None:
    stem, specs = layout(4, 8)
    assert stem == 12
    assert [i for i, s in enumerate(specs) if s.reduction] == [2, 5]
    assert [s.c for s in specs] == [4, 4, 8, 8, 8, 16, 16, 16]
    assert [s.reduction_prev for s in specs] == [False] * 3 + [True] + [False] * 2 + [True, False]
    assert specs[1].c_prev_prev == 12 and specs[1].c_prev == 16, "4 * C after a normal cell"


def test_search_network_shapes_and_clean_partition() -> None:
    model = search_network(4, 3, num_classes=5, in_channels=1)
    params, state = model.init(random.key(0))
    arch, weights = partition(params, is_arch)
    assert sorted(arch) == ["arch.normal", "arch.reduce"]
    assert arch["arch.normal"].shape == (num_edges(), len(PRIMITIVES))
    assert all(not n.startswith("arch") for n in weights)
    assert len(weights) + len(arch) == len(params)
    assert not any(is_arch(n) for n in state)
    y, new_state = model.apply(params, state, _x((2, 1, 8, 8)), train=True)
    assert y.shape == (2, 5)
    assert set(new_state) == set(state)


def test_network_gradient_reaches_both_weights_and_architecture() -> None:
    model = search_network(4, 3, num_classes=3)
    params, state = model.init(random.key(1))
    x, y = _x((4, 1, 8, 8), 2), torch.tensor([0, 1, 2, 0])

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        logits, _ = model.apply(p, state, x, train=True)
        return torch.nn.functional.cross_entropy(logits, y)

    g = torch.func.grad(loss)(params)
    assert float(g["arch.normal"].abs().sum()) > 0 and float(g["arch.reduce"].abs().sum()) > 0
    assert float(g["classifier.weight"].abs().sum()) > 0


def test_discrete_network_shapes_and_names() -> None:
    genotype = random_genotype(random.key(3))
    model = network_from_genotype(genotype, C=4, layers=3, num_classes=7)
    params, state = model.init(random.key(0))
    y, _ = model.apply(params, state, _x((2, 1, 8, 8)), train=True)
    assert y.shape == (2, 7)
    assert not any(is_arch(n) for n in params), "the discrete network has no architecture"
    assert "cells.0.preprocess1.op.2.weight" in params, "affine batch norm in the final network"
    y_eval, _ = model.apply(params, state, _x((2, 1, 8, 8)), train=False)
    assert y_eval.shape == (2, 7)


def test_discrete_network_from_path_and_drop_path(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "g.json"
    random_genotype(random.key(4)).save(path)
    model = network_from_genotype(path, C=4, layers=3, num_classes=2, drop_path_prob=0.3)
    params, state = model.init(random.key(0))
    x = _x((4, 1, 8, 8))
    with pytest.raises(KeyMissingError, match="drop_path"):
        model.apply(params, state, x, train=True)
    a, _ = model.apply(params, state, x, key=random.key(1), train=True)
    b, _ = model.apply(params, state, x, key=random.key(1), train=True)
    torch.testing.assert_close(a, b, msg="drop path is a pure function of the key")
    with pytest.raises(ConfigError, match="drop_path_prob"):
        network_from_genotype(path, C=4, layers=3, num_classes=2, drop_path_prob=1.0)


def test_discrete_cell_computes_the_genotype_dag() -> None:
    # node 2 = skip(s0) + skip(s1); node 3 = skip(node 2) + avg_pool(s1); ...; concat [2, 3]
    edges = (("skip_connect", 0), ("skip_connect", 1), ("skip_connect", 2), ("avg_pool_3x3", 1))
    cell = discrete_cell(edges, (2, 3), 6, 8, 4, reduction=False, reduction_prev=False)
    params, state = cell.init(random.key(5))
    s0, s1 = _x((2, 6, 8, 8), 6), _x((2, 8, 8, 8), 7)
    y, _ = cell.apply(params, state, (s0, s1, None), train=True)
    p0, _ = preprocess(6, 4, halve=False, affine=True).apply(
        select(params, "preprocess0"), select(state, "preprocess0"), s0, train=True)
    p1, _ = preprocess(8, 4, halve=False, affine=True).apply(
        select(params, "preprocess1"), select(state, "preprocess1"), s1, train=True)
    n2 = p0 + p1
    n3 = n2 + torch.nn.functional.avg_pool2d(p1, 3, 1, 1, count_include_pad=False)
    torch.testing.assert_close(y, torch.cat([n2, n3], dim=1))
