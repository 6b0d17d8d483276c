"""Meta-learning: MAML, first-order MAML, Meta-SGD, ANIL, Reptile, prototypical networks.

Every algorithm is a :class:`MetaLearner`, pure functions over a flat dict of
meta-parameters taking any ``apply(params, x)``; :mod:`.strategy` maps them over a batch of
tasks (``vmap``, a loop or threads) and :mod:`.evaluate` scores held-out tasks with a 95% CI.
The run behind ``funcgraph meta-train`` (config, checkpoints, validation) is
:mod:`funcgraph.runs.meta_train`.
"""

from ..model import BoundApply
from .evaluate import EvalResult, TaskSampler, confidence_interval, evaluate
from .learner import (
    LR_PREFIX,
    MetaLearner,
    Objective,
    Task,
    accuracy,
    model_params,
    objective,
)
from .maml import InnerLoop, adapt, anil, fomaml, maml, metasgd, remat_task_grad, task_loss
from .protonet import protonet, protonet_logits, prototypes, squared_distances
from .reptile import reptile
from .strategy import (
    CPU_VMAP_MAX_EXAMPLES,
    DEFAULT_STRATEGY,
    STRATEGIES,
    default_strategy,
    mean_task_grads,
    measure_strategies,
    resolve_strategy,
    task_evals,
)

__all__ = [
    "CPU_VMAP_MAX_EXAMPLES",
    "DEFAULT_STRATEGY",
    "LR_PREFIX",
    "STRATEGIES",
    "BoundApply",
    "EvalResult",
    "InnerLoop",
    "MetaLearner",
    "Objective",
    "Task",
    "TaskSampler",
    "accuracy",
    "adapt",
    "anil",
    "confidence_interval",
    "default_strategy",
    "evaluate",
    "fomaml",
    "maml",
    "mean_task_grads",
    "measure_strategies",
    "metasgd",
    "model_params",
    "objective",
    "protonet",
    "protonet_logits",
    "prototypes",
    "remat_task_grad",
    "reptile",
    "resolve_strategy",
    "squared_distances",
    "task_evals",
    "task_loss",
]
