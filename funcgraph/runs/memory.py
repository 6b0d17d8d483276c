"""How much memory a run will need, and a refusal when it cannot fit, before it is allocated.

A meta-batch of 100,000 tasks, a 10**6-wide layer or a 10**8-shot task is otherwise found out
by the allocator's traceback or the kernel's out-of-memory killer. Two estimates, each checked
by :func:`check_memory` against the memory the device has free:

* from shapes alone, before anything real exists (:func:`check_sizes`): the model's
  parameters as meta tensors (:func:`funcgraph.factory.meta_tensors.meta_init`), the data a step
  holds, and one forward pass on a meta example, whose op outputs :func:`allocated_bytes`
  counts without allocating them; times the examples of a step;
* measured, once that check has passed (:func:`allocated_bytes` around one real unit of work,
  one task's meta-gradient): an upper bound of what that unit keeps alive, since it includes
  temporaries freed at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import ConfigError
from ..factory.meta_tensors import MAX_NUMEL, meta_init
from ..model import Model
from ..params import Params, nbytes

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
    return _proc_bytes("/proc/meminfo", "MemAvailable") if device.type == "cpu" else None


def resident_bytes() -> int:
    """This process's resident memory now (the torch runtime, data, models): ``VmRSS`` of
    ``/proc/self/status`` on Linux, 0 where it cannot be read. A peak that a user sees is
    this plus what a step allocates, so ratios of peaks count it on both sides."""
    return _proc_bytes("/proc/self/status", "VmRSS") or 0


def _proc_bytes(path: str, field: str) -> int | None:
    """A ``field:  N kB`` line of a Linux ``/proc`` file, in bytes; ``None`` where the file
    cannot be read or has no such field."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30,
               "t": 2**40, "tib": 2**40}


def parse_bytes(who: str, text: str) -> int:
    """``"2GiB"``, ``"1.5GB"``, ``"800M"`` (binary: ``M`` is ``MiB``) or ``"1000000"`` -> bytes;
    a :class:`~funcgraph.errors.ConfigError` naming ``who`` for anything else."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", text)
    unit = found.group(2).lower() if found else ""
    if found is None or unit not in _BYTE_UNITS or float(found.group(1)) * _BYTE_UNITS[unit] < 1:
        raise ConfigError(f"{who}: expected a size such as 2GiB, 1.5GB or 800MiB, got {text!r}")
    return int(float(found.group(1)) * _BYTE_UNITS[unit])


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


def meta_example(shape: Any, dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> Any:
    """A meta tensor of ``shape``, a tuple of ints (a tuple of such tensors for a tuple of
    shapes, one dtype each), refusing a shape whose element count no tensor can hold."""
    if shape and isinstance(shape[0], tuple):
        return tuple(meta_example(s, (d,)) for s, d in zip(shape, dtypes, strict=True))
    numel = math.prod(shape)
    if numel > MAX_NUMEL:
        raise ConfigError(f"an input of shape {list(shape)} has {numel:.3g} elements; a torch "
                          f"tensor holds at most 2**63 - 1 ({MAX_NUMEL:.3g})")
    return torch.empty(shape, dtype=dtypes[0], device="meta")


def forward_bytes(model: Model, params: Params, state: Params, x: Any) -> int | None:
    """Bytes of every tensor one forward pass of ``model`` on the meta input ``x`` produces,
    counted on meta tensors (nothing is allocated); ``None`` for a model some of whose ops
    have no meta kernel (the measured estimate then covers it)."""
    try:
        with torch.device("meta"):
            return allocated_bytes(lambda: model.apply(params, state, x))[1]
    except Exception:  # no meta kernel, or data-dependent code; never a user-facing failure
        return None


_COPIES = ", gradients and optimiser state"


@dataclass(frozen=True)
class Sizes:
    """What a run holds at once, from shapes alone: ``copies`` of the parameters (the params,
    their gradient and optimiser state), ``data`` bytes, and ``examples`` forward passes of
    one example each."""

    examples: int
    data: int
    copies: int = 4
    what: str = "examples"
    scale: float = 1.0  # the example's activations over those of the meta example measured


def check_sizes(model: Model, example: Any, sizes: Sizes, device: torch.device,
                advice: str) -> MemoryEstimate:
    """Refuse, before anything is allocated, a run whose parameters, data and activations
    (``sizes``; one example's forward counted on meta, :func:`forward_bytes`) exceed the
    free memory of ``device``: one :class:`ConfigError` line with the estimate and the free
    memory. ``example``: a meta input of batch size one (:func:`meta_example`).

    Raises:
        ConfigError: too big, or a tensor bigger than torch can count.
    """
    params, state = meta_init(model)
    params_bytes = sizes.copies * nbytes(params) + nbytes(state)
    free = available_bytes(device)
    check_memory(MemoryEstimate(  # too big already: refused before the forward is counted
        params_bytes + sizes.data, free, f"{fmt_bytes(params_bytes)} of params"
        f"{_COPIES if sizes.copies > 1 else ''}, {fmt_bytes(sizes.data)} of data, before "
        "activations"), advice)
    per_example = int((forward_bytes(model, params, state, example) or 0) * sizes.scale)
    estimate = MemoryEstimate(
        params_bytes + sizes.data + sizes.examples * per_example, free,
        f"{fmt_bytes(params_bytes)} of params{_COPIES if sizes.copies > 1 else ''}, "
        f"{fmt_bytes(sizes.data)} of data, {sizes.examples:,} {sizes.what} of "
        f"{fmt_bytes(per_example)} of activations each")
    check_memory(estimate, advice)
    return estimate


def check_task_sizes(model: Model, cfg: Any, sources: Any, device: torch.device) -> None:
    """:func:`check_sizes` for meta-training, before the meta-parameters or a task exist:
    the model's parameters (with the optimiser's copies), a meta-batch of task data
    (``cfg.meta_batch`` tasks of ways x (shots + training queries) examples) and one task's
    forward pass. ``cfg`` is a :class:`~funcgraph.runs.MetaTrainConfig`, ``sources`` its
    :class:`~funcgraph.runs.TaskSources`."""
    from ..data.tasks import regression_spec

    shape: tuple[int, ...]
    if sources.kind == "regression":
        shots, queries = regression_spec(cfg.tasks, cfg.dataset)
        examples, shape = shots + queries, (1, 1)
    else:  # (1, channels, size, size)
        from ..data.tasks import TaskSpec

        spec = TaskSpec.parse(cfg.tasks)
        examples = spec.ways * (spec.shots + (cfg.train_queries or spec.queries))
        shape = (1, int(sources.in_channels), int(sources.image_size), int(sources.image_size))
    example = meta_example(shape)
    data = cfg.meta_batch * examples * (example.numel() * example.element_size() + 8)
    check_sizes(model, example, Sizes(examples, data, what="examples of one task"), device,
                "lower --meta-batch or the task's shots and queries, or use a smaller model")


def check_fit_sizes(model: Model, data: Mapping[str, Any], batch_size: int,
                    device: torch.device) -> None:
    """:func:`check_sizes` for supervised training, before the data or the params exist: the
    params with gradient and Adam state, a batch plus the validation set, and three forward
    passes' activations per example of a batch. ``data`` is a
    :class:`~funcgraph.runs.TrainConfig`'s ``data`` entry. Sequences are measured at 16 steps
    and scaled to ``max_length`` (the activations grow linearly with the steps, and a meta
    forward of 10**5 steps would itself take minutes)."""
    scale = 1.0
    if data["name"] == "sequences":
        length = int(data["max_length"])
        short = min(length, 16)
        example = meta_example(((1, short), (1, short)), (torch.int64, torch.bool))
        scale, held, item = length / short, int(data["val_size"]) + batch_size, 9 * length
    else:
        size = int(data["image_size"])
        example = meta_example((1, 1, size, size))
        held = batch_size + int(data["classes"]) * int(data["val_per_class"])
        item = example.numel() * example.element_size() + 8
    check_sizes(model, example, Sizes(3 * batch_size, held * item, what="example forwards "
                                      "(3 per example of a batch)", scale=scale), device,
                "lower --batch-size or the data's sizes, or use a smaller model")


def check_input_sizes(model: Model, shape: tuple[int, ...], device: torch.device) -> None:
    """:func:`check_sizes` for one forward pass on a random input of ``shape`` (batch
    included), as ``funcgraph graph`` runs: the params, the input and the activations."""
    example = meta_example(shape)
    check_sizes(model, example, Sizes(1, example.numel() * example.element_size(), copies=1,
                                      what="forward pass"), device,
                "use a smaller --input-shape or model")


SEARCH_SCALE = 4.0
"""How far past the default search (``-C 8 --layers 5 --batch-size 32``, 16 px: a peak under
1 GiB) a DARTS search may be scaled before :func:`check_search_sizes` counts it on meta
tensors, which takes seconds for a supernet (each mixed op is a dozen layers)."""


def check_search_sizes(model: Model, *, channels: int, layers: int, batch_size: int,
                       image_shape: tuple[int, ...], device: torch.device) -> None:
    """:func:`check_sizes` for a DARTS search whose supernet (``channels`` squared times
    ``layers``) or activations (``batch_size`` x pixels x ``channels`` x ``layers``) are more
    than :data:`SEARCH_SCALE` times the default search's: the params with gradient, momentum
    and the architecture's Adam state, the training and validation batches, and three forward
    passes' activations per example of each. ``image_shape``: ``(C, H, W)``."""
    params_scale = channels ** 2 * layers / (8 ** 2 * 5)
    activation_scale = batch_size * math.prod(image_shape[-2:]) * channels * layers / (
        32 * 16 * 16 * 8 * 5)
    if max(params_scale, activation_scale) <= SEARCH_SCALE:
        return
    example = meta_example((1, *image_shape))
    data = 2 * batch_size * (example.numel() * example.element_size() + 8)
    check_sizes(model, example, Sizes(6 * batch_size, data, what="example forwards (3 per "
                                      "example of the training and validation batches)"),
                device, "lower -C, --layers, --batch-size or --image-size")


__all__ = ["SEARCH_SCALE", "MemoryEstimate", "Sizes", "allocated_bytes", "available_bytes",
           "check_fit_sizes", "check_input_sizes", "check_memory", "check_search_sizes",
           "check_sizes", "check_task_sizes", "fmt_bytes", "forward_bytes", "meta_example",
           "parse_bytes", "resident_bytes"]
