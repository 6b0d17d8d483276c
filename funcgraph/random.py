"""Counter-based random keys: Threefry-2x32 in plain torch integer ops.

A key is an ``int64`` tensor of shape ``(2,)`` holding two 32-bit words. Numbers are a pure
function of ``(key, shape)``: the same key gives the same numbers on every run and device,
library code never touches torch's global generator, and because every operation is ordinary
tensor arithmetic, ``torch.func.vmap`` over a batch of keys ``(B, 2)`` gives B independent
streams. The 32-bit words live in int64 and are masked after each add and shift, so nothing
overflows.

The hash is Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers: as easy
as 1, 2, 3", SC 2011). ``key``, ``split`` and ``fold_in`` follow the same counter layout as
JAX's default ``threefry2x32`` implementation, so keys match JAX's bit for bit.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from contextvars import ContextVar

import torch
from torch import Tensor

from .errors import ConfigError, KeyMissingError, KeyTypeError

Key = Tensor
"""An ``int64`` tensor of shape ``(2,)`` (or ``(..., 2)`` for a batch of keys)."""

_MASK = 0xFFFFFFFF
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA


def _rotl(x: Tensor, r: int) -> Tensor:
    return ((x << r) | (x >> (32 - r))) & _MASK


def threefry2x32(key: Key, x0: Tensor, x1: Tensor) -> tuple[Tensor, Tensor]:
    """The Threefry-2x32-20 block function.

    Arguments:
        key: ``(2,)`` int64 words in ``[0, 2**32)``.
        x0: the first counter word, an int64 tensor with values in ``[0, 2**32)``.
        x1: the second counter word, of ``x0``'s shape and range.
    Returns:
        The two 32-bit output words, int64 tensors of the counters' shape.
    """
    k0, k1 = key[..., 0], key[..., 1]
    k2 = k0 ^ k1 ^ _PARITY
    ks = (k0, k1, k2)
    x0 = (x0 + k0) & _MASK
    x1 = (x1 + k1) & _MASK
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x0 = (x0 + x1) & _MASK
            x1 = _rotl(x1, r) ^ x0
        x0 = (x0 + ks[(block + 1) % 3]) & _MASK
        x1 = (x1 + ks[(block + 2) % 3] + block + 1) & _MASK
    return x0, x1


def _hash_counts(key: Key, n: int) -> Tensor:
    """``n`` 32-bit words from counters ``0..n-1`` (JAX's layout: halves paired, odd padded)."""
    padded = n + (n % 2)
    counts = torch.arange(padded, dtype=torch.int64, device=key.device)
    half = padded // 2
    y0, y1 = threefry2x32(key, counts[:half], counts[half:])
    return torch.cat([y0, y1])[:n]


def _describe(value: object) -> str:
    """What a non-key is, for an error message: ``int 3``, ``float32 tensor of shape (2,)``."""
    if isinstance(value, Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def check_key(fn: str, key: Key | None, *, batch: bool = True) -> Key:
    """``key`` if it is a funcgraph key, else a funcgraph error that names ``fn``.

    Arguments:
        fn: the public function the user called (``"random.split"``, ``"Model.init"``).
        key: the value received.
        batch: accept a batch of keys ``(..., 2)``; else exactly one key ``(2,)``.
    Raises:
        KeyMissingError: ``key`` is ``None``.
        KeyTypeError: ``key`` is not an ``int64`` tensor of shape ``(2,)`` (or ``(..., 2)``).
    """
    if key is None:
        raise KeyMissingError(
            f"{fn}: this call needs randomness; pass key=funcgraph.random.key(seed) "
            "(or a key from split/fold_in)"
        )
    shape_ok = isinstance(key, Tensor) and (
        key.shape[-1:] == (2,) if batch else tuple(key.shape) == (2,))
    if not shape_ok or key.dtype != torch.int64:
        form = "(2,) or a batch (..., 2)" if batch else "(2,)"
        raise KeyTypeError(
            f"{fn}: key must be a funcgraph key, an int64 tensor of shape {form}; got "
            f"{_describe(key)}. Make one with funcgraph.random.key(0) (more with "
            "funcgraph.random.split(key, n))"
        )
    return key


def key(seed: int, *, device: torch.device | str | None = None) -> Key:
    """A key from an integer seed (``0 <= seed < 2**64``): words ``(seed >> 32, seed & mask)``."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**64:
        raise ConfigError(f"random.key: seed must be an int in [0, 2**64), got {seed!r}")
    return torch.tensor([seed >> 32, seed & _MASK], dtype=torch.int64, device=device)


def split(key: Key, n: int = 2) -> Tensor:
    """``n`` new independent keys, shape ``(n, 2)``; index or unpack them."""
    key = check_key("random.split", key)
    if n < 1:  # not check_int: under torch.compile with dynamic shapes n may be a SymInt
        raise ConfigError(f"random.split: n must be an int >= 1, got {n!r}")
    if _shapes_only():
        return key.new_zeros((n, 2))
    return _hash_counts(key, 2 * n).reshape(n, 2)


def fold_in(key: Key, data: int | Tensor) -> Key:
    """A new key that mixes an integer (step number, rank, layer index) into ``key``."""
    key = check_key("random.fold_in", key)
    if _shapes_only():
        return key.new_zeros(2)
    d = torch.as_tensor(data, dtype=torch.int64, device=key.device)
    hi = (d >> 32) & _MASK
    lo = d & _MASK
    y0, y1 = threefry2x32(key, hi.reshape(1), lo.reshape(1))
    return torch.cat([y0, y1])


_SHAPES_ONLY: ContextVar[bool] = ContextVar("funcgraph_random_shapes_only", default=False)


def _shapes_only() -> bool:
    """Whether draws are shape stand-ins here (never while ``torch.compile`` traces, which
    cannot read a context variable and is never inside such a block)."""
    return not torch.compiler.is_compiling() and _SHAPES_ONLY.get()


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Inside the block, draws are meta tensors of the right shape and dtype, with no values,
    and split or folded keys are zeros: what counting or shaping a model's parameters needs
    (:func:`funcgraph.factory.meta_init`), without the Threefry hash's dozens of ops per draw
    and key. Nothing drawn inside means anything as a number."""
    token = _SHAPES_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPES_ONLY.reset(token)


def bits(key: Key, shape: Sequence[int]) -> Tensor:
    """Uniform random 32-bit words as int64 in ``[0, 2**32)``, of the given shape."""
    key = check_key("random.bits", key)
    shape = tuple(int(s) for s in shape)
    if _shapes_only():
        return torch.empty(shape, dtype=torch.int64, device="meta")
    n = math.prod(shape)
    return _hash_counts(key, n).reshape(shape)


def uniform(
    key: Key,
    shape: Sequence[int] = (),
    *,
    dtype: torch.dtype | None = None,
    low: float = 0.0,
    high: float = 1.0,
) -> Tensor:
    """Uniform floats in ``[low, high)``; 24 random bits for float32/16, 53 for float64.

    ``dtype`` defaults to ``torch.get_default_dtype()``, as ``torch.rand``.
    """
    key = check_key("random.uniform", key)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    shape = tuple(int(s) for s in shape)
    if _shapes_only():
        return torch.empty(shape, dtype=dtype, device="meta")
    if dtype == torch.float64:
        words = bits(key, (2, *shape))
        mantissa = (words[0] >> 5) * (1 << 26) + (words[1] >> 6)  # 53 bits
        u = mantissa.to(torch.float64) * 2.0**-53
    else:
        u = ((bits(key, shape) >> 8).to(torch.float32) * 2.0**-24).to(dtype)
    return u * (high - low) + low


def normal(
    key: Key, shape: Sequence[int] = (), *, dtype: torch.dtype | None = None
) -> Tensor:
    """Standard normal samples by inverse CDF: ``sqrt(2) * erfinv(u)``, ``u`` uniform in (-1, 1).

    ``dtype`` defaults to ``torch.get_default_dtype()``, as ``torch.randn``.
    """
    key = check_key("random.normal", key)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if _shapes_only():
        return torch.empty(tuple(int(s) for s in shape), dtype=dtype, device="meta")
    work = torch.float64 if dtype == torch.float64 else torch.float32
    tiny = 2.0**-53 if work == torch.float64 else 2.0**-24
    u = uniform(key, shape, dtype=work, low=-1.0 + tiny, high=1.0)
    return (math.sqrt(2.0) * torch.erfinv(u)).to(dtype)


def bernoulli(key: Key, p: float | Tensor, shape: Sequence[int] = ()) -> Tensor:
    """Booleans that are True with probability ``p`` (``p`` broadcasts against ``shape``)."""
    key = check_key("random.bernoulli", key)
    wide = isinstance(p, Tensor) and p.dtype == torch.float64
    return uniform(key, shape, dtype=torch.float64 if wide else torch.float32) < p


def randint(key: Key, shape: Sequence[int], low: int, high: int) -> Tensor:
    """Integers uniform in ``[low, high)`` as int64 (bias below 2**-20 for ranges < 2**32)."""
    key = check_key("random.randint", key)
    if high <= low:
        raise ConfigError(f"random.randint: need low < high, got low={low!r}, high={high!r}")
    u = uniform(key, shape, dtype=torch.float64)
    return (u * (high - low)).floor().to(torch.int64) + low


def permutation(key: Key, n: int) -> Tensor:
    """A uniformly random permutation of ``range(n)`` (argsort of 53-bit uniform keys)."""
    key = check_key("random.permutation", key)
    return torch.argsort(uniform(key, (n,), dtype=torch.float64))


def choice(key: Key, n: int, k: int) -> Tensor:
    """``k`` distinct indices from ``range(n)``, uniformly, without replacement."""
    if not 0 <= k <= n:
        raise ConfigError(f"random.choice: need 0 <= k <= n, got k={k!r}, n={n!r}")
    return permutation(key, n)[:k]


__all__ = [
    "Key",
    "bernoulli",
    "bits",
    "check_key",
    "choice",
    "fold_in",
    "key",
    "normal",
    "permutation",
    "randint",
    "shapes_only",
    "split",
    "threefry2x32",
    "uniform",
]
