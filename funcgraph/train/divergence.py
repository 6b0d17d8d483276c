"""When a training loss means the run has diverged: a documented bound, as a function.

A loss that is not finite has plainly diverged; so has a finite one that left every value a
converging run takes. :func:`check_diverged` refuses both, with one
:class:`~funcgraph.errors.DivergedError` that says the step, the loss, the bound and the rates
the run used, so a loop stops with a result ("diverged at these rates") instead of training
on to a meaningless score. ``funcgraph meta-train`` checks every step's loss with it; a
user's loop calls it the same way.

Why :data:`DIVERGENCE_BOUND` is ``1e6``, absolute rather than relative to the first loss:
a rate large enough to diverge (``--inner-lr 1e9``) often diverges within the first step, so
the first loss is no reference. The losses of the runs here start near chance and fall:
cross-entropy of an N-way classifier starts at ``log N`` (1.6 for 5 ways, 3.0 for 20) and the
MAML paper's sinusoid regression at an MSE below 20 (amplitudes up to 5). A loss of ``1e6``
is five orders of magnitude beyond either, where a float32 step is one overflow away
(squared errors of ``1e19`` already reach float32's ``3.4e38``). A task whose losses are
large by nature (unnormalised regression targets) passes its own ``bound``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from torch import Tensor

from ..checks import check_int
from ..errors import ConfigError, DivergedError

DIVERGENCE_BOUND = 1e6
"""The default largest loss a converging run is taken to have (see the module docstring)."""


def check_diverged(
    loss: float | Tensor,
    *,
    step: int,
    bound: float = DIVERGENCE_BOUND,
    rates: Mapping[str, float] | None = None,
) -> None:
    """Raise :class:`DivergedError` when ``loss`` is NaN, infinite or above ``bound``.

    Arguments:
        loss: the step's training loss (a float or a scalar tensor).
        step: the 1-based step that produced it, for the message.
        bound: the largest loss taken as not diverged (``> 0``; ``math.inf`` refuses only
            NaN and infinite losses).
        rates: the learning rates the run used, by name (``{"inner lr": 0.5, "meta lr":
            3e-3}``), named in the message so the fix is visible.

    Raises:
        DivergedError: the loss left the bound (one line naming the step, the loss, the
            bound and the rates).
        ConfigError: an argument of the wrong kind.
    """
    check_int("check_diverged", "step", step, minimum=0)
    if isinstance(bound, bool) or not isinstance(bound, int | float) or not bound > 0:
        raise ConfigError(f"check_diverged: bound must be a number > 0 (math.inf: refuse only "
                          f"NaN and infinite losses), got {bound!r}")
    if isinstance(loss, Tensor):
        if loss.numel() != 1:
            raise ConfigError(f"check_diverged: loss must be a scalar, got a tensor of shape "
                              f"{tuple(loss.shape)}")
        loss = float(loss)
    if isinstance(loss, bool) or not isinstance(loss, int | float):
        raise ConfigError(f"check_diverged: loss must be a number or a scalar tensor, got "
                          f"{type(loss).__name__}")
    if math.isfinite(loss) and loss <= bound:
        return
    ran = " and ".join(f"{name} {value:g}" for name, value in (rates or {}).items())
    above = f" (above the bound {bound:g})" if math.isfinite(loss) else ""
    where = f", running with {ran}" if ran else ""
    raise DivergedError(f"training diverged: the loss became {loss:.4g} at step {step}{above}"
                        f"{where}")


__all__ = ["DIVERGENCE_BOUND", "check_diverged"]
