"""``funcgraph tune confirm``: the study's best settings (or a chosen trial's: one on the
front of accuracy against cost), unchanged, on a data set the study
never saw, with several seeds, beside other algorithms' defaults.

Tuning chooses on one data set's validation split; a setting is only worth a default if it
holds on another. Each confirmation run is an ordinary ``meta-train`` run directory under
``STUDY/confirm/`` (``trial6-rgb-shapes-s0`` for the best trial, ``protonet-rgb-shapes-s0``,
...) scored on that
data set's held-out test tasks. A run that finished is read back, not run again, and one that
was interrupted resumes from its checkpoint, so the same command continues a confirmation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ...errors import ConfigError
from ...files import atomic_write
from ...train import Run
from ..meta_training.config import RECORDED_BY_THE_RUN, MetaTrainConfig, default_config
from ..meta_training.loop import meta_train
from ..meta_training.plan import model_config
from ..task_sources import sources_for
from .report import best_trial, command_line
from .space import SearchSpace
from .study import dataset_metric, metric_of

CONFIRM_DIR = "confirm"


@dataclass(frozen=True)
class ConfirmRun:
    """One confirmation run and its held-out score."""

    name: str  # "trialN" (the study's best trial) or the algorithm's name
    seed: int
    command: str
    run_dir: Path
    metric: str  # "acc", or "mse" on regression
    value: float
    ci95: float
    cpu_s: float

    def as_record(self) -> dict[str, Any]:
        return {"confirm": self.name, "seed": self.seed, "metric": self.metric,
                self.metric: round(self.value, 4), f"{self.metric}_ci95": round(self.ci95, 4),
                "cpu_s": round(self.cpu_s, 1), "command": self.command,
                "run_dir": str(self.run_dir)}


def confirm_configs(space: SearchSpace, params: dict[str, Any], dataset: str, *,
                    image_size: int | None, seeds: list[int], against: list[str],
                    label: str = "tuned", baseline_steps: int | None = None,
                    episodes: int | None = None
                    ) -> list[tuple[str, MetaTrainConfig, dict[str, str]]]:
    """``(name, config, model overrides)`` of every confirmation run: the tuned settings on
    ``dataset`` and each ``against`` algorithm's defaults there (``baseline_steps`` steps,
    where given), for every seed; ``episodes`` test tasks each (default: meta-train's)."""
    study = {**space.study, "dataset": dataset, "image_size": image_size}
    tuned = replace(space, study={k: v for k, v in study.items() if v is not None})
    test: dict[str, Any] = {"test_episodes": episodes} if episodes is not None else {}
    runs = []
    for seed in seeds:
        cfg = tuned.config(params, seed=seed)
        runs.append((label, replace(cfg, **test), tuned.model_overrides(params)))
        for algo in against:
            runs.append((algo, default_config(algo, dataset, tasks=space.study.get("tasks"),
                                              image_size=image_size, seed=seed,
                                              steps=baseline_steps, **test), {}))
    return runs


def tuned_on(space: SearchSpace, dataset: str, image_size: int | None) -> bool:
    """Whether ``dataset`` (at ``image_size``) is the data set the study tuned on."""
    return dataset == space.study["dataset"] and image_size == space.study.get("image_size")


def _test_of(run_dir: Path) -> dict[str, Any] | None:
    """The last ``test`` record of the run in ``run_dir``, if there is a run with one."""
    if not (run_dir / "config.json").is_file():
        return None
    tests = [r for r in Run.open(run_dir).metrics() if r.get("kind") == "test"]
    return tests[-1] if tests else None


def _check_same_run(out: Path, cfg: MetaTrainConfig, overrides: dict[str, str]) -> None:
    """Refuse a confirmation directory that holds another run than ``cfg`` (read back, its
    figures would be credited to the wrong settings)."""
    if not (out / "config.json").is_file():
        return
    stored = Run.open(out).config
    want = {k: v for k, v in cfg.to_json().items() if k != "model"
            and not (k in RECORDED_BY_THE_RUN and not v)}  # left to the run, which records it
    differ = sorted(k for k, v in want.items() if stored.get(k, v) != v)
    model = stored.get("model", {})
    differ += sorted(f"model.{k}" for k, v in overrides.items() if str(model.get(k)) != v)
    if differ:
        raise ConfigError(f"{out}: holds a run with other settings ({', '.join(differ)}); "
                          "move it away to confirm these")


def _cpu(study_dir: Path) -> dict[str, float]:
    """CPU seconds of each confirmation run, every attempt added (``confirm/cpu.json``)."""
    path = study_dir / CONFIRM_DIR / "cpu.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _add_cpu(study_dir: Path, name: str, seconds: float) -> None:
    spent = _cpu(study_dir)
    spent[name] = round(spent.get(name, 0.0) + seconds, 2)
    (study_dir / CONFIRM_DIR).mkdir(parents=True, exist_ok=True)
    atomic_write(study_dir / CONFIRM_DIR / "cpu.json", json.dumps(spent, indent=1).encode())


def confirm(study: Any, space: SearchSpace, study_dir: Path, dataset: str, *,
            image_size: int | None = None, seeds: list[int], against: list[str],
            baseline_steps: int | None = None, episodes: int | None = None,
            trial: int | None = None, device: str = "cpu",
            echo: Callable[[str], object] = print) -> list[ConfirmRun]:
    """Run (or read back) every confirmation run of trial ``trial`` (default: the best);
    see the module docstring. A warning line says so when ``dataset`` is the one the study
    tuned on (its figures then confirm nothing)."""
    best = best_trial(study) if trial is None else chosen_trial(study, study_dir, trial)
    if best is None:
        raise ConfigError(f"{study_dir}: no complete trial yet; run the study first")
    if not seeds:
        raise ConfigError("tune confirm: --seeds needs at least one seed, e.g. 0,1,2")
    if dataset_metric(dataset) != metric_of(space):
        raise ConfigError(f"--dataset {dataset}: the study tuned on {space.study['dataset']}, "
                          "a data set of another kind; confirm on one of the same kind")
    if tuned_on(space, dataset, image_size):
        echo(f"warning: --dataset {dataset} is the data set the study tuned on; a "
             "confirmation belongs on one it never saw")
    results = []
    for name, cfg, overrides in confirm_configs(space, best.params, dataset,
                                                image_size=image_size, seeds=seeds,
                                                against=against,
                                                label=f"trial{best.number}",
                                                baseline_steps=baseline_steps,
                                                episodes=episodes):
        out = study_dir / CONFIRM_DIR / f"{name}-{dataset}-s{cfg.seed}"
        command = command_line(cfg, overrides, device=device,
                               threads=torch.get_num_threads())
        _check_same_run(out, cfg, overrides)
        done = _test_of(out)
        if done is None:
            sources = sources_for(cfg)
            cfg = replace(cfg, model=model_config(cfg.algo, sources, overrides=overrides))
            started = time.process_time()
            echo(f"confirm {name} seed {cfg.seed}: {command}")
            try:
                meta_train(cfg, out, resume=(out / "config.json").is_file(), device=device,
                           sources=sources, show_progress=False, echo=echo)
            finally:
                _add_cpu(study_dir, out.name, time.process_time() - started)
            done = _test_of(out)
            assert done is not None
        cpu = _cpu(study_dir).get(out.name, 0.0)
        metric = dataset_metric(dataset)
        results.append(ConfirmRun(name, cfg.seed, command, out, metric, float(done[metric]),
                                  float(done[f"{metric}_ci95"]), cpu))
    return results


def chosen_trial(study: Any, study_dir: Path, number: int) -> Any:
    """Trial ``number`` of the study, refused in one line unless it is complete."""
    trials = study.get_trials(deepcopy=False)
    if not 0 <= number < len(trials):
        held = f"trials 0 to {len(trials) - 1}" if trials else "no trials"
        raise ConfigError(f"--trial {number}: {study_dir} holds {held}")
    if trials[number].state.name != "COMPLETE":
        raise ConfigError(f"--trial {number}: that trial is "
                          f"{trials[number].state.name.lower()}, not complete; confirm a "
                          "complete trial (funcgraph tune show lists them)")
    return trials[number]


def summary(results: list[ConfirmRun]) -> list[dict[str, Any]]:
    """Per name: the mean figure over seeds (accuracy, or error on regression), its range
    and the mean CPU seconds."""
    out = []
    for name in dict.fromkeys(r.name for r in results):
        mine = [r for r in results if r.name == name]
        values, metric = [r.value for r in mine], mine[0].metric
        out.append({"confirm": name, "seeds": [r.seed for r in mine],
                    f"mean_{metric}": round(sum(values) / len(values), 4),
                    f"min_{metric}": round(min(values), 4),
                    f"max_{metric}": round(max(values), 4),
                    "mean_cpu_s": round(sum(r.cpu_s for r in mine) / len(mine), 1)})
    return out


__all__ = ["CONFIRM_DIR", "ConfirmRun", "chosen_trial", "confirm", "confirm_configs", "summary",
           "tuned_on"]
