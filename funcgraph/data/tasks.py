"""N-way K-shot classification tasks sampled from one split, as a few tensor indexings.

A task picks N distinct classes of one :class:`ClassDataset` and K + Q distinct drawings of
each (of its ``counts[c]`` distinct images, when classes differ in size); the first K are the
support set, the other Q the query set, so the two never share an example. Labels are the
classes' positions in a random order, i.e. a fresh random labelling per task. ``T`` tasks are
drawn at once: a few ``(T, N)`` tensor steps choose the classes, one ``(T, N, P)`` block of
uniforms ranks the drawings, and one gather builds every image tensor, so 32 tasks take
milliseconds. Everything comes from the key (funcgraph.random): the same key gives the same
tasks on every run. Images stored as uint8 are converted to float32 in ``[0, 1]`` after the
gather, so only the task's images are ever converted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import random
from ..errors import TaskSpecError
from .datasets import ClassDataset, as_float

DEFAULT_QUERIES = 15
"""Query examples per class when a spec names none: the MAML/prototypical-network evaluation
protocol (and with 5 shots, 5 + 15 = Omniglot's 20 drawings)."""

MAX_COUNT = 1_000_000
"""The largest way, shot or query count a spec may name: beyond any data set, and small
enough that a typo like ``99999999999999999999way1shot`` is refused before it sizes a tensor."""

_SPEC = re.compile(r"(\d+)way(\d+)shot(?:(\d+)query)?")
_FORM = "'<N>way<K>shot' or '<N>way<K>shot<Q>query', e.g. '5way1shot' or '20way5shot15query'"


@dataclass(frozen=True)
class TaskSpec:
    """N-way K-shot with Q query examples per class.

    Attributes:
        ways: classes per task (N >= 2: one class is no classification problem).
        shots: support examples per class (K >= 1).
        queries: query examples per class (Q >= 1), default :data:`DEFAULT_QUERIES`.
    """

    ways: int
    shots: int
    queries: int = DEFAULT_QUERIES

    def __post_init__(self) -> None:
        for name, value, least in (("ways", self.ways, 2), ("shots", self.shots, 1),
                                   ("queries", self.queries, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                hint = " (1-way tasks have nothing to classify)" if name == "ways" else ""
                raise TaskSpecError(
                    f"TaskSpec: {name} must be an int >= {least}{hint}, got {value!r}"
                )
            if value > MAX_COUNT:
                raise TaskSpecError(f"TaskSpec: {name} must be at most {MAX_COUNT:,} (no data "
                                    f"set has more), got {value:,}")

    @classmethod
    def parse(cls, text: str) -> TaskSpec:
        """``"5way1shot"``, ``"20way5shot"``, ``"5way1shot15query"`` -> a TaskSpec."""
        m = _SPEC.fullmatch(text.strip().lower()) if isinstance(text, str) else None
        if m is None:
            raise TaskSpecError(f"task spec {text!r} is not of the form {_FORM}")
        ways, shots = int(m[1]), int(m[2])
        queries = DEFAULT_QUERIES if m[3] is None else int(m[3])
        try:
            return cls(ways, shots, queries)
        except TaskSpecError as e:
            raise TaskSpecError(f"task spec {text!r}: {e}") from None

    def __str__(self) -> str:
        return f"{self.ways}way{self.shots}shot{self.queries}query"


_REGRESSION_SPEC = re.compile(r"(?:\d+way)?(\d+)shot(?:(\d+)query)?")


def regression_spec(text: str, dataset: str = "sinusoid") -> tuple[int, int]:
    """A regression task spec (sinusoid's, or ``dataset``'s): ``"10shot"`` (or
    ``"10shot20query"``; a ``"<N>way"`` prefix is ignored) -> ``(K, Q)``: K points to adapt
    on, Q scored; the query count defaults to K, as in the MAML paper."""
    m = _REGRESSION_SPEC.fullmatch(text.strip().lower()) if isinstance(text, str) else None
    if m is None or int(m[1]) < 1 or (m[2] is not None and int(m[2]) < 1):
        raise TaskSpecError(f"{dataset} task spec {text!r} is not of the form '<K>shot' or "
                            "'<K>shot<Q>query' with K, Q >= 1, e.g. '10shot'")
    return int(m[1]), int(m[2] or m[1])


@dataclass(frozen=True)
class TaskBatch:
    """``T`` classification tasks.

    Attributes:
        support_x: ``(T, N*K, C, H, W)`` float32; support_y: ``(T, N*K)`` int64 labels in
            ``0..N-1``.
        query_x: ``(T, N*Q, C, H, W)``; query_y: ``(T, N*Q)``.
        classes: ``(T, N)`` the dataset class behind each label (label i is ``classes[t, i]``).
    Examples are grouped by label: ``support_y[t] = [0]*K + [1]*K + ...``.
    """

    support_x: Tensor
    support_y: Tensor
    query_x: Tensor
    query_y: Tensor
    classes: Tensor


def check_fits(ds: ClassDataset, spec: TaskSpec) -> None:
    """Refuse ``spec`` on ``ds`` when it has too few classes, or any class too few examples
    (every class can be drawn, so every class needs ``shots + queries``): checked before a run
    builds its model, so an impossible spec costs nothing."""
    if spec.ways > ds.num_classes:
        raise TaskSpecError(
            f"task spec {spec}: {spec.ways}-way tasks need {spec.ways} classes, "
            f"{ds.name} has {ds.num_classes}"
        )
    need = spec.shots + spec.queries
    if need > ds.per_class:
        has = f"{ds.name} has {ds.per_class}"
        if ds.counts is not None:
            small = int(ds.counts.argmin())
            has = (f"class {ds.class_names[small]!r} of {ds.name} has only {ds.per_class} "
                   f"(the classes have {ds.per_class} to {int(ds.counts.max())})")
        raise TaskSpecError(
            f"task spec {spec}: {spec.shots} shots + {spec.queries} queries need "
            f"{need} examples per class, {has}"
        )


_RANK_LIMIT = 256  # up to this many items, ranking uniforms beats sequential draws


def _distinct(
    key: Tensor, batch: tuple[int, ...], n: int, k: int, available: Tensor | None = None
) -> Tensor:
    """``k`` distinct indices from ``range(n)`` per batch entry, in uniformly random order;
    from ``range(available[...])`` where ``available`` (int64, shaped ``batch``, each in
    ``[k, n]``, on the key's device) gives each entry its own range (a class's image count).

    Small ``n``: rank ``n`` uniforms per entry (argsort), the unavailable indices ranked last.
    Large ``n`` (thousands of classes): draw one at a time, the j-th uniform over the
    ``n - j`` indices not yet drawn, mapped to the r-th unused index by stepping over the
    earlier draws in ascending order, so the cost is ``k**2`` small operations instead of
    hashing and sorting ``n`` numbers per task.
    """
    if n <= _RANK_LIMIT:
        u = random.uniform(key, (*batch, n), dtype=torch.float64)
        if available is not None:
            index = torch.arange(n, device=u.device)
            u = torch.where(index < available[..., None], u, 2.0)  # uniforms are < 1
        return u.argsort(-1)[..., :k]
    u = random.uniform(key, (*batch, k), dtype=torch.float64)
    size = n if available is None else available
    picks: list[Tensor] = []
    for j in range(k):
        left = size - j  # indices not yet drawn
        r = (u[..., j] * left).floor().to(torch.int64).clamp(max=left - 1)
        if picks:
            for earlier in torch.stack(picks, -1).sort(-1).values.unbind(-1):
                r = r + (earlier <= r).to(torch.int64)
        picks.append(r)
    return torch.stack(picks, -1)


def sample_tasks(key: Tensor, ds: ClassDataset, spec: TaskSpec, num_tasks: int) -> TaskBatch:
    """Draw ``num_tasks`` tasks of ``spec`` from ``ds`` (see the module docstring).

    Raises:
        TaskSpecError: ``ds`` has fewer classes than ``spec.ways``, or a class has fewer
            examples than ``spec.shots + spec.queries``.
    """
    check_fits(ds, spec)
    if isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 1:
        raise TaskSpecError(f"sample_tasks: num_tasks must be an int >= 1, got {num_tasks!r}")
    T, N, K, Q = num_tasks, spec.ways, spec.shots, spec.queries
    k_cls, k_ex = random.split(key, 2)
    device = ds.images.device
    classes = _distinct(k_cls, (T,), ds.num_classes, N)  # (T, N), on the key's device
    available = None if ds.counts is None else ds.counts.to(classes.device)[classes]
    capacity = int(ds.images.shape[1])
    examples = _distinct(k_ex, (T, N), capacity, K + Q, available).to(device)  # (T, N, K+Q)
    classes = classes.to(device)

    def gather(picked: Tensor) -> Tensor:
        """``(T, N, E)`` example indices -> ``(T, N*E, C, H, W)`` float32 images: one gather
        into a contiguous block, so the flatten is a view."""
        return as_float(ds.images[classes[..., None], picked]).flatten(1, 2)

    y = torch.arange(N, device=device)[None, :, None].expand(T, N, K + Q)
    return TaskBatch(
        support_x=gather(examples[..., :K]),
        support_y=y[:, :, :K].flatten(1, 2),
        query_x=gather(examples[..., K:]),
        query_y=y[:, :, K:].flatten(1, 2),
        classes=classes,
    )


def confidence_interval(values: Tensor) -> tuple[float, float]:
    """``(mean, half_width)`` of per-episode scores with ``half_width = 1.96 * std / sqrt(n)``
    (sample std, ``n - 1``; 0 for n = 1): the 95% interval every evaluation reports."""
    v = values.detach().to(torch.float64).flatten()
    if v.numel() == 0:
        raise TaskSpecError("confidence_interval: need at least one value")
    std = v.std().item() if v.numel() > 1 else 0.0
    return v.mean().item(), 1.96 * std / v.numel() ** 0.5


def nearest_neighbour_accuracy(
    key: Tensor, ds: ClassDataset, spec: TaskSpec, episodes: int, *, chunk: int = 100
) -> tuple[float, float]:
    """The pixel-space 1-nearest-neighbour baseline: ``(mean accuracy, 95% CI half-width)``.

    Each query takes the label of the support image nearest in Euclidean distance over raw
    pixels. Episodes come from ``fold_in(key, i)`` chunk by chunk, so memory stays small.
    """
    check_fits(ds, spec)
    accs = []
    for i, start in enumerate(range(0, episodes, chunk)):
        b = sample_tasks(random.fold_in(key, i), ds, spec, min(chunk, episodes - start))
        q, s = b.query_x.flatten(2), b.support_x.flatten(2)
        dist = torch.cdist(q, s, compute_mode="donot_use_mm_for_euclid_dist")  # (T, NQ, NK)
        pred = b.support_y.gather(1, dist.argmin(-1))
        accs.append((pred == b.query_y).double().mean(-1))
    return confidence_interval(torch.cat(accs))
