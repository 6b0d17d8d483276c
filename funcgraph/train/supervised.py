"""Supervised training and evaluation of any Model with funcgraph's pure optimisers.

:func:`train_step` builds ``step(params, state, opt_state, batch, key) -> (params, state,
opt_state, metrics)``: one ``torch.func.grad`` of the loss, one optimiser update, the model's
returned state kept. :func:`evaluate` averages the loss and its metrics over batches in
evaluation mode. The model's output goes through a ``loss_fn(y, labels) -> (loss, metrics)``;
the default, :func:`classification_loss`, is cross-entropy on logits ``(B, C)`` (or on the
first element of a tuple output, as the early-exit CNN returns).

Stochastic-depth blocks report which of them ran in their returned state; the step adds
their summary (``blocks_ran``, see :func:`funcgraph.nn.ran_metrics`) to the metrics.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import distributed, random
from ..errors import ConfigError, DataError, ShapeError
from ..model import Model
from ..nn.stochastic_depth import ran_metrics
from ..params import Params, State, detach, to
from ..random import Key, randint
from .loop import Groups, LoopConfig, run_loop
from .optim import Optimizer, adam, cosine_lr
from .run import Run

Batch = tuple[Any, Tensor]
"""``(inputs, labels)``: inputs as the model takes them, labels ``(B,)`` int64."""
LossFn = Callable[[Any, Tensor], tuple[Tensor, Mapping[str, Tensor]]]
StepFn = Callable[..., tuple[Params, State, Params, dict[str, float]]]


def logits_of(y: Any) -> Tensor:
    """The logits of a model output: ``y`` itself, or ``y[0]`` for a tuple output."""
    return y[0] if isinstance(y, tuple) else y


def classification_loss(y: Any, labels: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean cross-entropy of the logits against ``labels``, with ``accuracy`` as a metric."""
    logits = logits_of(y)
    loss = F.cross_entropy(logits, labels)
    accuracy = (logits.argmax(-1) == labels).float().mean()
    return loss, {"accuracy": accuracy}


def train_step(
    model: Model,
    optimizer: Optimizer,
    *,
    loss_fn: LossFn = classification_loss,
    sync: Callable[[Params], Params] | None = None,
) -> StepFn:
    """The pure training step of ``model`` under ``optimizer``.

    Returns ``step(params, state, opt_state, batch, key, *, lr=None)`` giving
    ``(params, state, opt_state, metrics)``; ``metrics`` holds ``loss``, the ``loss_fn``'s
    metrics and, for stochastic-depth models, ``blocks_ran``. ``key`` is the only randomness
    (derive it as ``fold_in(root, step)`` so runs resume bit-identically). ``sync``, when
    given, averages the gradients and the floating state (batch-norm running statistics)
    across data-parallel ranks before the update (:func:`funcgraph.distributed.all_reduce_mean`).

    Example::

        step = train_step(resnet(20), adam(1e-3))
        params, state, opt_state, metrics = step(params, state, opt_state, (x, y), key)
    """

    def loss_of(params: Params, state: State, x: Any, labels: Tensor,
                key: Key) -> tuple[Tensor, tuple[State, Mapping[str, Tensor]]]:
        y, new_state = model.apply(params, state, x, key=key, train=True)
        loss, metrics = loss_fn(y, labels)
        return loss, (new_state, metrics)

    grad_fn = torch.func.grad_and_value(loss_of, has_aux=True)

    def step(params: Params, state: State, opt_state: Params, batch: Batch, key: Key, *,
             lr: float | None = None) -> tuple[Params, State, Params, dict[str, float]]:
        x, labels = batch
        grads, (loss, (new_state, metrics)) = grad_fn(params, state, x, labels, key)
        if sync is not None:
            grads = sync(grads)
            floating = {n: t for n, t in new_state.items() if t.is_floating_point()}
            new_state = {**new_state, **sync(floating)}
        kwargs = {} if lr is None else {"lr": lr}
        new_params, new_opt = optimizer.update(params, grads, opt_state, **kwargs)
        out = {"loss": float(loss), **{k: float(v) for k, v in metrics.items()}}
        out.update(ran_metrics(new_state))
        return detach(new_params), detach(new_state), detach(new_opt), out

    return step


def class_split(images: Tensor, *, num_classes: int | None = None,
                val_per_class: int = 4) -> tuple[Batch, Batch]:
    """A classification set from a class-indexed image tensor (a ``ClassDataset.images``).

    Arguments:
        images: ``(num_classes, per_class, C, H, W)``.
        num_classes: keep the first this many classes (``None``: all).
        val_per_class: the last this many examples of every class form the validation set.
    Returns:
        ``(train, val)``, each ``(inputs (N, C, H, W), labels (N,))`` with label = class index.
    """
    if images.dim() != 5:
        raise ShapeError(f"class_split: images must be (classes, per_class, C, H, W), "
                         f"got {tuple(images.shape)}")
    total, per_class = int(images.shape[0]), int(images.shape[1])
    keep = total if num_classes is None else num_classes
    if not 2 <= keep <= total:
        raise ConfigError(f"class_split: num_classes must be in [2, {total}], got {keep}")
    if not 1 <= val_per_class < per_class:
        raise ConfigError(
            f"class_split: val_per_class must be in [1, {per_class - 1}], got {val_per_class}"
        )
    images = images[:keep]
    labels = torch.arange(keep).unsqueeze(1).expand(keep, per_class)  # (classes, per_class)
    cut = per_class - val_per_class

    def flat(part: slice) -> Batch:
        return images[:, part].flatten(0, 1), labels[:, part].flatten(0, 1)

    return flat(slice(0, cut)), flat(slice(cut, None))


def sample_batch(key: Key, data: Batch, batch_size: int) -> Batch:
    """``batch_size`` examples of ``data = (inputs, labels)`` drawn uniformly with replacement
    from ``key`` (inputs may be a tensor or a tuple of tensors sharing the leading dim)."""
    labels = data[1]
    idx = randint(key, (batch_size,), 0, int(labels.shape[0])).to(labels.device)
    return _take(data[0], idx), labels[idx]


def batches(data: Batch, batch_size: int) -> Iterator[Batch]:
    """``data`` in order, in batches of ``batch_size`` (the last one may be smaller)."""
    n = int(data[1].shape[0])
    for start in range(0, n, batch_size):
        idx = torch.arange(start, min(start + batch_size, n), device=data[1].device)
        yield _take(data[0], idx), data[1][idx]


def _take(inputs: Any, idx: Tensor) -> Any:
    if isinstance(inputs, tuple):
        return tuple(t[idx] for t in inputs)
    return inputs[idx]


def evaluate(
    model: Model,
    params: Params,
    state: State,
    batches: Iterable[Batch],
    *,
    loss_fn: LossFn = classification_loss,
) -> dict[str, float]:
    """Loss and metrics of ``model`` in evaluation mode, averaged over examples of ``batches``.

    Evaluation is deterministic (no key); the state is used, never updated.
    """
    totals: dict[str, float] = {}
    count = 0
    with torch.no_grad():
        for x, labels in batches:
            y, _ = model.apply(params, state, x, train=False)
            loss, metrics = loss_fn(y, labels)
            n = int(labels.shape[0])
            for k, v in {"loss": loss, **metrics}.items():
                totals[k] = totals.get(k, 0.0) + float(v) * n
            count += n
    if count == 0:
        raise ValueError("evaluate: no batches to evaluate")
    return {k: v / count for k, v in totals.items()}




# --- a supervised run: the machinery behind ``funcgraph train`` -----------------------------

PRESETS: dict[str, dict[str, Any]] = {
    "resnet-sd": {"model": {"name": "resnet", "depth": 20, "width": 16, "in_channels": 1},
                  "data": "glyphs", "loss": "classification", "steps": 300, "batch_size": 32,
                  "lr": 2e-3},
    "early-exit": {"model": {"name": "early_exit_cnn", "width": 32, "in_channels": 1},
                   "data": "glyphs", "loss": "early_exit", "steps": 400, "batch_size": 64,
                   "lr": 2e-3},
    "rnn": {"model": {"name": "rnn_classifier", "embed_dim": 32, "hidden_size": 64},
            "data": "sequences", "loss": "classification", "steps": 600, "batch_size": 64,
            "lr": 5e-3},
}
"""Built-in ``--model`` choices: the model (a ``funcgraph.models`` registry entry), its data,
loss and the step budget that finishes in a few minutes on two CPU cores."""

DATA_DEFAULTS: dict[str, dict[str, Any]] = {
    "glyphs": {"split": "background", "classes": 100, "val_per_class": 4, "image_size": 28},
    "sequences": {"base": 10, "num_classes": 2, "min_length": 1, "max_length": 12,
                  "val_size": 1000},
}
"""Data options (``--set data.classes=20``): glyph characters as a classification set (the
last ``val_per_class`` drawings of every class are held out), or the digit-sum task."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything a supervised run needs; stored as the run's ``config.json``.

    ``model`` is ``{"name": NAME, **hyperparams}`` (see :func:`funcgraph.models.build`),
    ``{"factory": PATH_OR_NAME, "overrides": {...}}`` or ``{"genotype": PATH, **kwargs}``;
    ``data`` is ``{"name": "glyphs" | "sequences", **options}``; ``loss`` is
    ``"classification"`` or ``"early_exit"``.
    """

    model: dict[str, Any]
    data: dict[str, Any]
    loss: str = "classification"
    steps: int = 300
    batch_size: int = 32
    lr: float = 2e-3
    seed: int = 0
    validate_every: int = 100
    checkpoint_every: int = 100

    def to_json(self) -> dict[str, Any]:
        return {"command": "train", **asdict(self)}


def train_config(
    model: str = "resnet-sd",
    *,
    genotype: str | None = None,
    sets: Mapping[str, str] | None = None,
    steps: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    seed: int = 0,
    validate_every: int | None = None,
) -> TrainConfig:
    """The :class:`TrainConfig` for ``funcgraph train`` options.

    Arguments:
        model: a preset (:data:`PRESETS`) or a ``funcgraph.factory`` config path or name.
        genotype: a DARTS genotype JSON; the network comes from
            ``funcgraph.nas.network_from_genotype`` (``model`` is then ignored).
        sets: ``--set`` overrides as text: ``depth=56`` sets a model hyperparameter,
            ``data.classes=20`` a data option (values are JSON literals or plain strings).
        steps, batch_size, lr, validate_every: override the preset's.
    """
    from ..factory.config import parse_value

    sets = dict(sets or {})
    data_sets = {k[len("data."):]: parse_value(v) for k, v in sets.items() if k.startswith("data.")}
    model_sets = {k: v for k, v in sets.items() if not k.startswith("data.")}
    if genotype is not None:
        base: dict[str, Any] = {"model": {"genotype": genotype, "C": 16, "layers": 8,
                                          "in_channels": 1}, "data": "glyphs"}
        base["model"].update({k: parse_value(v) for k, v in model_sets.items()})
    elif model in PRESETS:
        base = json.loads(json.dumps(PRESETS[model]))
        base["model"].update({k: parse_value(v) for k, v in model_sets.items()})
    else:
        base = {"model": {"factory": model, "overrides": model_sets}, "data": "glyphs"}
    data_name = base["data"]
    unknown = sorted(set(data_sets) - set(DATA_DEFAULTS[data_name]))
    if unknown:
        raise ConfigError(f"--set data.{unknown[0]}: unknown {data_name} option; expected one "
                          f"of {sorted(DATA_DEFAULTS[data_name])}")
    data = {"name": data_name, **DATA_DEFAULTS[data_name], **data_sets}
    spec = base["model"]
    if "factory" not in spec:  # built-in models and genotypes: size the head from the data
        spec.setdefault("num_classes", data["classes"] if data_name == "glyphs"
                        else data["num_classes"])
        if data_name == "sequences":
            spec.setdefault("vocab_size", int(data["base"]) + 1)
    total = steps or int(base.get("steps", 300))
    return TrainConfig(
        model=spec, data=data, loss=str(base.get("loss", "classification")), steps=total,
        batch_size=batch_size or int(base.get("batch_size", 32)),
        lr=lr or float(base.get("lr", 2e-3)), seed=seed,
        validate_every=validate_every if validate_every is not None else max(total // 4, 1),
        checkpoint_every=max(total // 10, 1),
    )


def build_model(spec: Mapping[str, Any]) -> Model:
    """The Model of a :class:`TrainConfig` ``model`` entry."""
    spec = dict(spec)
    if "factory" in spec:
        try:
            from ..factory import load_model
        except ImportError:
            raise ConfigError(f"--model {spec['factory']}: not a preset ({sorted(PRESETS)}) and "
                              "funcgraph.factory is not available to load it") from None
        return load_model(str(spec["factory"]), dict(spec.get("overrides", {})))
    if "genotype" in spec:
        try:
            from ..nas import network_from_genotype
        except ImportError:
            raise ConfigError("--genotype: funcgraph.nas (network_from_genotype) is not "
                              "available in this installation") from None
        path = spec.pop("genotype")
        try:
            return network_from_genotype(path, **spec)
        except TypeError as e:
            raise ConfigError(f"--genotype: bad network option: {e}") from None
    from ..models import build

    return build(spec)


Sampler = Callable[[Key, int], Batch]


def glyph_classes(split: str, classes: int, val_per_class: int,
                  image_size: int) -> tuple[Batch, Batch]:
    """The glyph classification set: ``(train, val)`` from :func:`class_split`."""
    try:
        from ..data import load_glyphs
    except ImportError:
        raise DataError("glyphs: funcgraph.data.load_glyphs is not available") from None
    ds = load_glyphs(split, image_size=image_size)
    return class_split(ds.images, num_classes=classes, val_per_class=val_per_class)


def load_data(data: Mapping[str, Any], key: Key) -> tuple[Sampler, Batch, int]:
    """``(sample(key, batch_size) -> batch, validation set, number of classes)`` for a
    :class:`TrainConfig` ``data`` entry; ``key`` fixes the generated validation set."""
    opts = {k: v for k, v in data.items() if k != "name"}
    if data["name"] == "glyphs":
        train, val = glyph_classes(opts["split"], opts["classes"], opts["val_per_class"],
                                   opts["image_size"])
        train = (train[0].to(key.device), train[1].to(key.device))
        val = (val[0].to(key.device), val[1].to(key.device))
        return (lambda k, n: sample_batch(k, train, n)), val, int(opts["classes"])
    from ..data.sequences import SequenceTask

    val_size = int(opts.pop("val_size"))
    task = SequenceTask(**opts)
    return task.sample, task.sample(key, val_size), task.num_classes


def _loss_fn(name: str) -> LossFn:
    if name == "classification":
        return classification_loss
    if name == "early_exit":
        from ..models.early_exit import early_exit_loss

        return early_exit_loss
    raise ConfigError(f"loss: expected classification or early_exit, got {name!r}")


@dataclass(frozen=True)
class FitResult:
    """A finished (or resumed-to-the-end) supervised run."""

    run: Run
    params: Params
    state: State
    validation: dict[str, float]


def fit(
    cfg: TrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    device: str = "cpu",
    show_progress: bool = True,
    echo: Callable[[str], Any] = print,
    env: distributed.DistEnv | None = None,
    sync_every: int = 50,
) -> FitResult:
    """Train per ``cfg`` into the run directory ``out`` with :func:`run_loop`: progress,
    periodic validation (best checkpoint by accuracy), atomic checkpoints, metrics.jsonl,
    Ctrl-C saves, ``resume=True`` continues from the last checkpoint. Only ``steps`` may
    differ on resume; with the same ``steps`` the result is bit-identical to an uninterrupted
    run (a new budget stretches the cosine learning-rate schedule from there on).
    With a distributed ``env`` each rank trains on its slice of every batch, gradients and
    batch-norm running statistics are averaged over ranks, and rank 0 alone validates and
    writes (the logged training metrics are rank 0's slice). Batch norm normalises each slice
    with its own statistics (no synchronised batch norm)."""
    from ..placement import resolve_device

    dev = resolve_device(device)
    model = build_model(cfg.model)
    loss_fn = _loss_fn(cfg.loss)
    k_init, k_train, k_val = random.split(random.key(cfg.seed, device=dev), 3)
    sample, val, num_classes = load_data(cfg.data, k_val)
    params, state = model.init(k_init)
    params, state = to(params, dev), to(state, dev)
    probe = batch_slice(val, 2)[0]
    try:
        y, _ = model.apply(params, state, probe)
    except (RuntimeError, ValueError) as e:  # a torch shape error: the model does not fit
        shape = tuple(probe.shape) if isinstance(probe, Tensor) else "(tokens, mask)"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"model {model.name}: cannot run on the {cfg.data['name']} inputs "
                          f"{shape}: {first}") from None
    outputs = logits_of(y).shape[-1]
    if outputs != num_classes:
        raise ConfigError(f"model: outputs {outputs} classes but the data has {num_classes}; "
                          "set the model's number of classes (e.g. --set num_classes=...)")
    env = env or distributed.DistEnv()
    run = Run.create(out, cfg.to_json(), resume=resume, may_change=("steps",), env=env)
    optimizer = adam(cfg.lr)
    # Adam adds its "step" counter at the first update; start it at 0 so the checkpoint of any
    # step has the same names as this template (a resume checks names and shapes).
    opt_state = {"step": torch.zeros((), dtype=torch.int64, device=dev),
                 **optimizer.init(params)}
    groups: Groups = {"params": params, "state": state, "opt": opt_state}
    start, best = 0, None
    if resume and run.has_checkpoint("last"):
        loaded, meta = run.load("last", expect=groups, device=str(dev))
        groups = {g: loaded[g] for g in groups}
        start, best = int(meta["step"]), meta.get("best_value")
        if env.is_main:
            run.truncate_metrics(start)
    sync = (lambda t: distributed.all_reduce_mean(t, env)) if env.active else None
    step = train_step(model, optimizer, loss_fn=loss_fn, sync=sync)
    mine = distributed.shard(cfg.batch_size, env)
    own_rows = torch.arange(mine.start, mine.stop, device=dev)

    def step_fn(i: int, g: Groups) -> tuple[Groups, dict[str, float]]:
        k_batch, k_model = random.split(random.fold_in(k_train, i))
        x, labels = sample(k_batch, cfg.batch_size)
        if env.active:
            # Every rank keeps the model key: a batch-mode stochastic-depth draw is one per
            # global batch, so all ranks must drop the same blocks.
            x, labels = _take(x, own_rows), labels[own_rows]
        p, s, o, metrics = step(g["params"], g["state"], g["opt"], (x, labels),
                                k_model, lr=cosine_lr(cfg.lr, i, cfg.steps))
        if env.active and (i + 1) % sync_every == 0:
            distributed.assert_in_sync(p, env, i + 1)
        return {"params": p, "state": s, "opt": o}, metrics

    def validate(i: int, g: Groups) -> dict[str, float]:
        return evaluate(model, g["params"], g["state"], batches(val, 256), loss_fn=loss_fn)

    loop = LoopConfig(total_steps=cfg.steps, checkpoint_every=cfg.checkpoint_every,
                      validate_every=cfg.validate_every, best_metric="accuracy",
                      items_per_step=cfg.batch_size, item_name="examples",
                      show_progress=show_progress and env.is_main, write=env.is_main,
                      description=f"train {model.name}",
                      meta={"device": dev.type, "world_size": env.world_size})
    if start < cfg.steps:
        groups = run_loop(run, groups, step_fn, loop, start_step=start,
                          validate=validate if env.is_main else None, best_value=best)
    if not env.is_main:
        return FitResult(run, groups["params"], groups["state"], {})
    final = validate(cfg.steps, groups)
    run.log({"kind": "final", "step": cfg.steps, **final})
    echo(f"validation after {cfg.steps} steps: " + "  ".join(f"{k} {v:.4f}"
                                                            for k, v in final.items()))
    return FitResult(run, groups["params"], groups["state"], final)


def batch_slice(data: Batch, n: int) -> Batch:
    """The first ``n`` examples of ``data``."""
    return _take(data[0], torch.arange(min(n, int(data[1].shape[0])),
                                       device=data[1].device)), data[1][:n]


__all__ = [
    "DATA_DEFAULTS",
    "PRESETS",
    "Batch",
    "FitResult",
    "LossFn",
    "TrainConfig",
    "batch_slice",
    "batches",
    "build_model",
    "class_split",
    "classification_loss",
    "evaluate",
    "fit",
    "glyph_classes",
    "load_data",
    "logits_of",
    "sample_batch",
    "train_config",
    "train_step",
]
