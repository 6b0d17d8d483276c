"""Early-exit CNN and variable-length RNN against per-sample and torch.nn references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch.nn.utils.rnn import pack_padded_sequence
from torch.overrides import TorchFunctionMode

from funcgraph import random
from funcgraph.data.sequences import SequenceTask
from funcgraph.errors import DataError, KeyMissingError, ShapeError
from funcgraph.models.early_exit import early_exit_cnn, early_exit_loss
from funcgraph.models.rnn import rnn_classifier, sequence_encoder
from funcgraph.params import Params, select, stack

# --- early exit ---------------------------------------------------------------------------


def _trained_state(seed: int = 0) -> tuple[Params, dict[str, Tensor], Tensor]:
    model = early_exit_cnn(num_classes=4, width=4)
    params, state = model.init(random.key(seed))
    x = random.normal(random.key(seed + 1), (8, 1, 12, 12))
    _, state = model.apply(params, state, x, key=random.key(seed + 2), train=True)
    return params, state, x


def test_early_exit_batch_equals_per_sample() -> None:
    params, state, x = _trained_state()
    probe = early_exit_cnn(num_classes=4, width=4)
    p = probe.apply(params, state, x)[0].continue_prob
    # A threshold between the probabilities, so some samples exit and some continue.
    threshold = float(p.median())
    model = early_exit_cnn(num_classes=4, width=4, threshold=threshold)
    out, _ = model.apply(params, state, x)
    assert 0 < int(out.exited.sum()) < x.shape[0], "the test needs both exiting and continuing"
    for i in range(x.shape[0]):
        single, _ = model.apply(params, state, x[i : i + 1])
        torch.testing.assert_close(out.logits[i], single.logits[0], msg=f"sample {i} logits")
        assert bool(out.exited[i]) == bool(single.exited[0]), f"sample {i} exit decision"


@settings(max_examples=10)
@given(threshold=st.floats(0.0, 1.0))
def test_exit_set_follows_threshold(threshold: float) -> None:
    params, state, x = _trained_state()
    model = early_exit_cnn(num_classes=4, width=4, threshold=threshold)
    out, _ = model.apply(params, state, x)
    assert torch.equal(out.exited, out.continue_prob <= threshold), (
        f"threshold {threshold}: exited {out.exited} vs continue_prob {out.continue_prob}")
    torch.testing.assert_close(out.logits[out.exited], out.exit_logits[out.exited],
                               msg="exiting samples must return the exit head's logits")


class _Block2Inputs(TorchFunctionMode):
    """Records the input of every ``F.conv2d`` whose weight is block2.conv1's ``(8, 4, 3, 3)``
    (width 4: the only conv from ``width`` to ``2 * width`` channels), i.e. the rows block2
    receives."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is F.conv2d and tuple(args[1].shape) == (8, 4, 3, 3):
            self.inputs.append(args[0].detach().clone())
        return func(*args, **(kwargs or {}))


def _block2_inputs(model_threshold: float, params: Params, state: dict[str, Tensor],
                   x: Tensor) -> tuple[list[Tensor], Tensor]:
    model = early_exit_cnn(num_classes=4, width=4, threshold=model_threshold)
    with _Block2Inputs() as seen:
        out, _ = model.apply(params, state, x)
    return seen.inputs, out.exited


def test_all_exit_skips_the_second_block() -> None:
    params, state, x = _trained_state()
    for threshold, ran in ((1.0, False), (0.0, True)):
        model = early_exit_cnn(num_classes=4, width=4, threshold=threshold)
        out, _ = model.apply(params, state, x)
        assert bool(out.exited.all()) != ran, f"threshold {threshold}: exited {out.exited}"
    # block2 sees exactly the continuing rows: none when all exit, all when none does, and for
    # a threshold in between the continuing samples' block1 features, in batch order.
    inputs, exited = _block2_inputs(1.0, params, state, x)
    assert bool(exited.all()) and inputs == [], (
        f"all samples exit, yet block2 ran on {[tuple(t.shape) for t in inputs]}")
    everyone, exited = _block2_inputs(0.0, params, state, x)
    assert not bool(exited.any()) and len(everyone) == 1, (
        f"no sample exits: block2.conv1 should run once, ran {len(everyone)} times")
    assert everyone[0].shape[0] == x.shape[0], (
        f"block2 got {everyone[0].shape[0]} rows, expected all {x.shape[0]}")
    probe = early_exit_cnn(num_classes=4, width=4).apply(params, state, x)[0].continue_prob
    some, exited = _block2_inputs(float(probe.median()), params, state, x)
    continuing = int((~exited).sum())
    assert 0 < continuing < x.shape[0], "the test needs both exiting and continuing samples"
    assert len(some) == 1 and some[0].shape[0] == continuing, (
        f"block2 got {[t.shape[0] for t in some]} rows, expected one call on the "
        f"{continuing} continuing samples")
    torch.testing.assert_close(some[0], everyone[0][~exited], rtol=0, atol=0,
                               msg="block2's rows must be the continuing samples' features")
    # In training the sampled decisions depend only on the key; block2's batch-norm state
    # moves only when some sample continued.
    model = early_exit_cnn(num_classes=4, width=4)
    a, sa = model.apply(params, state, x, key=random.key(5), train=True)
    b, _ = model.apply(params, state, x, key=random.key(5), train=True)
    assert torch.equal(a.exited, b.exited), "training exit decisions depend only on the key"
    moved = not torch.equal(sa["block2.conv1.bn.running_mean"],
                            state["block2.conv1.bn.running_mean"])
    assert moved == bool((~a.exited).any()), (
        f"block2's running mean moved={moved}, but continuing samples={int((~a.exited).sum())}")
    with pytest.raises(KeyMissingError):
        model.apply(params, state, x, train=True)


def test_early_exit_trains_under_grad() -> None:
    params, state, x = _trained_state()
    model = early_exit_cnn(num_classes=4, width=4)
    labels = torch.arange(8) % 4

    def loss(p: Params) -> Tensor:
        y, _ = model.apply(p, state, x, key=random.key(3), train=True)
        return early_exit_loss(y, labels)[0]

    grads = torch.func.grad(loss)(params)
    assert bool((grads["decision.weight"] != 0).any()), "the decision head must get a gradient"
    assert all(bool(torch.isfinite(g).all()) for g in grads.values())


# --- variable-length RNN ------------------------------------------------------------------


def _reference_last_hidden(params: Params, tokens: Tensor, lengths: Tensor,
                           num_layers: int) -> Tensor:
    emb = torch.nn.Embedding(*params["embedding.weight"].shape, padding_idx=0).double()
    lstm = torch.nn.LSTM(emb.embedding_dim, params["lstm.weight_hh_l0"].shape[1],
                         num_layers=num_layers, batch_first=True).double()
    emb.load_state_dict(select(params, "embedding"))
    lstm.load_state_dict(select(params, "lstm"))
    packed = pack_padded_sequence(emb(tokens), lengths, batch_first=True, enforce_sorted=False)
    _, (h_n, _) = lstm(packed)
    return h_n[-1]


def _padded(lengths: list[int], vocab: int, seed: int) -> tuple[Tensor, Tensor]:
    t = max(lengths)
    digits = random.randint(random.key(seed), (len(lengths), t), 1, vocab)
    mask = torch.arange(t) < torch.tensor(lengths).unsqueeze(1)
    return torch.where(mask, digits, torch.zeros_like(digits)), mask


@settings(max_examples=10)
@given(lengths=st.lists(st.integers(1, 7), min_size=1, max_size=5),
       num_layers=st.sampled_from([1, 2]), seed=st.integers(0, 1000))
def test_encoder_equals_nn_lstm_on_packed_sequences(lengths: list[int], num_layers: int,
                                                    seed: int) -> None:
    lengths = [*lengths, 1, 7]  # always include length 1 and the full length
    enc = sequence_encoder(6, embed_dim=3, hidden_size=4, num_layers=num_layers)
    params, state = enc.init(random.key(seed))
    params = {n: t.double() for n, t in params.items()}
    tokens, mask = _padded(lengths, 6, seed)
    h, _ = enc.apply(params, state, (tokens, mask))
    ref = _reference_last_hidden(params, tokens, torch.tensor(lengths), num_layers)
    torch.testing.assert_close(h, ref, msg="last valid hidden state != nn.LSTM on packed input")


def test_rnn_under_vmap_over_params_and_batches() -> None:
    model = rnn_classifier(vocab_size=6, num_classes=3, embed_dim=3, hidden_size=4)
    inits = [model.init(random.key(i))[0] for i in range(3)]
    tokens, mask = _padded([1, 4, 2], 6, 0)
    ys = torch.func.vmap(lambda p: model.apply(p, {}, (tokens, mask))[0])(stack(inits))
    for i, p in enumerate(inits):
        torch.testing.assert_close(ys[i], model.apply(p, {}, (tokens, mask))[0])
    batches = [_padded(ls, 6, s) for s, ls in enumerate(([3, 1], [2, 3], [1, 3]))]
    tok = torch.stack([b[0] for b in batches])
    msk = torch.stack([b[1] for b in batches])
    yb = torch.func.vmap(lambda t, m: model.apply(inits[0], {}, (t, m))[0])(tok, msk)
    for i, (t, m) in enumerate(batches):
        torch.testing.assert_close(yb[i], model.apply(inits[0], {}, (t, m))[0])


def test_rnn_second_order_matches_finite_differences() -> None:
    model = rnn_classifier(vocab_size=6, num_classes=3, embed_dim=3, hidden_size=4)
    params = {n: t.double() for n, t in model.init(random.key(0))[0].items()}
    tokens, mask = _padded([1, 4, 2], 6, 1)
    labels = torch.tensor([0, 2, 1])

    def loss(p: Params) -> Tensor:
        logits, _ = model.apply(p, {}, (tokens, mask))
        return torch.nn.functional.cross_entropy(logits, labels)

    direction = {n: random.normal(random.fold_in(random.key(9), i), t.shape, dtype=t.dtype)
                 for i, (n, t) in enumerate(params.items())}

    def directional(p: Params) -> Tensor:
        g = torch.func.grad(loss)(p)
        return sum((g[n] * direction[n]).sum() for n in p)  # type: ignore[return-value]

    hvp = torch.func.grad(directional)(params)
    eps = 1e-5
    plus = torch.func.grad(loss)({n: t + eps * direction[n] for n, t in params.items()})
    minus = torch.func.grad(loss)({n: t - eps * direction[n] for n, t in params.items()})
    for n in params:
        torch.testing.assert_close(hvp[n], (plus[n] - minus[n]) / (2 * eps), rtol=1e-5,
                                   atol=1e-7, msg=f"Hessian-vector product of {n}")


def test_rnn_rejects_non_prefix_masks() -> None:
    model = sequence_encoder(6, embed_dim=3, hidden_size=4)
    params, state = model.init(random.key(0))
    tokens = torch.ones(2, 3, dtype=torch.int64)
    with pytest.raises(ShapeError, match="prefix"):
        model.apply(params, state, (tokens, torch.tensor([[True, False, True]] * 2)))
    with pytest.raises(ShapeError, match="shape"):
        model.apply(params, state, (tokens, torch.ones(2, 4, dtype=torch.bool)))


# --- sequence task -------------------------------------------------------------------------


@settings(max_examples=10)
@given(seed=st.integers(0, 2**31), base=st.integers(2, 10), classes=st.integers(2, 5))
def test_sequence_task_labels_are_digit_sums(seed: int, base: int, classes: int) -> None:
    task = SequenceTask(base=base, num_classes=classes, min_length=2, max_length=6)
    (tokens, mask), labels = task.sample(random.key(seed), 16)
    assert tokens.shape == mask.shape == (16, 6)
    for row, m, y in zip(tokens.tolist(), mask.tolist(), labels.tolist(), strict=True):
        n = sum(m)
        assert 2 <= n <= 6 and all(m[:n]) and not any(m[n:])
        assert all(t == 0 for t in row[n:]) and all(1 <= t <= base for t in row[:n])
        assert y == sum(t - 1 for t in row[:n]) % classes
    again = task.sample(random.key(seed), 16)
    assert torch.equal(again[1], labels), "a batch is a pure function of its key"
    with pytest.raises(DataError):
        SequenceTask(min_length=0)
