"""Sinusoid regression tasks, as in the MAML paper (Finn et al., 2017, section 5.1).

A task is ``y = amplitude * sin(x - phase)`` with amplitude uniform in ``[0.1, 5]``, phase
uniform in ``[0, pi]`` and inputs uniform in ``[-5, 5]``; K support and Q query points per
task, all drawn from the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from .. import random
from ..errors import TaskSpecError

AMPLITUDE = (0.1, 5.0)
PHASE = (0.0, math.pi)
X_RANGE = (-5.0, 5.0)


@dataclass(frozen=True)
class RegressionBatch:
    """``T`` regression tasks.

    Attributes:
        support_x, support_y: ``(T, K, 1)``; query_x, query_y: ``(T, Q, 1)``.
        amplitude, phase: ``(T,)`` the sinusoid behind each task (for plots and oracles).
    """

    support_x: Tensor
    support_y: Tensor
    query_x: Tensor
    query_y: Tensor
    amplitude: Tensor
    phase: Tensor


def sinusoid_tasks(key: Tensor, num_tasks: int, shots: int, queries: int) -> RegressionBatch:
    """Draw ``num_tasks`` sinusoid tasks with ``shots`` support and ``queries`` query points."""
    for name, value in (("num_tasks", num_tasks), ("shots", shots), ("queries", queries)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TaskSpecError(f"sinusoid_tasks: {name} must be an int >= 1, got {value!r}")
    k_amp, k_phase, k_x = random.split(key, 3)
    amplitude = random.uniform(k_amp, (num_tasks,), low=AMPLITUDE[0], high=AMPLITUDE[1])
    phase = random.uniform(k_phase, (num_tasks,), low=PHASE[0], high=PHASE[1])
    x = random.uniform(k_x, (num_tasks, shots + queries, 1), low=X_RANGE[0], high=X_RANGE[1])
    y = amplitude[:, None, None] * (x - phase[:, None, None]).sin()
    return RegressionBatch(x[:, :shots], y[:, :shots], x[:, shots:], y[:, shots:], amplitude, phase)
