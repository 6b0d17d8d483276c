"""Meta-learning: MAML, first-order MAML, Meta-SGD, ANIL, MAML++, implicit MAML, Reptile,
prototypical networks.

Every algorithm is a :class:`MetaLearner`, pure functions over a flat dict of
meta-parameters taking any ``apply(params, x)``; :mod:`.strategy` maps them over a batch of
tasks (``vmap``, a loop or threads) and :mod:`.evaluate` scores held-out tasks with a 95% CI.
The run behind ``funcgraph meta-train`` (config, checkpoints, validation) is
:mod:`funcgraph.runs.meta_train`.
"""

from ..model import BoundApply
from .cg import CGResult, conjugate_gradient, hessian_vector
from .evaluate import EvalResult, TaskSampler, confidence_interval, evaluate
from .imaml import ImplicitGrad, imaml, imaml_solve, proximal_adapt
from .learner import (
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
from .maml import InnerLoop, adapt, anil, fomaml, maml, metasgd, remat_task_grad, task_loss
from .mamlpp import (
    mamlpp,
    mamlpp_loss,
    msl_weights,
    step_params,
    step_running_stats,
    with_step_running_stats,
)
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
    "LEARNER_PREFIXES",
    "LR_PREFIX",
    "STEP_BN_PREFIX",
    "STEP_LR_PREFIX",
    "STRATEGIES",
    "BoundApply",
    "CGResult",
    "EvalResult",
    "ImplicitGrad",
    "InnerLoop",
    "MetaLearner",
    "Objective",
    "Task",
    "TaskSampler",
    "accuracy",
    "adapt",
    "anil",
    "confidence_interval",
    "conjugate_gradient",
    "default_strategy",
    "evaluate",
    "fomaml",
    "hessian_vector",
    "imaml",
    "imaml_solve",
    "maml",
    "mamlpp",
    "mamlpp_loss",
    "mean_task_grads",
    "measure_strategies",
    "metasgd",
    "model_params",
    "msl_weights",
    "objective",
    "protonet",
    "protonet_logits",
    "prototypes",
    "proximal_adapt",
    "remat_task_grad",
    "reptile",
    "resolve_strategy",
    "squared_distances",
    "step_params",
    "step_running_stats",
    "task_evals",
    "task_loss",
    "with_step_running_stats",
]
