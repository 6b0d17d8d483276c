"""A variable-length sequence model: embedding, LSTM over a padded batch, last valid state.

Inputs are ``(tokens (B, T) int64, mask (B, T) bool)`` where ``mask`` is an attention mask
marking the valid prefix of each row (right padding, as tokenizers produce). The LSTM is
:func:`funcgraph.nn.lstm`, which carries each sequence's state past its end unchanged, so the
final hidden state is the one at the last valid step: the same numbers as ``nn.LSTM`` on
``pack_padded_sequence``. Everything is tensor arithmetic over the padded batch, so the model
works under ``vmap`` (over params or over batches) and under second-order ``grad``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .. import nn
from ..checks import check_sizes
from ..control import is_batched
from ..errors import ShapeError
from ..model import Model
from ..nn.compose import Children


def _lengths(tokens: Tensor, mask: Tensor) -> Tensor:
    """Valid steps per row, ``(B,)`` int64; checks (when the values are concrete) that
    ``mask`` is a prefix mask, since the LSTM reads only the first ``length`` steps."""
    if mask.shape != tokens.shape:
        raise ShapeError(
            f"rnn: mask must have the tokens' shape {tuple(tokens.shape)}, got {tuple(mask.shape)}"
        )
    lengths = mask.to(torch.int64).sum(-1)
    if not (is_batched(mask) or mask.is_meta or torch.compiler.is_compiling()):
        steps = torch.arange(mask.shape[-1], device=mask.device)
        if not torch.equal(mask.bool(), steps < lengths.unsqueeze(-1)):
            raise ShapeError("rnn: mask must mark a prefix of each row (right padding)")
    return lengths


def sequence_encoder(
    vocab_size: int,
    *,
    embed_dim: int = 32,
    hidden_size: int = 64,
    num_layers: int = 1,
    padding_idx: int | None = 0,
) -> Model:
    """Embedding + LSTM; ``(tokens (B, T), mask (B, T)) -> (B, hidden_size)``, the last layer's
    hidden state at each sequence's last valid step (zeros for an empty sequence).

    Params: ``embedding.weight``, ``lstm.weight_ih_l0``... (``nn.Embedding``/``nn.LSTM`` names).
    """
    check_sizes("sequence_encoder", vocab_size=vocab_size, embed_dim=embed_dim,
                hidden_size=hidden_size, num_layers=num_layers)
    children = {
        "embedding": nn.embedding(vocab_size, embed_dim, padding_idx=padding_idx),
        "lstm": nn.lstm(embed_dim, hidden_size, num_layers=num_layers),
    }

    def forward(run: Children, x: Any) -> Tensor:
        tokens, mask = _unpack(x)
        lengths = _lengths(tokens, mask)
        emb = run("embedding", tokens)  # (B, T, E)
        _, (h_n, _) = run("lstm", (emb, lengths))  # h_n: (num_layers, B, H)
        return h_n[-1]  # (B, H)

    return nn.composite("sequence_encoder", children, forward, vocab_size=vocab_size,
                        hidden_size=hidden_size)


def rnn_classifier(
    vocab_size: int = 11,
    num_classes: int = 2,
    *,
    embed_dim: int = 32,
    hidden_size: int = 64,
    num_layers: int = 1,
) -> Model:
    """:func:`sequence_encoder` and a linear head: ``(tokens, mask) -> (B, num_classes)``.

    Params: ``encoder.embedding.weight``, ``encoder.lstm.*``, ``fc.weight``, ``fc.bias``.
    The defaults fit the default :class:`funcgraph.data.sequences.SequenceTask`.
    """
    check_sizes("rnn_classifier", num_classes=num_classes)  # the encoder checks the rest
    children = {
        "encoder": sequence_encoder(vocab_size, embed_dim=embed_dim, hidden_size=hidden_size,
                                    num_layers=num_layers),
        "fc": nn.linear(hidden_size, num_classes),
    }

    def forward(run: Children, x: Any) -> Tensor:
        return run("fc", run("encoder", x))

    return nn.composite("rnn_classifier", children, forward, vocab_size=vocab_size,
                        num_classes=num_classes, hidden_size=hidden_size)


def _unpack(x: Any) -> tuple[Tensor, Tensor]:
    if not isinstance(x, tuple | list) or len(x) != 2:
        raise ShapeError(
            f"rnn: expected x = (tokens (B, T), mask (B, T)), got {type(x).__name__}"
        )
    return x[0], x[1]


__all__ = ["rnn_classifier", "sequence_encoder"]
