"""Keep freed memory in the process heap, so large CPU tensors are not page-faulted in anew.

glibc serves allocations above its mmap threshold (128 KiB, rising to at most 32 MiB as
large blocks are freed) with fresh ``mmap`` pages and unmaps them on ``free``: every new
activation of that size is first touched page by page. A meta-step allocates and frees the
same large activations once per task, so this repeats 32 times per step; in the 15-query
conv4 step, a max-pool backward's zero fill of a 15 MB gradient took 16 ms per task, nearly
all of it page faults (``torch.profiler``, 2 threads). Raising the mmap and trim thresholds
keeps freed blocks in the heap for reuse. Peak memory is unchanged; the process keeps its
peak until it exits instead of returning memory between steps.

The training commands (``meta-train``, ``train``, ``search``) call
:func:`keep_freed_memory` on start; library users may call it themselves. On other C
libraries (macOS, musl) it does nothing and returns ``False``.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def keep_freed_memory(mmap_threshold: int = 1 << 30, trim_threshold: int = 2**31 - 1) -> bool:
    """Set glibc's mmap and trim thresholds (bytes); ``True`` when glibc took both."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)
                and mallopt(M_TRIM_THRESHOLD, trim_threshold))


__all__ = ["keep_freed_memory"]
