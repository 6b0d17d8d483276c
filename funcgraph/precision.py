"""Compute precision: float32, or bfloat16 for the convolutions and matmuls where it is fast.

``precision="bf16"`` runs a per-task function under ``torch.autocast`` with bfloat16: the
convolutions and matrix products compute in bfloat16 while the parameters, the optimiser
state, the losses, the inner-loop update and batch-norm statistics stay float32 (autocast
casts each weight as an op reads it; the gradients of the casts are float32). Autocast state
belongs to a thread, so the wrapper (:func:`in_precision`) enters it inside each call: tasks
run on worker threads (``strategy="threads"``) compute in bfloat16 too.

``"auto"`` chooses bfloat16 only where the hardware computes it natively
(:func:`bf16_native`): a CPU with AVX-512 BF16 or AMX-BF16 instructions, or a CUDA device
with bfloat16 support; elsewhere float32, since emulated bfloat16 is slower than float32.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor

from .errors import ConfigError

PRECISIONS = ("float32", "bf16")
CHOICES = (*PRECISIONS, "auto")
LOW_PRECISION = (torch.bfloat16, torch.float16)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""CPU flags (``/proc/cpuinfo``) of native bfloat16 arithmetic."""

F = TypeVar("F", bound=Callable[..., Any])


def cpu_flags() -> set[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def bf16_native(device: torch.device | str) -> tuple[bool, str]:
    """Whether ``device`` computes bfloat16 natively, and why (for the run header)."""
    device = torch.device(device)
    if device.type == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, ("the CUDA device supports bfloat16" if ok else
                    "the CUDA device has no bfloat16 support")
    if device.type == "cpu":
        found = sorted(cpu_flags() & set(BF16_CPU_FLAGS))
        return (True, f"the CPU has {', '.join(found)}") if found else (
            False, f"the CPU has none of {', '.join(BF16_CPU_FLAGS)}")
    return False, f"no native bfloat16 known on {device.type}"


def resolve_precision(precision: str, device: torch.device | str) -> tuple[str, str]:
    """``(precision, reason)``: ``"float32"`` or ``"bf16"`` for ``precision`` in
    :data:`CHOICES` on ``device``; ``"auto"`` is ``"bf16"`` where it is native."""
    if precision not in CHOICES:
        raise ConfigError(f"precision must be one of {', '.join(CHOICES)}, got {precision!r}")
    if precision != "auto":
        return precision, "as asked"
    native, why = bf16_native(device)
    return ("bf16" if native else "float32"), f"auto: {why}"


def chosen_precision(asked: str, device: torch.device | str,
                     say: Callable[[str], object] | None = None) -> str:
    """:func:`resolve_precision`'s choice; ``say`` (a run's echo) hears which and why, unless
    float32 was asked for (the default says nothing)."""
    chosen, why = resolve_precision(asked, device)
    if asked != "float32" and say is not None:
        say(f"precision: {chosen} ({why})")
    return chosen


def check_precision(fn: str, precision: object) -> str:
    """``precision`` if it is ``"float32"`` or ``"bf16"``; a :class:`ConfigError` naming
    ``fn`` otherwise (``"auto"`` is resolved by the caller that knows the device)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"{fn}: precision must be 'float32' or 'bf16' (resolve 'auto' with "
                          f"funcgraph.precision.resolve_precision), got {precision!r}")
    return str(precision)


def in_precision(fn: F, precision: str, device_type: str) -> F:
    """``fn`` computing under ``precision``: itself for float32, else each call under
    bfloat16 autocast for ``device_type`` (entered in the calling thread)."""
    if check_precision("in_precision", precision) == "float32":
        return fn

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=torch.bfloat16):
            return fn(*args, **kwargs)

    return wrapped  # type: ignore[return-value]


def autocast_on(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` here (never for devices autocast does not
    know, such as ``meta``)."""
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except RuntimeError:  # "unknown device type for autocast"
        return False


@contextlib.contextmanager
def full_precision(x: Tensor) -> Iterator[None]:
    """Suspend autocast for ``x``'s device inside the block (statistics such as batch norm's
    mean and variance are computed in float32); nothing changes when autocast is off."""
    kind = x.device.type
    if autocast_on(kind):
        with torch.autocast(kind, enabled=False):
            yield
    else:
        yield


def autocast_float32(x: Tensor) -> Tensor:
    """``x`` as float32 where autocast is on and ``x`` is an op's bfloat16 or float16 output;
    else ``x`` itself (a model built in bfloat16 without autocast keeps its dtype)."""
    if x.dtype in LOW_PRECISION and autocast_on(x.device.type):
        return x.float()
    return x


def at_least_float32(x: Tensor) -> Tensor:
    """``x`` as float32 when it is bfloat16 or float16, else ``x`` itself (float64 stays): a
    loss or metric that a bfloat16 computation returned, reported and averaged in float32
    (bfloat16 holds 8 significant bits: 37/75 correct would read 0.4941, not 0.4933)."""
    return x.float() if x.dtype in LOW_PRECISION else x


__all__ = ["BF16_CPU_FLAGS", "CHOICES", "LOW_PRECISION", "PRECISIONS", "at_least_float32",
           "autocast_float32", "autocast_on", "bf16_native", "check_precision",
           "chosen_precision", "cpu_flags", "full_precision", "in_precision",
           "resolve_precision"]
