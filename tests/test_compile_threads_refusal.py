"""``compile`` with the ``threads`` strategy is refused in one line, the same from the pure
meta-gradient, the trainer and the run's config, each naming its own options."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from funcgraph import bind, random
from funcgraph.errors import ConfigError
from funcgraph.meta import MetaTrainer, Task, maml, mean_task_grads
from funcgraph.models import mlp
from funcgraph.runs.meta_training.config import MetaTrainConfig

MODEL = mlp(1, 1, hidden=(4,))
BODY = "runs tasks in a loop or vmapped, not 'threads' (Dynamo compiles from one thread)"


def refusal(call: Callable[[], object]) -> str:
    with pytest.raises(ConfigError) as caught:
        call()
    return str(caught.value)


def test_every_layer_refuses_threads_compiled_with_one_message() -> None:
    params, state = MODEL.init(random.key(0))
    learner = maml(bind(MODEL, state), kind="regression")
    g = torch.Generator().manual_seed(0)
    tasks = Task(*(torch.randn(2, 3, 1, generator=g) for _ in range(4)))
    lines = [
        refusal(lambda: mean_task_grads(learner.task_grad, learner.init(params), tasks,
                                        strategy="threads", compile=True)),
        refusal(lambda: MetaTrainer(learner, strategy="threads", compile=True)),
        refusal(lambda: MetaTrainConfig(algo="maml", dataset="sinusoid", strategy="threads",
                                        compile=True)),
    ]
    assert lines == [
        f"mean_task_grads: compile {BODY}: choose another strategy",
        f"MetaTrainer: compile {BODY}: choose another strategy",
        f"meta-train: --compile {BODY}: choose another --strategy",
    ], lines
    # A strategy recorded by the run counts too: a resume cannot compile a threads run.
    assert BODY in refusal(lambda: MetaTrainConfig(algo="maml", dataset="sinusoid",
                                                   step_strategy="threads", compile=True))
