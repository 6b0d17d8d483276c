"""``nn.early_exit`` over user blocks against a dense reference that runs every block on every
row, one row at a time, with counted block inputs, threshold overrides and the edge cases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

import funcgraph.models.early_exit as shipped
from funcgraph import nn, random
from funcgraph.errors import ArgumentTypeError, ConfigError, KeyMissingError, ShapeError
from funcgraph.model import Model
from funcgraph.models import early_exit_cnn
from funcgraph.nn import ExitOutput, early_exit, early_exit_loss, with_threshold
from funcgraph.params import Params, State, select

FEATURES, CLASSES, ROWS = 6, 3, 32


def _block() -> Model:
    return nn.serial(nn.linear(FEATURES, FEATURES), nn.tanh())


def _counted(model: Model, seen: list[Tensor]) -> Model:
    """``model`` that records every input it receives (the rows a block is given)."""

    def apply(params: Params, state: State, x: Tensor, *, key: Any = None,
              train: bool = False) -> tuple[Any, State]:
        seen.append(x.detach().clone())
        return model.apply(params, state, x, key=key, train=train)

    return Model(model.init, apply, model.name)


def _network(threshold: float, seen: list[list[Tensor]] | None = None) -> Model:
    """Three tanh-linear blocks, a linear head after each; ``seen[k]`` collects block k's
    inputs."""
    blocks = [_block() if seen is None else _counted(_block(), seen[k]) for k in range(3)]
    return early_exit(blocks, [nn.linear(FEATURES, CLASSES) for _ in range(3)],
                      threshold=threshold)


def _setup() -> tuple[Params, Tensor, Tensor]:
    """Double-precision params (so no decision sits within rounding of the threshold), a batch,
    and the confidences of the first exit."""
    params, _ = _network(0.5).init(random.key(0))
    params = {n: 3.0 * t.double() for n, t in params.items()}  # spread the confidences
    x = random.normal(random.key(1), (ROWS, FEATURES)).double()
    return params, x, _dense(params, x)[1][0]


def _dense(params: Params, x: Tensor) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """Every block and head on every row: (block outputs, confidences, logits) per block."""
    hs, confidences, logits = [], [], []
    h = x
    for k in range(3):
        h = torch.tanh(torch.nn.functional.linear(
            h, params[f"blocks.{k}.0.weight"], params[f"blocks.{k}.0.bias"]))
        z = torch.nn.functional.linear(h, params[f"heads.{k}.weight"], params[f"heads.{k}.bias"])
        hs.append(h)
        confidences.append(z.softmax(-1).amax(-1))
        logits.append(z)
    return hs, confidences, logits


def _reference(params: Params, x: Tensor, threshold: float) -> tuple[ExitOutput, Tensor]:
    """What the combinator must return, from the dense run: each row stops at its first exit
    with confidence >= threshold (the last head otherwise). Also each row's stopping block."""
    _, confidences, logits = _dense(params, x)
    stop = torch.full((x.shape[0],), 2)
    for k in (1, 0):
        stop = torch.where(confidences[k] >= threshold, k, stop)
    rows = torch.arange(x.shape[0])
    decision = stop.clamp(max=1)  # the last decision a row took
    all_logits = torch.stack(logits)  # (blocks, rows, classes)
    out = ExitOutput(all_logits[stop, rows], stop < 2,
                     1.0 - torch.stack(confidences)[decision, rows], all_logits[decision, rows])
    return out, stop


def _threshold(confidences: Tensor) -> float:
    """Halfway between the two middle confidences: half the rows stop at the first exit."""
    middle = confidences.sort().values[ROWS // 2 - 1 : ROWS // 2 + 1]
    return float(middle.mean())


def _assert_outputs(got: ExitOutput, want: ExitOutput, what: str) -> None:
    for field, a, b in zip(ExitOutput._fields, got, want, strict=True):
        torch.testing.assert_close(a, b, msg=f"{what}: {field} differs")


def test_combinator_equals_the_dense_reference_and_one_row_at_a_time() -> None:
    params, x, first = _setup()
    threshold = _threshold(first)
    want, stop = _reference(params, x, threshold)
    assert set(stop.tolist()) == {0, 1, 2}, f"the setup needs rows stopping at each exit: {stop}"
    model = _network(threshold)
    out, _ = model.apply(params, {}, x)
    _assert_outputs(out, want, "batch")
    for i in range(ROWS):
        single, _ = model.apply(params, {}, x[i : i + 1])
        _assert_outputs(single, ExitOutput(*(f[i : i + 1] for f in out)), f"row {i} alone")


def test_later_blocks_see_only_the_continuing_rows() -> None:
    params, x, first = _setup()
    threshold = _threshold(first)
    _, stop = _reference(params, x, threshold)
    hs = _dense(params, x)[0]
    seen: list[list[Tensor]] = [[], [], []]
    _network(threshold, seen).apply(params, {}, x)
    assert [len(s) for s in seen] == [1, 1, 1], f"each block runs once: {[len(s) for s in seen]}"
    for k in (1, 2):
        reaching = stop >= k
        assert seen[k][0].shape[0] == int(reaching.sum()), (
            f"block {k} got {seen[k][0].shape[0]} rows, {int(reaching.sum())} continue")
        torch.testing.assert_close(seen[k][0], hs[k - 1][reaching],
                                   msg=f"block {k} must get the continuing rows, in batch order")


@pytest.mark.parametrize(("threshold", "blocks_ran", "exited"), [
    (0.0, 1, True),    # every confidence reaches 0: every row stops at the first exit
    (1.0, 3, False),   # none reaches 1: every row runs every block
])
def test_all_exit_and_none_exit(threshold: float, blocks_ran: int, exited: bool) -> None:
    params, x, _ = _setup()
    seen: list[list[Tensor]] = [[], [], []]
    out, _ = _network(threshold, seen).apply(params, {}, x)
    ran = [len(s) for s in seen]
    assert ran == [1] * blocks_ran + [0] * (3 - blocks_ran), f"blocks called: {ran}"
    assert bool((out.exited == exited).all()), f"threshold {threshold}: exited {out.exited}"
    logits = _dense(params, x)[2]
    torch.testing.assert_close(out.logits, logits[0 if exited else 2],
                               msg=f"threshold {threshold}: the answering head")
    _assert_outputs(out, _reference(params, x, threshold)[0], f"threshold {threshold}")


def test_with_threshold_changes_which_rows_exit_and_nothing_else() -> None:
    params, x, first = _setup()
    loose, strict = _threshold(first), float(first.max()) + 1e-3
    model = _network(loose)
    override = with_threshold(model, strict)
    assert override.init is model.init and override.meta["threshold"] == strict, (
        f"same init, new threshold recorded: {override.meta}")
    out, _ = override.apply(params, {}, x)
    _assert_outputs(out, _reference(params, x, strict)[0], "with_threshold")
    _assert_outputs(out, _network(strict).apply(params, {}, x)[0], "vs rebuilding")
    before = model.apply(params, {}, x)[0].exited
    assert int(before.sum()) > int(out.exited.sum()), (
        f"a stricter threshold exits fewer rows: {int(before.sum())} -> {int(out.exited.sum())}")
    twice = with_threshold(with_threshold(model, strict), loose).apply(params, {}, x)[0]
    assert torch.equal(twice.exited, before), "the outermost with_threshold wins"
    cnn = early_exit_cnn(num_classes=4, width=4, threshold=0.3)
    p, s = cnn.init(random.key(2))
    images = random.normal(random.key(3), (6, 1, 8, 8))
    _assert_outputs(with_threshold(cnn, 0.6).apply(p, s, images)[0],
                    early_exit_cnn(num_classes=4, width=4, threshold=0.6).apply(p, s, images)[0],
                    "the shipped network under with_threshold")


def test_with_threshold_leaves_early_exits_inside_the_blocks_alone() -> None:
    inner_exited: list[Tensor] = []
    inner = early_exit([_block(), _block()], [nn.linear(FEATURES, FEATURES)] * 2, threshold=0.0)

    def inner_logits(params: Params, state: State, x: Tensor, *, key: Any = None,
                     train: bool = False) -> tuple[Tensor, State]:
        y, state = inner.apply(params, state, x, key=key, train=train)
        inner_exited.append(y.exited)
        return y.logits, state

    outer = early_exit({"inner": Model(inner.init, inner_logits), "last": _block()},
                       [nn.linear(FEATURES, CLASSES)] * 2, threshold=0.5)
    params, state = outer.init(random.key(4))
    with_threshold(outer, 1.0).apply(params, state, random.normal(random.key(5), (5, FEATURES)))
    assert bool(inner_exited[0].all()), "the inner early exit keeps its threshold 0 (all exit)"


def test_training_samples_decisions_from_the_key_and_trains_every_head() -> None:
    params, x, first = _setup()
    model = _network(_threshold(first))
    a, _ = model.apply(params, {}, x, key=random.key(6), train=True)
    b, _ = model.apply(params, {}, x, key=random.key(6), train=True)
    assert torch.equal(a.exited, b.exited), "training decisions depend only on the key"
    with pytest.raises(KeyMissingError, match="early_exit: training samples"):
        model.apply(params, {}, x, train=True)
    labels = torch.arange(ROWS) % CLASSES

    def loss(p: Params) -> Tensor:
        y, _ = model.apply(p, {}, x, key=random.key(6), train=True)
        return early_exit_loss(y, labels)[0]

    grads = torch.func.grad(loss)(params)
    for k in range(3):
        g = select(grads, f"heads.{k}")["weight"]
        assert bool(torch.isfinite(g).all()) and bool((g != 0).any()), f"head {k} gradient {g}"


def test_the_shipped_network_is_the_combinator_with_a_gate() -> None:
    model = early_exit_cnn(num_classes=4, width=4)
    params, _ = model.init(random.key(0))
    assert list(params) == [
        "block1.conv.weight", "block1.bn.weight", "block1.bn.bias", "exit_head.fc.weight",
        "exit_head.fc.bias", "decision.weight", "decision.bias", "block2.conv1.conv.weight",
        "block2.conv1.bn.weight", "block2.conv1.bn.bias", "block2.conv2.conv.weight",
        "block2.conv2.bn.weight", "block2.conv2.bn.bias", "block2.conv3.conv.weight",
        "block2.conv3.bn.weight", "block2.conv3.bn.bias", "head.weight", "head.bias",
    ], f"the shipped params keep their names: {list(params)}"
    assert model.meta["exits"] == 1 and model.meta["threshold"] == 0.5, model.meta
    assert shipped.early_exit_loss is early_exit_loss and shipped.ExitOutput is ExitOutput, (
        "one loss and one output type, importable from funcgraph.nn and the model's module")


def _gate(value: float) -> Model:
    return nn.lift(lambda h: torch.full((h.shape[0],), value), "gate")


BAD: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    ("one-block", lambda: early_exit([_block()], [nn.linear(6, 3)], threshold=0.5),
     ConfigError, "at least 2 blocks"),
    ("heads-short", lambda: early_exit([_block()] * 2, [nn.linear(6, 3)], threshold=0.5),
     ConfigError, "one head per block"),
    ("gates-long", lambda: early_exit([_block()] * 2, [nn.linear(6, 3)] * 2, threshold=0.5,
                                      gates=[_gate(0.1)] * 2), ConfigError, "one gate per exit"),
    ("same-name", lambda: early_exit({"a": _block(), "b": _block()},
                                     {"a": nn.linear(6, 3), "c": nn.linear(6, 3)}, threshold=0.5),
     ConfigError, r"used twice: \['a'\]"),
    ("not-a-model", lambda: early_exit([_block(), "conv"], [nn.linear(6, 3)] * 2,  # type: ignore[list-item]
                                        threshold=0.5),
     ArgumentTypeError, "not Models"),
    ("one-model", lambda: early_exit(_block(), [nn.linear(6, 3)], threshold=0.5),  # type: ignore[arg-type]
     ArgumentTypeError, "blocks must be a sequence or a dict"),
    ("threshold", lambda: early_exit([_block()] * 2, [nn.linear(6, 3)] * 2, threshold=1.5),
     ConfigError, r"threshold must be in \[0, 1\]"),
    ("with-threshold-other-model", lambda: with_threshold(_block(), 0.5),
     ArgumentTypeError, "built by funcgraph.nn.early_exit"),
    ("with-threshold-range", lambda: with_threshold(_network(0.5), -0.1),
     ConfigError, r"threshold must be in \[0, 1\]"),
]


@pytest.mark.parametrize(("make", "error", "message"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])
def test_construction_mistakes(make: Callable[[], Any], error: type[Exception],
                               message: str) -> None:
    with pytest.raises(error, match=message):
        make()


def test_gates_decide_and_must_return_one_probability_per_row() -> None:
    x = random.normal(random.key(7), (4, FEATURES))
    for value, exited in ((0.2, True), (0.8, False)):
        model = early_exit([_block()] * 2, [nn.linear(FEATURES, CLASSES)] * 2, threshold=0.5,
                           gates=[_gate(value)])
        params, state = model.init(random.key(8))
        out, _ = model.apply(params, state, x)
        assert bool((out.exited == exited).all()), f"gate {value}: exited {out.exited}"
        assert torch.equal(out.continue_prob, torch.full((4,), value)), out.continue_prob
    wide = early_exit([_block()] * 2, [nn.linear(FEATURES, CLASSES)] * 2, threshold=0.5,
                      gates=[nn.linear(FEATURES, 1)])
    params, state = wide.init(random.key(9))
    with pytest.raises(ShapeError, match=r"'gates.0' must return .* shape \(4,\), got \(4, 1\)"):
        wide.apply(params, state, x)
