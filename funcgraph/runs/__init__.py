"""What each command runs, between the algorithms and the command line.

One room per command back end: :mod:`~funcgraph.runs.meta_training` (``meta-train``: its
config, plan and loop), :mod:`~funcgraph.runs.tune` (``tune``: the settings search),
:mod:`~funcgraph.runs.evaluate` (``evaluate``), :mod:`~funcgraph.runs.train` (``train``),
:mod:`~funcgraph.runs.search` (``search``, planned by :mod:`~funcgraph.runs.search_plan`),
:mod:`~funcgraph.runs.export` (``export`` of a run) and :mod:`~funcgraph.runs.graph`
(``graph``), all resolving their models through the one resolver, :func:`resolve_model`. Each
run validates its options, data and model before its run directory is written (``graph`` writes
none: it returns the captured graph). :func:`load_run` (:mod:`~funcgraph.runs.load`) brings a
run's model and checkpoint back into Python. The library below knows nothing of this floor;
the CLI above only parses options and renders results.
"""

from typing import TYPE_CHECKING

from .._exports import lazy_exports
from .evaluate import RecordedTest, RunEvaluation, evaluate_run
from .export import export_run
from .graph import capture_model_graph
from .load import LoadedRun, load_run
from .meta_training.loop import (
    MetaTrainConfig,
    MetaTrainResult,
    default_algo,
    default_config,
    meta_train,
)
from .resolve import ModelSpec, resolve_model, with_overrides
from .search import SearchResult, run_search
from .search_plan import class_halves
from .task_sources import TaskSources, task_sources
from .train import FitResult, TrainConfig, fit, train_config

if not TYPE_CHECKING:  # type checkers see the names and submodules through the imports
    __getattr__, __dir__ = lazy_exports(__name__, submodules=(
        "evaluate", "export", "graph", "load", "meta_training", "search", "search_plan", "train",
        "tune"))


__all__ = [
    "FitResult",
    "LoadedRun",
    "MetaTrainConfig",
    "MetaTrainResult",
    "ModelSpec",
    "RecordedTest",
    "RunEvaluation",
    "SearchResult",
    "TaskSources",
    "TrainConfig",
    "capture_model_graph",
    "default_algo",
    "default_config",
    "evaluate_run",
    "export_run",
    "fit",
    "load_run",
    "class_halves",
    "meta_train",
    "resolve_model",
    "run_search",
    "task_sources",
    "train_config",
    "with_overrides",
]
