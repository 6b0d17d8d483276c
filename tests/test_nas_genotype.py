"""Genotype derivation on crafted architecture weights, the skip cap, JSON round trips."""

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from funcgraph import random
from funcgraph.errors import ConfigError, ShapeError
from funcgraph.nas import PRIMITIVES, Genotype, derive_cell, derive_genotype, random_genotype

E, K = 14, len(PRIMITIVES)
OP = {name: k for k, name in enumerate(PRIMITIVES)}
ROW = [0, 2, 5, 9]  # first weight row of nodes 2..5 (their 2, 3, 4, 5 incoming edges)


def _flat(value: float = 0.1) -> torch.Tensor:
    return torch.full((E, K), value)


def test_top_two_edges_and_their_strongest_op() -> None:
    w = _flat()
    w[ROW[0] + 1, OP["sep_conv_3x3"]] = 0.9  # node 2 <- 1
    w[ROW[0] + 0, OP["max_pool_3x3"]] = 0.5  # node 2 <- 0
    w[ROW[1] + 2, OP["dil_conv_5x5"]] = 0.8  # node 3 <- node 2
    w[ROW[1] + 0, OP["skip_connect"]] = 0.7  # node 3 <- 0
    w[ROW[1] + 1, OP["avg_pool_3x3"]] = 0.6  # weaker than both: dropped
    cell = derive_cell(w)
    assert cell[0:2] == [("max_pool_3x3", 0), ("sep_conv_3x3", 1)], "edges in predecessor order"
    assert cell[2:4] == [("skip_connect", 0), ("dil_conv_5x5", 2)]


def test_strength_order_lists_the_stronger_edge_first() -> None:
    w = _flat()
    w[ROW[0] + 1, OP["sep_conv_3x3"]] = 0.9  # node 2 <- 1, stronger than 2 <- 0
    w[ROW[0] + 0, OP["max_pool_3x3"]] = 0.5
    w[ROW[1] + 0, OP["skip_connect"]] = 0.8  # node 3 <- 0, stronger than 3 <- 2
    w[ROW[1] + 2, OP["dil_conv_5x5"]] = 0.7
    cell = derive_cell(w, edge_order="strength")
    assert cell[0:2] == [("sep_conv_3x3", 1), ("max_pool_3x3", 0)], \
        f"node 2: the stronger edge (from node 1) first, as DARTS' genotype() lists it: {cell}"
    assert cell[2:4] == [("skip_connect", 0), ("dil_conv_5x5", 2)], cell
    assert derive_cell(w)[0:2] == [("max_pool_3x3", 0), ("sep_conv_3x3", 1)], \
        "the default lists the lower input first"
    with pytest.raises(ConfigError, match="edge_order"):
        derive_cell(w, edge_order="weight")  # type: ignore[arg-type]


@given(st.integers(0, 2**31 - 1), st.sampled_from([None, 0, 2]))
def test_both_edge_orders_describe_the_same_cell(seed: int, skip_cap: int | None) -> None:
    w = torch.softmax(random.normal(random.key(seed), (2, E, K)), -1)
    weights = {"normal": w[0], "reduce": w[1]}
    by_input = derive_genotype(weights, skip_cap=skip_cap)
    by_strength = derive_genotype(weights, skip_cap=skip_cap, edge_order="strength")
    for c, kind in enumerate(("normal", "reduce")):
        a, b = getattr(by_input, kind), getattr(by_strength, kind)
        strength = w[c][:, 1:].max(-1).values  # an edge's strongest op besides none
        for node in range(len(a) // 2):
            pair_a, pair_b = a[2 * node:2 * node + 2], b[2 * node:2 * node + 2]
            assert sorted(pair_a) == sorted(pair_b), f"{kind} node {node + 2}: {a} vs {b}"
            assert pair_a[0][1] < pair_a[1][1], f"input order: lower input first, {pair_a}"
            first, second = (ROW[node] + j for _, j in pair_b)
            assert strength[first] >= strength[second] or skip_cap is not None, \
                f"strength order: stronger edge first, {pair_b}"


def test_none_is_never_chosen_even_when_strongest() -> None:
    w = _flat()
    w[:, OP["none"]] = 0.99
    w[:, OP["sep_conv_5x5"]] = 0.2
    cell = derive_cell(w)
    assert all(op == "sep_conv_5x5" for op, _ in cell), cell


def test_distinct_predecessors_even_if_one_edge_holds_the_two_best_ops() -> None:
    w = _flat()
    w[ROW[3] + 4, OP["sep_conv_3x3"]] = 0.9  # node 5 <- node 4: two strong ops on one edge
    w[ROW[3] + 4, OP["sep_conv_5x5"]] = 0.85
    w[ROW[3] + 2, OP["dil_conv_3x3"]] = 0.3
    cell = derive_cell(w)
    assert cell[6:8] == [("dil_conv_3x3", 2), ("sep_conv_3x3", 4)]
    for node in range(4):
        a, b = cell[2 * node][1], cell[2 * node + 1][1]
        assert a != b and 0 <= a < node + 2 and 0 <= b < node + 2


def test_ties_go_to_the_lower_predecessor_and_the_earlier_primitive() -> None:
    cell = derive_cell(_flat())
    # every non-none entry ties: predecessors 0 and 1, first non-none primitive
    assert cell == [(PRIMITIVES[1], 0), (PRIMITIVES[1], 1)] * 4


@given(st.integers(0, 2**31 - 1))
def test_derivation_is_always_a_valid_genotype(seed: int) -> None:
    w = torch.softmax(random.normal(random.key(seed), (2, E, K)), -1)
    g = derive_genotype({"normal": w[0], "reduce": w[1]})
    assert Genotype.from_dict(json.loads(g.to_json())) == g
    for cell in (g.normal, g.reduce):
        assert len(cell) == 8 and all(op != "none" for op, _ in cell)


def test_skip_cap_replaces_the_weakest_skips() -> None:
    w = _flat()
    w[:, OP["skip_connect"]] = torch.linspace(0.5, 0.9, E)  # later edges: stronger skips
    w[:, OP["sep_conv_3x3"]] = 0.4
    uncapped = derive_cell(w)
    assert sum(op == "skip_connect" for op, _ in uncapped) == 8
    capped = derive_cell(w, skip_cap=2)
    skips = [i for i, (op, _) in enumerate(capped) if op == "skip_connect"]
    assert skips == [6, 7], f"the two strongest skips (node 5) survive, got {capped}"
    assert derive_cell(w, skip_cap=0).count(("skip_connect", 0)) == 0


def test_genotype_skip_count_and_json_file(tmp_path: Path) -> None:
    g = random_genotype(random.key(0))
    g.save(tmp_path / "g.json")
    loaded = Genotype.load(tmp_path / "g.json")
    assert loaded == g
    assert loaded.skips("normal") == sum(op == "skip_connect" for op, _ in g.normal)


@pytest.mark.parametrize("bad,match", [
    ({"normal": [["conv_9x9", 0]] * 8, "reduce": [["skip_connect", 0]] * 8}, "unknown op"),
    ({"normal": [["none", 0]] * 8, "reduce": [["skip_connect", 0]] * 8}, "unknown op"),
    ({"normal": [["skip_connect", 3]] * 8, "reduce": [["skip_connect", 0]] * 8}, r"normal\[0\]"),
    ({"normal": [["skip_connect", 0]] * 7, "reduce": [["skip_connect", 0]] * 8}, "two per node"),
    ({"normal": [["skip_connect", 0]] * 8}, "reduce"),
    ([1, 2], "JSON object"),
])
def test_bad_genotypes_raise_config_errors(bad: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Genotype.from_dict(bad)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        Genotype.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        Genotype.load(tmp_path / "bad.json")


def test_wrong_weight_shape() -> None:
    with pytest.raises(ShapeError, match="derive_cell"):
        derive_cell(torch.zeros(10, K))


def test_random_genotypes_differ_by_key_and_repeat_by_key() -> None:
    a, b = random_genotype(random.key(1)), random_genotype(random.key(2))
    assert a != b and a == random_genotype(random.key(1))
    for cell in (a.normal, a.reduce):
        for node in range(4):
            assert cell[2 * node][1] < cell[2 * node + 1][1] < node + 2
