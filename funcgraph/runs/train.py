"""What ``funcgraph train`` runs: a preset or config, its data, the loop, the final score.

:func:`train_config` turns the command's options into a :class:`TrainConfig` (the run's
``config.json``); :func:`fit` resolves the model (:func:`~funcgraph.runs.resolve_model`),
loads the data, checks that the model runs on it and outputs one logit per class, and only
then writes the run directory and trains with :func:`funcgraph.train.run_loop`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .. import distributed, random
from ..checks import check_choice, check_int, check_rate, option
from ..data.registry import dataset_type
from ..errors import ConfigError
from ..factory.config import parse_value
from ..model import Model
from ..params import Params, State, count, nbytes, to
from ..placement import placed_model
from ..precision import CHOICES as PRECISION_CHOICES
from ..precision import chosen_precision
from ..random import Key
from ..train import Groups, LoopConfig, Optimizer, Run, adam, cosine_lr, run_loop
from ..train.ownership import CONFIG_FILE
from ..train.supervised import (
    Batch,
    OutputLoss,
    batch_slice,
    batches,
    class_split,
    classification_loss,
    evaluate_batches,
    logits_of,
    sample_batch,
    take_rows,
    train_step,
)
from .curves import write_curves
from .memory import MemoryEstimate, allocated_bytes, available_bytes, check_fit_sizes, check_memory
from .probe import probe
from .resolve import resolve_model, with_overrides

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

_GLYPHS = dataset_type("glyphs")
DATA_DEFAULTS: dict[str, dict[str, Any]] = {
    "glyphs": {"split": _GLYPHS.splits[0], "classes": 100, "val_per_class": 4,
               "image_size": _GLYPHS.image_size},
    "sequences": {"base": 10, "num_classes": 2, "min_length": 1, "max_length": 12,
                  "val_size": 1000},
}
"""Data options (``--set data.classes=20``): glyph characters as a classification set (the
last ``val_per_class`` drawings of every class are held out; the training split and image size
are the dataset registry's), or the digit-sum task."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything a supervised run needs; stored as the run's ``config.json``.

    ``model`` is one of the forms :func:`~funcgraph.runs.resolve_model` takes:
    ``{"name": NAME, **hyperparams}``, ``{"factory": PATH_OR_NAME, "overrides": {...}}`` or
    ``{"genotype": PATH, **network options}``;
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
    precision: str = "float32"
    threads: int = 0
    """CPU threads for torch (``--threads``; 0: the process's count). The run records the count
    it ran with and ``--resume`` sets it again: the rounding of a step depends on it."""

    def __post_init__(self) -> None:
        check_choice("train", "--precision", self.precision, PRECISION_CHOICES)
        check_int("train", "--threads", self.threads, minimum=0)
        for name in ("steps", "batch_size", "checkpoint_every"):
            check_int("train", option(name), getattr(self, name), minimum=1)
        check_int("train", "--validate-every", self.validate_every, minimum=0)
        check_int("train", "--seed", self.seed, minimum=0)
        check_rate("train", "--lr", self.lr)

    def to_json(self) -> dict[str, Any]:
        return {"command": "train", **asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainConfig:
        """The config a train run recorded (its ``config.json``)."""
        known = set(cls.__dataclass_fields__)
        if data.get("command") != "train" or set(data) - known - {"command", "imports"}:
            raise ConfigError(f"config.json: not a train run (keys {sorted(data)[:8]})")
        return cls(**{k: v for k, v in data.items() if k in known})


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
    precision: str = "float32",
    threads: int = 0,
) -> TrainConfig:
    """The :class:`TrainConfig` for ``funcgraph train`` options.

    Arguments:
        model: a preset (:data:`PRESETS`) or a ``funcgraph.factory`` config path or name.
        genotype: a DARTS genotype JSON; the network is its discrete DARTS network
            (``model`` must then be left at its default).
        sets: ``--set`` overrides as text: ``depth=56`` sets a model hyperparameter,
            ``data.classes=20`` a data option (values are JSON literals or plain strings).
        steps, batch_size, lr, validate_every: override the preset's.
        precision: the training step's compute, ``float32``, ``bf16`` or ``auto``
            (:mod:`funcgraph.precision`; resolved for the device when the run starts).
        threads: CPU threads (0: the process's count, recorded when the run starts).
    """
    if genotype is not None and model != "resnet-sd":
        raise ConfigError(f"--genotype trains the genotype's network; it cannot be combined "
                          f"with --model {model}")
    sets = dict(sets or {})
    data_sets = {k[len("data."):]: parse_value(v) for k, v in sets.items() if k.startswith("data.")}
    model_sets = {k: v for k, v in sets.items() if not k.startswith("data.")}
    if genotype is not None:
        base: dict[str, Any] = {"model": {"genotype": genotype, "C": 16, "layers": 8,
                                          "in_channels": 1}, "data": "glyphs"}
    elif model in PRESETS:
        base = json.loads(json.dumps(PRESETS[model]))
    else:
        base = {"model": {"factory": model, "overrides": model_sets}, "data": "glyphs"}
    if "factory" not in base["model"]:
        base["model"] = with_overrides(base["model"], model_sets)
    data_name = base["data"]
    unknown = sorted(set(data_sets) - set(DATA_DEFAULTS[data_name]))
    if unknown:
        raise ConfigError(f"--set data.{unknown[0]}: unknown {data_name} option; expected one "
                          f"of {sorted(DATA_DEFAULTS[data_name])}")
    for name, value in data_sets.items():  # typed as the default is, before anything reads it
        if isinstance(DATA_DEFAULTS[data_name][name], int):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"--set data.{name}: expected an int >= 1, got {value!r}")
        elif not isinstance(value, str):
            raise ConfigError(f"--set data.{name}: expected a name, got {value!r}")
    data = {"name": data_name, **DATA_DEFAULTS[data_name], **data_sets}
    spec = base["model"]
    if "factory" not in spec:  # built-in models and genotypes: size the head from the data
        spec.setdefault("num_classes", data["classes"] if data_name == "glyphs"
                        else data["num_classes"])
        if data_name == "sequences":
            spec.setdefault("vocab_size", int(data["base"]) + 1)
    total = steps if steps is not None else int(base.get("steps", 300))
    return TrainConfig(
        model=spec, data=data, loss=str(base.get("loss", "classification")), steps=total,
        batch_size=batch_size if batch_size is not None else int(base.get("batch_size", 32)),
        lr=lr if lr is not None else float(base.get("lr", 2e-3)), seed=seed,
        validate_every=validate_every if validate_every is not None else max(total // 4, 1),
        checkpoint_every=max(total // 10, 1), precision=precision, threads=threads,
    )


Sampler = Callable[[Key, int], Batch]
StepFn = Callable[[int, Groups], tuple[Groups, dict[str, float]]]
"""``(step, groups) -> (groups, metrics)``: one training step of the run."""


def glyph_classes(split: str, classes: int, val_per_class: int,
                  image_size: int) -> tuple[Batch, Batch]:
    """The glyph classification set: ``(train, val)`` from :func:`class_split`."""
    from ..data import load_glyphs

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


def _loss_fn(name: str) -> OutputLoss:
    if name == "classification":
        return classification_loss
    if name == "early_exit":
        from ..models.early_exit import early_exit_loss

        return early_exit_loss
    raise ConfigError(f"loss: expected classification or early_exit, got {name!r}")


@dataclass(frozen=True)
class TrainPlan:
    """A validated supervised run, before anything is written: what ``--dry-run`` shows."""

    model: Model
    params: Params
    state: State
    sample: Sampler
    val: Batch
    loss_fn: OutputLoss
    train_key: Key
    memory: MemoryEstimate

    @property
    def parameters(self) -> int:
        return count(self.params)


def plan_fit(cfg: TrainConfig, device: torch.device, *, place: str | None = None) -> TrainPlan:
    """Resolve the model, load the data, run the model on two validation examples (it must
    output one logit per class) and refuse a batch the free memory cannot hold. ``place``, a
    placement plan (``"stem=cuda:0,*=cuda:1"``), spreads the params over devices
    (:func:`funcgraph.placement.placed_model`); the data stays on ``device``."""
    model = resolve_model(cfg.model)
    if place is not None:
        model = placed_model(model, place)
    loss_fn = _loss_fn(cfg.loss)
    check_fit_sizes(model, cfg.data, cfg.batch_size, device)  # before anything is allocated
    k_init, k_train, k_val = random.split(random.key(cfg.seed, device=device), 3)
    sample, val, num_classes = load_data(cfg.data, k_val)
    params, state = model.init(k_init)
    if place is None:
        params, state = to(params, device), to(state, device)
    x = batch_slice(val, 2)[0]
    shape = tuple(x.shape) if isinstance(x, Tensor) else "(tokens, mask)"
    (y, _), forward = probe(lambda: allocated_bytes(lambda: model.apply(params, state, x)),
                            f"model {model.name}: cannot run on the {cfg.data['name']} inputs "
                            f"{shape}")
    outputs = logits_of(y).shape[-1]
    if outputs != num_classes:
        raise ConfigError(f"model: outputs {outputs} classes but the data has {num_classes}; "
                          "set the model's number of classes (e.g. --set num_classes=...)")
    per_example = forward / max(int(logits_of(y).shape[0]), 1)
    state_bytes = 4 * nbytes(params)
    memory = MemoryEstimate(int(state_bytes + 3 * per_example * cfg.batch_size),
                            available_bytes(device),
                            f"3x the forward tensors of {cfg.batch_size} examples, params and "
                            "Adam state")
    check_memory(memory, "lower --batch-size")
    return TrainPlan(model, params, state, sample, val, loss_fn, k_train, memory)


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
    tensorboard: bool = False,
    place: str | None = None,
) -> FitResult:
    """Train per ``cfg`` into the run directory ``out`` with :func:`run_loop`: progress,
    periodic validation (best checkpoint by accuracy), atomic checkpoints, metrics.jsonl,
    Ctrl-C saves, ``resume=True`` continues from the last checkpoint. Only ``steps`` may
    differ on resume; with the same ``steps`` the result is bit-identical to an uninterrupted
    run (a new budget stretches the cosine learning-rate schedule from there on).
    With a distributed ``env`` each rank trains on its slice of every batch, gradients and
    batch-norm running statistics are averaged over ranks, and rank 0 alone validates and
    writes (the logged training metrics are rank 0's slice). Batch norm normalises each slice
    with its own statistics (no synchronised batch norm).

    The run records the thread count it ran with (``cfg.threads``; 0 takes the process's) and
    a resume that leaves it at 0 takes the recorded one; another count may be given on resume
    (it moves rounding, not what is computed)."""
    from ..placement import cpu_threads

    if resume and not cfg.threads and (Path(out) / CONFIG_FILE).is_file():
        cfg = replace(cfg, threads=int(Run.open(out).config.get("threads") or 0))
    with cpu_threads(cfg.threads):
        return _fit(replace(cfg, threads=torch.get_num_threads()), out, resume=resume,
                    device=device, show_progress=show_progress, echo=echo, env=env,
                    sync_every=sync_every, tensorboard=tensorboard, place=place)


def _fit(cfg: TrainConfig, out: str | Path, *, resume: bool, device: str, show_progress: bool,
         echo: Callable[[str], Any], env: distributed.DistEnv | None, sync_every: int,
         tensorboard: bool, place: str | None) -> FitResult:
    """:func:`fit` at the run's thread count."""
    from ..placement import resolve_device

    dev = resolve_device(device)
    # config.json records the choice; the run's first lines say which and why
    cfg = replace(cfg, precision=chosen_precision(cfg.precision, dev,
                                                  echo if env is None or env.is_main else None))
    plan = plan_fit(cfg, dev, place=place)
    env = env or distributed.DistEnv()
    run = Run.create(out, cfg.to_json(), resume=resume, may_change=("steps", "threads"), env=env,
                     tensorboard=tensorboard,
                     added={"precision": "float32"})
    try:
        optimizer = adam(cfg.lr)
        groups, start, best = _fit_start(run, plan, optimizer, dev, env, resume=resume)
        validate = _validation(plan)
        loop = LoopConfig(total_steps=cfg.steps, checkpoint_every=cfg.checkpoint_every,
                          validate_every=cfg.validate_every, best_metric="accuracy",
                          items_per_step=cfg.batch_size, item_name="examples",
                          show_progress=show_progress and env.is_main, write=env.is_main,
                          description=f"train {plan.model.name}",
                          meta={"device": dev.type, "world_size": env.world_size})
        if start < cfg.steps:
            groups = run_loop(run, groups, _fit_step(cfg, plan, optimizer, dev, env, sync_every),
                              loop, start_step=start,
                              validate=validate if env.is_main else None, best_value=best,
                              after_validation=lambda _step, _val: write_curves(run.path))
        if not env.is_main:
            return FitResult(run, groups["params"], groups["state"], {})
        final = validate(cfg.steps, groups)
        run.log({"kind": "final", "step": cfg.steps, **final})
        write_curves(run.path)
        echo(f"validation after {cfg.steps} steps: " + "  ".join(f"{k} {v:.4f}"
                                                                for k, v in final.items()))
        return FitResult(run, groups["params"], groups["state"], final)
    finally:
        run.close()


def _fit_start(run: Run, plan: TrainPlan, optimizer: Optimizer, dev: torch.device,
               env: distributed.DistEnv, *, resume: bool) -> tuple[Groups, int, float | None]:
    """``(groups, start step, best validation so far)``: the plan's params and state with a
    fresh optimiser state, or with ``resume`` the run's ``last`` checkpoint (its metrics
    past the checkpoint's step dropped on rank 0)."""
    # Adam adds its "step" counter at the first update; start it at 0 so the checkpoint of any
    # step has the same names as this template (a resume checks names and shapes).
    opt_state = {"step": torch.zeros((), dtype=torch.int64, device=dev),
                 **optimizer.init(plan.params)}
    groups: Groups = {"params": plan.params, "state": plan.state, "opt": opt_state}
    if not (resume and run.has_checkpoint("last")):
        return groups, 0, None
    loaded, meta = run.load("last", expect=groups, device=str(dev))
    start = int(meta["step"])
    if env.is_main:
        run.truncate_metrics(start)
    return {g: loaded[g] for g in groups}, start, meta.get("best_value")


def _fit_step(cfg: TrainConfig, plan: TrainPlan, optimizer: Optimizer, dev: torch.device,
              env: distributed.DistEnv, sync_every: int) -> StepFn:
    """The run's training step ``(i, groups) -> (groups, metrics)``: step ``i`` draws its
    batch and model key from ``fold_in(train key, i)`` (this rank's rows of the batch in a
    data-parallel job, whose gradients are averaged over the ranks) at the cosine learning
    rate of ``i``, and every ``sync_every`` steps checks that the ranks hold the same
    params."""
    sync = (lambda t: distributed.all_reduce_mean(t, env)) if env.active else None
    step = train_step(plan.model, optimizer, loss_fn=plan.loss_fn, sync=sync,
                      precision=cfg.precision)
    mine = distributed.shard(cfg.batch_size, env)
    own_rows = torch.arange(mine.start, mine.stop, device=dev)

    def step_fn(i: int, g: Groups) -> tuple[Groups, dict[str, float]]:
        k_batch, k_model = random.split(random.fold_in(plan.train_key, i))
        x, labels = plan.sample(k_batch, cfg.batch_size)
        if env.active:
            # Every rank keeps the model key: a batch-mode stochastic-depth draw is one per
            # global batch, so all ranks must drop the same blocks.
            x, labels = take_rows(x, own_rows), labels[own_rows]
        p, s, o, metrics = step(g["params"], g["state"], g["opt"], (x, labels),
                                k_model, lr=cosine_lr(cfg.lr, i, cfg.steps))
        if env.active and (i + 1) % sync_every == 0:
            distributed.assert_in_sync(p, env, i + 1)
        return {"params": p, "state": s, "opt": o}, metrics

    return step_fn


def _validation(plan: TrainPlan) -> Callable[[int, Groups], dict[str, float]]:
    """The run's validation ``(i, groups) -> figures``: the plan's model at the groups'
    params and state over the whole validation set, 256 examples at a time."""

    def validate(i: int, g: Groups) -> dict[str, float]:
        return evaluate_batches(plan.model, g["params"], g["state"], batches(plan.val, 256),
                                loss_fn=plan.loss_fn)

    return validate


__all__ = [
    "DATA_DEFAULTS",
    "PRESETS",
    "FitResult",
    "TrainConfig",
    "TrainPlan",
    "fit",
    "glyph_classes",
    "load_data",
    "plan_fit",
    "train_config",
]
