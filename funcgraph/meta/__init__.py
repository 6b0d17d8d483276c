"""Meta-learning: MAML, first-order MAML, Meta-SGD, ANIL, MAML++, implicit MAML, Reptile,
prototypical networks.

The short path: a learner built straight from your ``nn.Module`` (``maml(module)``), a
:class:`MetaTrainer` over a frozen :class:`TrainState` (``init``, ``step``, ``evaluate``) and
:func:`tasks` for meta-batches of a named data set. The pure pieces below are the long path.

Every algorithm is a :class:`MetaLearner`, pure functions over a flat dict of
meta-parameters taking any ``apply(params, x)``; :mod:`.strategy` maps them over a batch of
tasks (``vmap``, a loop or threads), :func:`meta_step` is one step of meta-training (the
mean meta-gradient of a batch of tasks and the optimiser's update) and :mod:`.evaluate`
scores held-out tasks with a 95% CI. Each algorithm's settings are a typed record
(:mod:`.settings`) whose defaults are the algorithm's everywhere, and :mod:`.registry` names
every algorithm a run can use (``register_algorithm`` adds one of your own). The run behind
``funcgraph meta-train`` (config, checkpoints, validation) is
:mod:`funcgraph.runs.meta_training.loop`.

Each name loads its module on first use (PEP 562): the registry and the settings import no
torch, so ``funcgraph meta-train --help`` lists the algorithms without loading one.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from .._exports import lazy_exports

_EXPORTS: dict[str, tuple[str, ...]] = {
    "cg": ("CGResult", "conjugate_gradient", "hessian_vector"),
    "compiled": ("CompileFallback", "use_compile_cache"),
    "evaluate": ("EvalResult", "TaskSampler", "confidence_interval", "evaluate"),
    "imaml": ("ImplicitGrad", "imaml", "imaml_solve", "proximal_adapt"),
    "learner": ("LEARNER_PREFIXES", "LR_PREFIX", "STEP_BN_PREFIX", "STEP_LR_PREFIX",
                "MetaLearner", "Objective", "Task", "accuracy", "model_params", "objective"),
    "maml_family": ("InnerLoop", "adapt", "anil", "fomaml", "maml", "metasgd",
                    "remat_task_grad", "task_loss"),
    "mamlpp": ("mamlpp", "mamlpp_loss", "msl_weights", "step_params"),
    "protonet": ("protonet", "protonet_logits", "prototypes", "squared_distances"),
    "registry": ("AlgorithmType", "Recipe", "TaskInfo", "algorithm_names", "algorithm_type",
                 "register_algorithm"),
    "reptile": ("reptile",),
    "running_stats": ("step_running_stats", "with_step_running_stats"),
    "settings": ("AdaptSettings", "FomamlSettings", "ImamlSettings", "MamlSettings",
                 "MamlppSettings", "ProtonetSettings", "ReptileSettings", "Settings"),
    "step": ("StepMetrics", "meta_step"),
    "strategy": ("CPU_VMAP_CHUNK", "CPU_VMAP_MAX_EXAMPLES", "DEFAULT_STRATEGY", "STRATEGIES",
                 "default_chunk_size", "default_strategy", "mean_task_grads",
                 "measure_strategies", "resolve_strategy", "task_evals"),
    "task_stream": ("TaskStream", "tasks"),
    "trainer": ("MetaTrainer", "TrainState"),
}
"""Module -> the public names it defines: the one list of this package's surface."""

if TYPE_CHECKING:  # the same names for type checkers, which cannot read _EXPORTS
    from ..model import BoundApply  # noqa: F401
    from .cg import CGResult, conjugate_gradient, hessian_vector  # noqa: F401
    from .compiled import CompileFallback, use_compile_cache  # noqa: F401
    from .evaluate import EvalResult, TaskSampler, confidence_interval, evaluate  # noqa: F401
    from .imaml import ImplicitGrad, imaml, imaml_solve, proximal_adapt  # noqa: F401
    from .learner import (  # noqa: F401
        LEARNER_PREFIXES,
        LR_PREFIX,
        STEP_BN_PREFIX,
        STEP_LR_PREFIX,
        MetaLearner,
        Objective,
        Task,
        accuracy,
        model_params,
        objective,
    )
    from .maml_family import (  # noqa: F401
        InnerLoop,
        adapt,
        anil,
        fomaml,
        maml,
        metasgd,
        remat_task_grad,
        task_loss,
    )
    from .mamlpp import mamlpp, mamlpp_loss, msl_weights, step_params  # noqa: F401
    from .protonet import protonet, protonet_logits, prototypes, squared_distances  # noqa: F401
    from .registry import (  # noqa: F401
        AlgorithmType,
        Recipe,
        TaskInfo,
        algorithm_names,
        algorithm_type,
        register_algorithm,
    )
    from .reptile import reptile  # noqa: F401
    from .running_stats import step_running_stats, with_step_running_stats  # noqa: F401
    from .settings import (  # noqa: F401
        AdaptSettings,
        FomamlSettings,
        ImamlSettings,
        MamlppSettings,
        MamlSettings,
        ProtonetSettings,
        ReptileSettings,
        Settings,
    )
    from .step import StepMetrics, meta_step  # noqa: F401
    from .strategy import (  # noqa: F401
        CPU_VMAP_CHUNK,
        CPU_VMAP_MAX_EXAMPLES,
        DEFAULT_STRATEGY,
        STRATEGIES,
        default_chunk_size,
        default_strategy,
        mean_task_grads,
        measure_strategies,
        resolve_strategy,
        task_evals,
    )
    from .task_stream import TaskStream, tasks  # noqa: F401
    from .trainer import MetaTrainer, TrainState  # noqa: F401

_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
_HOME["BoundApply"] = "..model"

_MODULES = (*_EXPORTS, "adapted", "binding")
"""The submodules the docs cite, reachable as ``funcgraph.meta.<name>`` (imported on first use)
unless a function of that name stands there."""


__all__ = sorted(_HOME)

__getattr__, __dir__ = lazy_exports(__name__, __all__, submodules=_MODULES, homes=_HOME)


class _Package(types.ModuleType):
    """This package, whose functions named like their modules (``imaml``, ``mamlpp``,
    ``reptile``, ``protonet``, ``evaluate``) stay functions: importing the submodule
    ``funcgraph.meta.mamlpp`` would otherwise bind the package attribute ``mamlpp`` to the
    module (the import system does), and ``from funcgraph.meta import mamlpp`` would give the
    module. Submodules stay reachable as ``sys.modules["funcgraph.meta.mamlpp"]`` and by
    ``from funcgraph.meta.mamlpp import ...``."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _HOME.get(name) == name:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
