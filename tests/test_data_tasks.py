"""Task specs, the episode sampler, rotations, the dataset record and the 1-NN baseline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from funcgraph import random
from funcgraph.data import (
    DEFAULT_QUERIES,
    ClassDataset,
    TaskSpec,
    confidence_interval,
    nearest_neighbour_accuracy,
    rotate_classes,
    sample_tasks,
    save_preview,
)
from funcgraph.data.tasks import _distinct
from funcgraph.errors import ShapeError, TaskSpecError


def coded(num_classes: int, per_class: int, *, offset: int = 0, size: int = 4) -> ClassDataset:
    """A dataset whose pixels spell out (class + offset, example): pixel (0, 0) and (0, 1)."""
    images = torch.zeros(num_classes, per_class, 1, size, size)
    images[:, :, 0, 0, 0] = (torch.arange(num_classes)[:, None] + offset + 1) / 4096
    images[:, :, 0, 0, 1] = (torch.arange(per_class)[None, :] + 1) / 4096
    names = [f"split{offset}/c{c}" for c in range(num_classes)]
    return ClassDataset(images, names, f"coded{offset}")


def decode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(class, example) ids of images ``(..., 1, H, W)``."""
    cls = (x[..., 0, 0, 0] * 4096).round().long() - 1
    ex = (x[..., 0, 0, 1] * 4096).round().long() - 1
    return cls, ex


# --- task specs -------------------------------------------------------------------------


@given(st.integers(2, 200), st.integers(1, 50), st.one_of(st.none(), st.integers(1, 50)))
def test_parse_round_trips_every_valid_spec(ways: int, shots: int, queries: int | None) -> None:
    text = f"{ways}way{shots}shot" + ("" if queries is None else f"{queries}query")
    spec = TaskSpec.parse(text)
    expected = TaskSpec(ways, shots, DEFAULT_QUERIES if queries is None else queries)
    assert spec == expected, f"{text!r} parsed to {spec}"
    assert TaskSpec.parse(str(spec)) == spec, "str(spec) must parse back to the same spec"


@given(st.text(alphabet="0123456789wayshotquery -x", max_size=24))
def test_parse_either_succeeds_or_raises_task_spec_error(text: str) -> None:
    try:
        spec = TaskSpec.parse(text)
    except TaskSpecError as e:
        assert repr(text) in str(e), f"the message must quote the input: {e}"
    else:
        assert spec.ways >= 2 and spec.shots >= 1 and spec.queries >= 1


def test_parse_the_documented_task_specs() -> None:
    assert TaskSpec.parse("5way1shot") == TaskSpec(5, 1, 15)
    assert TaskSpec.parse("20way5shot") == TaskSpec(20, 5, 15)
    assert TaskSpec.parse("5way1shot15query") == TaskSpec(5, 1, 15)
    assert TaskSpec.parse(" 5Way1Shot ") == TaskSpec(5, 1, 15), "case and spaces are forgiven"


@pytest.mark.parametrize(
    "text", ["", "5way", "5-way-1-shot", "way1shot", "5way0.5shot", "5way1shot15", "x5way1shot"]
)
def test_bad_spec_names_the_expected_form(text: str) -> None:
    with pytest.raises(TaskSpecError, match="<N>way<K>shot"):
        TaskSpec.parse(text)


@pytest.mark.parametrize("text", ["1way1shot", "0way5shot"])
def test_fewer_than_two_ways_is_rejected_clearly(text: str) -> None:
    with pytest.raises(TaskSpecError, match=r"ways must be an int >= 2 \(1-way"):
        TaskSpec.parse(text)


@pytest.mark.parametrize("text", ["5way0shot", "5way1shot0query"])
def test_zero_shots_or_queries_is_rejected(text: str) -> None:
    with pytest.raises(TaskSpecError, match=">= 1"):
        TaskSpec.parse(text)


# --- the sampler --------------------------------------------------------------------------


@given(
    ways=st.integers(2, 6),
    shots=st.integers(1, 3),
    queries=st.integers(1, 3),
    tasks=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_sampler_invariants(ways: int, shots: int, queries: int, tasks: int, seed: int) -> None:
    ds = coded(num_classes=8, per_class=7, offset=0)
    spec = TaskSpec(ways, shots, queries)
    b = sample_tasks(random.key(seed), ds, spec, tasks)
    N, K, Q, T = ways, shots, queries, tasks
    assert b.support_x.shape == (T, N * K, 1, 4, 4)
    assert b.query_x.shape == (T, N * Q, 1, 4, 4)
    assert b.support_y.shape == (T, N * K) and b.query_y.shape == (T, N * Q)
    assert b.support_y.dtype == torch.int64 and b.query_y.dtype == torch.int64
    s_cls, s_ex = decode(b.support_x)
    q_cls, q_ex = decode(b.query_x)
    for t in range(T):
        assert len(set(b.classes[t].tolist())) == N, "classes within a task must be distinct"
        for label in range(N):
            assert int((b.support_y[t] == label).sum()) == K, "exactly K support per label"
            assert int((b.query_y[t] == label).sum()) == Q, "exactly Q queries per label"
            cls = int(b.classes[t, label])
            assert (s_cls[t][b.support_y[t] == label] == cls).all(), "label -> one class"
            assert (q_cls[t][b.query_y[t] == label] == cls).all(), "label -> one class"
            examples = s_ex[t][b.support_y[t] == label].tolist()
            examples += q_ex[t][b.query_y[t] == label].tolist()
            assert len(set(examples)) == K + Q, "support and query examples must be disjoint"
    again = sample_tasks(random.key(seed), ds, spec, tasks)
    assert torch.equal(again.support_x, b.support_x), "same key, different support images"
    assert torch.equal(again.query_y, b.query_y), "same key, different query labels"
    assert torch.equal(again.classes, b.classes), "same key must give the same tasks"


@given(n=st.integers(257, 3000), k=st.integers(1, 20), seed=st.integers(0, 2**32 - 1))
def test_sequential_draw_for_many_classes_is_distinct_and_in_range(
    n: int, k: int, seed: int
) -> None:
    picks = _distinct(random.key(seed), (6,), n, k)
    assert picks.shape == (6, k) and picks.min() >= 0 and picks.max() < n
    assert all(len(set(row)) == k for row in picks.tolist()), f"repeated index in {picks}"


def test_sequential_draw_is_uniform() -> None:
    n, k, rows = 300, 3, 20000  # n above the ranking limit, so the sequential path runs
    picks = _distinct(random.key(1), (rows,), n, k)
    for j in range(k):  # every position (hence the label order) is uniform over the classes
        counts = torch.bincount(picks[:, j], minlength=n).double()
        expected = rows / n
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < n + 5 * (2 * n) ** 0.5, f"position {j}: chi-square {chi2:.0f} for {n - 1} dof"


def test_sampler_with_thousands_of_classes() -> None:
    ds = coded(1000, 3, size=2)
    b = sample_tasks(random.key(2), ds, TaskSpec(20, 1, 2), 8)
    cls, _ = decode(b.support_x)
    assert (cls == b.classes).all(), "with one shot, support i is an example of classes[:, i]"
    assert all(len(set(row)) == 20 for row in b.classes.tolist())


def test_sampler_never_mixes_splits() -> None:
    background, evaluation = coded(6, 5, offset=0), coded(6, 5, offset=100)
    b = sample_tasks(random.key(3), evaluation, TaskSpec(5, 2, 3), 50)
    for x in (b.support_x, b.query_x):
        cls, _ = decode(x)
        assert (cls >= 100).all(), "every example must come from the split passed in"
    b = sample_tasks(random.key(3), background, TaskSpec(5, 2, 3), 50)
    assert (decode(b.query_x)[0] < 100).all()


def test_labels_are_a_fresh_random_assignment_per_task() -> None:
    ds = coded(10, 4)
    b = sample_tasks(random.key(0), ds, TaskSpec(5, 1, 1), 200)
    label0 = b.classes[:, 0]
    assert len(set(label0.tolist())) == 10, "label 0 should land on every class over 200 tasks"
    ordered = (b.classes.diff(dim=1) > 0).all(dim=1).float().mean()
    assert ordered < 0.05, f"class order looks sorted in {ordered:.0%} of tasks"
    counts = torch.bincount(b.classes.flatten(), minlength=10).float()
    assert counts.min() > 0.5 * counts.mean(), f"class frequencies far from uniform: {counts}"


def test_different_keys_give_different_tasks() -> None:
    ds = coded(20, 10)
    a = sample_tasks(random.key(0), ds, TaskSpec(5, 1, 2), 4)
    b = sample_tasks(random.key(1), ds, TaskSpec(5, 1, 2), 4)
    assert not torch.equal(a.classes, b.classes), "different keys drew the same classes"


@pytest.mark.parametrize(
    ("spec", "match"),
    [(TaskSpec(9, 1, 1), "need 9 classes"), (TaskSpec(2, 4, 4), "need 8 examples per class")],
)
def test_impossible_spec_for_the_dataset(spec: TaskSpec, match: str) -> None:
    with pytest.raises(TaskSpecError, match=match):
        sample_tasks(random.key(0), coded(8, 7), spec, 2)


# --- the dataset record, rotations, preview -------------------------------------------------


def test_class_dataset_validates_shapes() -> None:
    with pytest.raises(ShapeError, match=r"\(num_classes, per_class, 1, H, W\)"):
        ClassDataset(torch.zeros(3, 2, 28, 28), ["a", "b", "c"], "bad")
    with pytest.raises(ShapeError, match="2 class names for 3 classes"):
        ClassDataset(torch.zeros(3, 2, 1, 4, 4), ["a", "b"], "bad")
    with pytest.raises(ShapeError, match="float32"):
        ClassDataset(torch.zeros(3, 2, 1, 4, 4, dtype=torch.float64), ["a", "b", "c"], "bad")


def test_rotate_classes_adds_three_rotations_as_new_classes() -> None:
    ds = coded(3, 2)
    images = ds.images.clone()
    images[:, :, 0, 1, 3] = 1.0  # an asymmetric mark so every rotation differs
    ds = ClassDataset(images, ds.class_names, ds.name)
    rot = rotate_classes(ds)
    assert rot.images.shape == (12, 2, 1, 4, 4)
    assert rot.class_names[:3] == ds.class_names
    assert rot.class_names[3] == "split0/c0/rot90" and rot.class_names[11] == "split0/c2/rot270"
    for k in range(4):
        block = rot.images[3 * k : 3 * (k + 1)]
        expected = torch.stack(
            [torch.rot90(ds.images[c, e, 0], k) for c in range(3) for e in range(2)]
        )
        assert torch.equal(block.reshape(6, 4, 4), expected), f"rotation {90 * k} is wrong"
    assert len(set(map(tuple, rot.images.flatten(1).tolist()))) == 12, "rotated classes differ"


def test_save_preview_writes_a_grid_png(tmp_path: Path) -> None:
    from PIL import Image

    path = save_preview(coded(3, 5), tmp_path / "p.png", classes=2, per_class=4, scale=1)
    with Image.open(path) as im:
        assert im.size == (4 * (4 + 2) + 2, 2 * (4 + 2) + 2)


# --- the 1-NN baseline and the CI -----------------------------------------------------------


def test_confidence_interval_formula() -> None:
    acc = torch.tensor([0.2, 0.4, 0.9, 1.0], dtype=torch.float64)
    mean, ci = confidence_interval(acc)
    assert mean == pytest.approx(0.625)
    sd = (sum((a - 0.625) ** 2 for a in acc.tolist()) / 3) ** 0.5
    assert ci == pytest.approx(1.96 * sd / 2)


def test_nearest_neighbour_matches_a_direct_loop() -> None:
    g = torch.Generator().manual_seed(0)  # test data only; the library uses keys
    images = torch.rand(6, 5, 1, 3, 3, generator=g)
    images += torch.arange(6).float()[:, None, None, None, None] * 0.1  # some class signal
    ds = ClassDataset(images / images.max(), [str(i) for i in range(6)], "tiny")
    spec, episodes, key = TaskSpec(3, 2, 2), 7, random.key(5)
    mean, ci = nearest_neighbour_accuracy(key, ds, spec, episodes, chunk=3)
    accs = []
    for i, start in enumerate(range(0, episodes, 3)):
        b = sample_tasks(random.fold_in(key, i), ds, spec, min(3, episodes - start))
        for t in range(b.query_x.shape[0]):
            right = 0
            for q in range(b.query_x.shape[1]):
                d = [float(((b.query_x[t, q] - s) ** 2).sum()) for s in b.support_x[t]]
                right += int(b.support_y[t, d.index(min(d))] == b.query_y[t, q])
            accs.append(right / b.query_x.shape[1])
    ref = torch.tensor(accs, dtype=torch.float64)
    assert mean == pytest.approx(float(ref.mean()))
    assert ci == pytest.approx(1.96 * float(ref.std()) / episodes**0.5)
