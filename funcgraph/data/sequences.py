"""A generated variable-length sequence task: the digit sum of a sequence, modulo a number.

Each example is a sequence of ``L`` digits ``d_t`` in ``[0, base)`` with ``L`` uniform in
``[min_length, max_length]``; the label is ``sum(d_t) mod num_classes`` (``base=2,
num_classes=2`` is the classic parity task). Tokens are ``d_t + 1``, so token 0 is padding;
batches are right-padded to ``max_length`` with an attention mask. The label depends on every
valid step and on none of the padding, so a model that reads past a sequence's end, or stops
early, is wrong, which is what makes it a test of variable-length handling.

Everything is a pure function of a key (:mod:`funcgraph.random`), so a training stream is
``sample(fold_in(root, step))`` and resumes exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .. import random
from ..errors import DataError
from ..random import Key


@dataclass(frozen=True)
class SequenceTask:
    """Digit-sum-mod-``num_classes`` over sequences of ``min_length..max_length`` digits.

    Attributes:
        base: digits are ``0..base-1`` (tokens ``1..base``).
        num_classes: the label is the digit sum modulo this.
        min_length, max_length: inclusive range of sequence lengths (``min_length >= 1``).
    """

    base: int = 10
    num_classes: int = 2
    min_length: int = 1
    max_length: int = 12

    def __post_init__(self) -> None:
        if self.base < 2 or self.num_classes < 2:
            raise DataError(
                f"SequenceTask: base and num_classes must be >= 2, got "
                f"base={self.base}, num_classes={self.num_classes}"
            )
        if not 1 <= self.min_length <= self.max_length:
            raise DataError(
                f"SequenceTask: need 1 <= min_length <= max_length, got "
                f"{self.min_length}..{self.max_length}"
            )

    @property
    def vocab_size(self) -> int:
        """Token ids ``0..base`` (0 = padding)."""
        return self.base + 1

    def sample(self, key: Key, batch_size: int) -> tuple[tuple[Tensor, Tensor], Tensor]:
        """``((tokens (B, T) int64, mask (B, T) bool), labels (B,) int64)`` with
        ``T = max_length``; padding tokens are 0 and masked out."""
        k_len, k_digits = random.split(key)
        lengths = random.randint(k_len, (batch_size,), self.min_length, self.max_length + 1)
        digits = random.randint(k_digits, (batch_size, self.max_length), 0, self.base)
        steps = torch.arange(self.max_length, device=key.device)
        mask = steps < lengths.unsqueeze(1)  # (B, T)
        tokens = torch.where(mask, digits + 1, torch.zeros_like(digits))
        labels = (digits * mask).sum(1) % self.num_classes
        return (tokens, mask), labels


__all__ = ["SequenceTask"]
