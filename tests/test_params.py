"""Flat-dict helpers: every helper returns new dicts and keeps names straight."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from funcgraph import params as P

names = st.lists(
    st.from_regex(r"[a-z]{1,4}(\.[a-z0-9]{1,3}){0,2}", fullmatch=True), min_size=1, max_size=6,
    unique=True,
)


def _dict(ns):
    return {n: torch.full((2,), float(i)) for i, n in enumerate(ns)}


@given(names)
def test_prefix_select_round_trip(ns):
    d = _dict(ns)
    scoped = P.add_prefix(d, "block1")
    assert set(scoped) == {f"block1.{n}" for n in ns}
    back = P.select(scoped, "block1")
    assert P.allclose(back, d)


@given(names, st.sampled_from(["a", "b", "c"]))
def test_partition_is_a_disjoint_cover(ns, letter):
    d = _dict(ns)
    yes, no = P.partition(d, lambda n: n.startswith(letter))
    assert set(yes) | set(no) == set(d) and not set(yes) & set(no)
    assert P.count(yes) + P.count(no) == P.count(d)
    assert P.allclose(P.merge(yes, no), d)


def test_zip_map_tree_map_and_errors():
    a = {"w": torch.ones(2), "b": torch.zeros(1)}
    g = {"w": torch.full((2,), 2.0), "b": torch.ones(1)}
    out = P.zip_map(lambda p, q: p - 0.5 * q, a, g)
    assert torch.equal(out["w"], torch.zeros(2)), f"zip_map w: {out['w']}"
    assert torch.equal(out["b"], -0.5 * torch.ones(1)), f"zip_map b: {out['b']}"
    assert torch.equal(a["w"], torch.ones(2)), "zip_map mutated its input"
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        P.zip_map(torch.add, a, {"w": torch.ones(2)})
    assert torch.equal(P.tree_map(torch.neg, a)["w"], -torch.ones(2)), "tree_map(neg) of ones"
    with pytest.raises(ValueError, match="more than one dict"):
        P.merge(a, {"w": torch.ones(2)})


def test_select_does_not_match_partial_names():
    d = {"layer1.w": torch.ones(1), "layer10.w": torch.zeros(1)}
    assert list(P.select(d, "layer1")) == ["w"]
    assert list(P.select(d, "layer1", strip=False)) == ["layer1.w"]


def test_to_casts_floats_only_and_allclose():
    d = {"w": torch.ones(2), "n": torch.zeros((), dtype=torch.int64)}
    moved = P.to(d, "cpu", torch.float64)
    assert moved["w"].dtype == torch.float64 and moved["n"].dtype == torch.int64
    assert not P.allclose(d, {"w": torch.ones(2)})
    assert P.allclose(P.detach(d), d)


def test_stack_unstack_round_trip():
    ds = [{"w": torch.randn(3), "b": torch.randn(())} for _ in range(4)]
    stacked = P.stack(ds)
    assert stacked["w"].shape == (4, 3)
    for a, b in zip(P.unstack(stacked), ds, strict=True):
        assert P.allclose(a, b)


def test_count_and_nbytes_follow_shapes_and_dtypes() -> None:
    d = {"w": torch.zeros(3, 4), "b": torch.zeros(4, dtype=torch.float64),
         "i": torch.zeros(2, dtype=torch.int8)}
    assert P.count(d) == 12 + 4 + 2
    assert P.nbytes(d) == 12 * 4 + 4 * 8 + 2 * 1
