"""DARTS-PT selection: the core on constructed scores (op choice, ties, progressive
discretisation, topology, skip cap, the no-``none`` fallback), the supernet wrapper end to end
on a tiny supernet, and its errors."""

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from funcgraph import random
from funcgraph.errors import ConfigError, ShapeError
from funcgraph.model import Model
from funcgraph.nas import (
    PRIMITIVES,
    Genotype,
    derive_genotype,
    perturbation_genotype,
    search_network,
    select_by_perturbation,
    supernet_accuracy,
)
from funcgraph.nas.perturbation import _accuracy_and_loss
from funcgraph.nn import conv2d, linear, relu, serial

E, K = 14, len(PRIMITIVES)
OP = {name: k for k, name in enumerate(PRIMITIVES)}
ROW = [0, 2, 5, 9]  # first row of nodes 2..5 (their 2, 3, 4, 5 incoming edges)
KINDS = ("normal", "reduce")


def _present(logits: torch.Tensor) -> torch.Tensor:
    """Which ops an architecture keeps: those of non-zero softmax weight (removed: exactly 0)."""
    return torch.softmax(logits, -1) > 0


class Additive:
    """A score additive in the ops present: accuracy the sum of ``value`` over them, loss 10
    minus the sum of ``loss_value`` (so removing an op lowers accuracy by its value and raises
    the loss by its loss value). ``bonus(arch)`` adds to the accuracy; ``calls`` counts."""

    def __init__(self, value: Mapping[str, torch.Tensor],
                 loss_value: Mapping[str, torch.Tensor] | None = None,
                 bonus: Any = None) -> None:
        self.value = {k: v.double() for k, v in value.items()}
        zeros = {k: torch.zeros_like(v) for k, v in self.value.items()}
        self.loss_value = zeros if loss_value is None else {k: v.double()
                                                            for k, v in loss_value.items()}
        self.bonus = bonus
        self.calls = 0

    def __call__(self, arch: Mapping[str, torch.Tensor]) -> tuple[float, float]:
        self.calls += 1
        keep = {k: _present(arch[k]) for k in KINDS}
        acc = sum(float(self.value[k][keep[k]].sum()) for k in KINDS)
        loss = 10.0 - sum(float(self.loss_value[k][keep[k]].sum()) for k in KINDS)
        return acc + (self.bonus(arch) if self.bonus else 0.0), loss


def _zeros() -> dict[str, torch.Tensor]:
    return {k: torch.zeros(E, K) for k in KINDS}


def test_each_edge_takes_the_op_whose_removal_hurts_most_with_documented_ties() -> None:
    value, loss_value, logits = _zeros(), _zeros(), _zeros()
    value["normal"][0, OP["sep_conv_5x5"]] = 0.5  # node 2 <- 0: the op that matters...
    value["normal"][0, OP["skip_connect"]] = 0.2
    logits["normal"][0, OP["skip_connect"]] = 3.0  # ...while alpha favours skip
    value["normal"][1, [OP["max_pool_3x3"], OP["dil_conv_3x3"]]] = 0.4  # accuracy ties:
    loss_value["normal"][1, OP["dil_conv_3x3"]] = 0.1  # the larger loss increase wins
    value["reduce"][1, OP["none"]] = 5.0  # none is never a candidate, however it scores
    value["reduce"][1, OP["avg_pool_3x3"]] = 0.1
    score = Additive(value, loss_value)
    g = select_by_perturbation(logits, score)
    assert g.normal[:2] == (("sep_conv_5x5", 0), ("dil_conv_3x3", 1)), g.normal
    assert derive_genotype({k: torch.softmax(v, -1) for k, v in logits.items()}).normal[0] == (
        "skip_connect", 0), "argmax alpha would have kept the skip"
    assert g.reduce[:2] == (("max_pool_3x3", 0), ("avg_pool_3x3", 1)), \
        "full tie: the earliest non-none primitive"
    assert score.calls == 2 * (E * (K - 1) + 3 + 4 + 5), f"documented cost, got {score.calls}"
    assert Genotype.from_dict(g.to_dict()) == g


def test_topology_keeps_the_two_inputs_whose_removal_hurts_most() -> None:
    value, loss_value = _zeros(), _zeros()
    sep = OP["sep_conv_3x3"]
    value["normal"][ROW[1]:ROW[1] + 3, sep] = 0.4  # node 3: a full tie, the earlier inputs
    value["normal"][ROW[2]:ROW[2] + 4, sep] = torch.tensor([0.3, 0.9, 0.3, 0.6])
    value["normal"][ROW[3]:ROW[3] + 5, sep] = torch.tensor([0.7, 0.5, 0.5, 0.1, 0.5])
    loss_value["normal"][ROW[3] + 4, sep] = 0.2  # node 5 <- 4 wins the accuracy tie on loss
    g = select_by_perturbation(_zeros(), Additive(value, loss_value))
    assert g.normal == (("max_pool_3x3", 0), ("max_pool_3x3", 1),
                        ("sep_conv_3x3", 0), ("sep_conv_3x3", 1),
                        ("sep_conv_3x3", 1), ("sep_conv_3x3", 3),
                        ("sep_conv_3x3", 0), ("sep_conv_3x3", 4)), g.normal
    assert g.reduce == (("max_pool_3x3", 0), ("max_pool_3x3", 1)) * 4
    assert g.normal_concat == g.reduce_concat == (2, 3, 4, 5)
    assert Genotype.from_dict(g.to_dict()) == g


@pytest.mark.parametrize("first,second", [("sep_conv_3x3", "skip_connect"),
                                          ("dil_conv_3x3", "avg_pool_3x3")])
def test_later_edges_are_scored_with_the_earlier_ones_discretised(first: str,
                                                                  second: str) -> None:
    value = _zeros()
    value["normal"][0, OP[first]] = 1.0  # edge 0 decides first
    value["normal"][1, OP["avg_pool_3x3"]] = 0.6
    value["normal"][1, OP["skip_connect"]] = 0.5

    def bonus(arch: Mapping[str, torch.Tensor]) -> float:
        """Edge 1's skip is worth 1 more once edge 0 is a sep_conv_3x3 and nothing else."""
        keep = _present(arch["normal"])
        only_sep = keep[0].sum() == 1 and keep[0, OP["sep_conv_3x3"]]
        return 1.0 if only_sep and keep[1, OP["skip_connect"]] else 0.0

    g = select_by_perturbation(_zeros(), Additive(value, bonus=bonus))
    assert g.normal[:2] == ((first, 0), (second, 1)), g.normal


def test_later_nodes_are_scored_with_the_earlier_nodes_pruned() -> None:
    value, sep = _zeros(), OP["sep_conv_3x3"]
    value["normal"][ROW[1]:ROW[1] + 3, sep] = torch.tensor([0.5, 0.5, 0.1])  # node 3 drops 2
    value["normal"][ROW[2]:ROW[2] + 4, sep] = torch.tensor([0.5, 0.5, 0.1, 0.1])

    def bonus(arch: Mapping[str, torch.Tensor]) -> float:
        """Node 4 <- 3 is worth 1 more once node 3 <- 2 is pruned (only none left on it)."""
        keep = _present(arch["normal"])
        pruned = keep[ROW[1] + 2].sum() == 1 and keep[ROW[1] + 2, OP["none"]]
        return 1.0 if pruned and keep[ROW[2] + 3, sep] else 0.0

    g = select_by_perturbation(_zeros(), Additive(value, bonus=bonus))
    assert g.normal[2:6] == (("sep_conv_3x3", 0), ("sep_conv_3x3", 1),
                             ("sep_conv_3x3", 0), ("sep_conv_3x3", 3)), g.normal


@pytest.mark.parametrize("space", [PRIMITIVES, ("skip_connect", "sep_conv_3x3",
                                                "max_pool_3x3")])
@given(seed=st.integers(0, 2**31 - 1), cap=st.sampled_from([None, 0, 2]))
def test_on_a_score_where_each_op_is_worth_its_alpha_it_is_darts_selection(
        space: tuple[str, ...], seed: int, cap: int | None) -> None:
    # removing an op costs its softmax weight, an edge its op's: DARTS' rule, skip cap included
    logits = {k: random.normal(random.fold_in(random.key(seed), i), (E, len(space)))
              for i, k in enumerate(KINDS)}
    alpha = {k: torch.softmax(v, -1) for k, v in logits.items()}
    value = {k: torch.where(torch.tensor([n == "none" for n in space]), 0.0, w)
             for k, w in alpha.items()}
    g = select_by_perturbation(logits, Additive(value), primitives=space, skip_cap=cap)
    assert g == derive_genotype(alpha, primitives=space, skip_cap=cap)


def test_skip_cap_strikes_the_skips_whose_removal_hurts_least() -> None:
    value = _zeros()
    for k in KINDS:
        value[k][:, OP["skip_connect"]] = torch.linspace(0.5, 0.9, E)  # later: stronger
        value[k][:, OP["sep_conv_3x3"]] = 0.4
    assert select_by_perturbation(_zeros(), Additive(value)).skips() == 8
    capped = select_by_perturbation(_zeros(), Additive(value), skip_cap=2)
    skips = [i for i, (op, _) in enumerate(capped.normal) if op == "skip_connect"]
    assert skips == [6, 7], f"the two strongest skips (node 5) survive, got {capped.normal}"
    assert capped.normal[:6] == (("sep_conv_3x3", 0), ("sep_conv_3x3", 1)) * 3
    assert select_by_perturbation(_zeros(), Additive(value), skip_cap=0).skips("reduce") == 0


def test_without_none_topology_follows_alpha_and_only_ops_are_scored() -> None:
    space = ("skip_connect", "sep_conv_3x3", "max_pool_3x3")
    value = {k: torch.zeros(E, 3) for k in KINDS}
    value["normal"][:, 1] = 1.0  # sep_conv_3x3 on every edge...
    logits = {k: torch.zeros(E, 3) for k in KINDS}
    logits["normal"][ROW[1]:ROW[1] + 3, 1] = torch.tensor([0.0, 2.0, 1.0])  # ...alpha ranks
    score = Additive(value)
    g = select_by_perturbation(logits, score, primitives=space)
    assert g.normal[2:4] == (("sep_conv_3x3", 1), ("sep_conv_3x3", 2)), g.normal
    assert score.calls == 2 * E * 3, "no edge removals without none"


def test_core_errors() -> None:
    score = Additive(_zeros())
    with pytest.raises(ShapeError, match=r"arch\['normal'\] must be float logits \(14, 8\)"):
        select_by_perturbation({"normal": torch.zeros(E, 3), "reduce": torch.zeros(E, K)}, score)
    with pytest.raises(ConfigError, match=r"'normal' and 'reduce', got \['normal'\]"):
        select_by_perturbation({"normal": torch.zeros(E, K)}, score)
    with pytest.raises(ConfigError, match="skip_cap must be an int >= 0"):
        select_by_perturbation(_zeros(), score, skip_cap=-1)
    only_skip = {k: torch.zeros(E, 2) for k in KINDS}
    with pytest.raises(ConfigError, match="no op left once 'skip_connect' is struck off"):
        select_by_perturbation(only_skip, Additive(only_skip), primitives=("none", "skip_connect"),
                               skip_cap=0)
    assert score.calls == 0, "bad input is refused before any scoring"


SPACE = ("none", "skip_connect", "sep_conv_3x3")  # small, so the supernet scores quickly


def _supernet(space: Any = SPACE) -> tuple[Model, dict[str, torch.Tensor], dict[str, Any],
                                           torch.Tensor, torch.Tensor]:
    net = search_network(2, 3, num_classes=3, primitives=space)
    params, state = net.init(random.key(0))
    x, y = random.normal(random.key(1), (4, 1, 8, 8)), torch.tensor([0, 1, 2, 0])
    return net, params, state, x, y


def test_accuracy_and_loss_are_those_of_supernet_accuracy_in_one_pass() -> None:
    net, params, state, x, y = _supernet()
    acc, loss = _accuracy_and_loss(net, params, state, x, y, 3)
    assert acc == supernet_accuracy(net, params, state, x, y, batch_size=3, batch_stats=True)
    chunks = [net.apply(params, state, x[s:s + 3], train=True)[0] for s in (0, 3)]
    want = F.cross_entropy(torch.cat(chunks), y)
    assert loss == pytest.approx(float(want), rel=1e-6)


def test_end_to_end_deterministic_untouched_and_passing_extra_arch_entries() -> None:
    net, params, state, x, y = _supernet()
    params = {**params, "arch.normal_edges": torch.zeros(E)}  # e.g. PC-DARTS edge logits
    before = {n: t.clone() for n, t in {**params, **state}.items()}
    seen: list[torch.Tensor] = []

    def apply(p: Any, s: Any, inputs: Any, **kw: Any) -> Any:
        seen.append(p["arch.normal_edges"])
        return net.apply(p, s, inputs, **kw)

    model = dataclasses.replace(net, apply=apply)
    g = perturbation_genotype(model, params, state, x, y, skip_cap=1)
    assert g == perturbation_genotype(model, params, state, x, y, skip_cap=1), "deterministic"
    for cell in (g.normal, g.reduce):
        assert len(cell) == 8 and {op for op, _ in cell} <= {"skip_connect", "sep_conv_3x3"}
    assert g.skips("normal") <= 1 and g.skips("reduce") <= 1
    assert Genotype.from_dict(g.to_dict(), primitives=SPACE) == g
    assert seen and all(t is params["arch.normal_edges"] for t in seen), "passed through as is"
    for n, t in {**params, **state}.items():
        assert torch.equal(t, before[n]), f"{n} was modified"


def conv_1x1(c: int, stride: int) -> Model:
    return serial(relu(), conv2d(c, c, 1, stride=stride, bias=False))


def test_end_to_end_without_none_scores_only_the_ops() -> None:
    space = ("skip_connect", ("conv_1x1", conv_1x1))
    net, params, state, x, y = _supernet(space)
    passes = 0

    def apply(*args: Any, **kw: Any) -> Any:
        nonlocal passes
        passes += 1
        return net.apply(*args, **kw)

    g = perturbation_genotype(dataclasses.replace(net, apply=apply), params, state, x, y,
                              primitives=space)
    assert passes == 2 * E * 2, f"one pass per op of every edge and nothing else, got {passes}"
    assert Genotype.from_dict(g.to_dict(), primitives=space) == g


def test_wrapper_errors() -> None:
    net, params, state, x, y = _supernet()
    with pytest.raises(ShapeError, match=r"expected x \(N, C, H, W\) with labels y \(N,\)"):
        perturbation_genotype(net, params, state, x, y[:3])
    no_reduce = {n: t for n, t in params.items() if n != "arch.reduce"}
    with pytest.raises(ConfigError, match=r"params lack \['arch.reduce'\]; pass the full"):
        perturbation_genotype(net, no_reduce, state, x, y)
    with pytest.raises(ConfigError, match="not a search supernet"):
        perturbation_genotype(linear(64, 3), params, state, x, y)
    with pytest.raises(ConfigError, match="are not the supernet's ops"):
        perturbation_genotype(net, params, state, x, y, primitives=PRIMITIVES)
    with pytest.raises(ConfigError, match="batch_size must be an int >= 1"):
        perturbation_genotype(net, params, state, x, y, batch_size=0)
