"""How much memory a run will need, measured on one task, and a refusal when it cannot fit.

A meta-batch of 100,000 tasks, or a task spec that sizes a huge model, is otherwise found out
by the kernel's out-of-memory killer, with no message. :func:`allocated_bytes` runs one unit
of work (one task's meta-gradient) while counting the bytes of every tensor torch produces:
an upper bound of what that unit keeps alive, since it includes temporaries freed at once.
:func:`check_memory` compares the scaled estimate with the memory the device has free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import ConfigError

T = TypeVar("T")


class _CountAllocations(TorchDispatchMode):
    """Sums the bytes of every tensor an operator returns."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.bytes += t.numel() * t.element_size()
        return out


def allocated_bytes(fn: Callable[[], T]) -> tuple[T, int]:
    """``(fn(), bytes of all tensors it produced)``."""
    with _CountAllocations() as counter:
        result = fn()
    return result, counter.bytes


def available_bytes(device: torch.device) -> int | None:
    """Free memory of ``device``: ``MemAvailable`` on CPU (Linux), the free CUDA memory on a
    GPU; ``None`` where it cannot be read (the check is then skipped)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def fmt_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclass(frozen=True)
class MemoryEstimate:
    """The bytes a run needs at its peak and what the device has free (``None``: unknown)."""

    needed: int
    available: int | None
    detail: str

    def __str__(self) -> str:
        free = "unknown" if self.available is None else fmt_bytes(self.available)
        return f"about {fmt_bytes(self.needed)} ({self.detail}); free: {free}"


def check_memory(estimate: MemoryEstimate, advice: str) -> None:
    """Refuse a run whose estimate exceeds the free memory, before it is started."""
    if estimate.available is not None and estimate.needed > estimate.available:
        raise ConfigError(f"this run needs about {fmt_bytes(estimate.needed)} "
                          f"({estimate.detail}) but only {fmt_bytes(estimate.available)} is "
                          f"free; {advice}")


__all__ = ["MemoryEstimate", "allocated_bytes", "available_bytes", "check_memory", "fmt_bytes"]
