"""Typed settings of the meta-learning algorithms: every default of every knob, written once.

Each algorithm's settings are one frozen dataclass. Its field defaults are the algorithm's
defaults everywhere: the library function's signature reads them (``maml(inner_lr=...)``
defaults to ``MamlSettings.inner_lr``), the algorithm registry
(:mod:`funcgraph.meta.registry`) hands them to ``funcgraph meta-train`` as its defaults, and
the learner carries the record it was built with (:attr:`MetaLearner.settings`) for the run
layer and logs, so no module reads a setting back by a string key.

A record checks its values when it is built: a non-finite, negative or zero rate, a step
count below its floor or a wrong type is a :class:`~funcgraph.errors.ConfigError` naming the
algorithm, the argument, the expected form and the value received.

This module imports no torch: the CLI reads defaults and help from it while ``--help`` runs.

The defaults are CPU recipes chosen on glyphs 5-way 1-shot (their recorded results are in
docs/results/meta-learning.md):

* MAML: one inner step at rate 0.5 in training and three at evaluation (learn2learn's
  Omniglot setting).
* MAML++: found by two settings studies (``funcgraph tune`` over
  ``benchmarks/spaces/mamlpp_glyphs.toml``, then the narrower, longer
  ``benchmarks/spaces/mamlpp_glyphs_narrow.toml``, both chosen on the glyphs validation
  alphabets) and confirmed on the patterns set no choice had seen: three inner steps from
  rate 0.4238 (the learned per-step rates' initial value), the multi-step loss annealed over
  32.90% of the run; its run recipe (in the algorithm registry) adds first order for the first
  2 of its 2,775 steps, which a library user's own loop of another length sets itself.
* iMAML: five proximal steps at 0.1, ten at evaluation; lambda 1 and five conjugate-gradient
  steps to a relative residual of 1e-3 (the paper's Omniglot setting).
* Reptile: five SGD steps at 0.1, each on one example of every class, thirty at evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from ..checks import check_bool, check_choice, check_int, check_number, check_rate

INNER_OPTIMIZERS = ("sgd", "adam")
"""Reptile's inner update rules (its inner loop is not differentiated through)."""

MSL_ANNEAL_FRACTION = 0.3290
"""MAML++'s multi-step loss anneals over this fraction of the run's meta-steps unless
``msl_anneal_steps`` is set (the study's choice: 913 of its 2,775 steps; the paper anneals
over its first 15 of 100 epochs)."""

MAMLPP_META_STEPS = 2775
"""MAML++'s meta-steps in its tuned recipe (16 tasks a step, 3 queries per class): the run
length its MSL annealing defaults to."""


@dataclass(frozen=True)
class Settings:
    """The base of every algorithm's settings: the checks that run when a record is built.

    ``OWNER`` names the library function the settings belong to, for messages; a class that
    sets none (a user's own) is named by its class name.
    """

    OWNER: ClassVar[str] = ""

    @property
    def owner(self) -> str:
        """Who a refused value is reported against: ``OWNER``, else the class name."""
        return self.OWNER or type(self).__name__

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Refuse values the algorithm cannot run with (subclasses extend this)."""

    def names(self) -> tuple[str, ...]:
        """The field names, in order."""
        return tuple(f.name for f in fields(self))


@dataclass(frozen=True)
class AdaptSettings(Settings):
    """Settings every algorithm with an inner loop has.

    Attributes:
        inner_steps: inner steps in meta-training (``>= 0``).
        inner_lr: the inner learning rate (finite, ``> 0``).
        eval_steps: inner steps at evaluation (``>= 0``).
    """

    inner_steps: int = 1
    inner_lr: float = 0.5
    eval_steps: int = 3

    def check(self) -> None:
        check_int(self.owner, "inner_steps", self.inner_steps, minimum=self._least_steps)
        check_rate(self.owner, "inner_lr", self.inner_lr)
        check_int(self.owner, "eval_steps", self.eval_steps, minimum=0)

    _least_steps: ClassVar[int] = 0


@dataclass(frozen=True)
class MamlSettings(AdaptSettings):
    """MAML, first-order MAML, Meta-SGD and ANIL (:func:`funcgraph.meta.maml`).

    Attributes:
        first_order: drop the second-order term.
        remat: rematerialise the inner loop (same meta-gradient, memory of one inner step).
    """

    OWNER: ClassVar[str] = "maml"
    first_order: bool = False
    remat: bool = False

    def check(self) -> None:
        super().check()
        check_bool(self.owner, "first_order", self.first_order)
        check_bool(self.owner, "remat", self.remat)


@dataclass(frozen=True)
class FomamlSettings(MamlSettings):
    """First-order MAML: :class:`MamlSettings` with ``first_order=True``."""

    OWNER: ClassVar[str] = "fomaml"
    first_order: bool = True


@dataclass(frozen=True)
class MamlppSettings(AdaptSettings):
    """MAML++ (:func:`funcgraph.meta.mamlpp`).

    Attributes:
        msl_anneal_steps: meta-steps over which the multi-step loss weights anneal to the last
            step; ``None``: :data:`MSL_ANNEAL_FRACTION` of the run's meta-steps.
        first_order_until: meta-steps before this one are first order (0: never).
        lslr: learn one inner rate per parameter tensor and inner step.
        multi_step_loss: weight the query loss after every inner step.
    """

    OWNER: ClassVar[str] = "mamlpp"
    _least_steps: ClassVar[int] = 1
    inner_steps: int = 3
    inner_lr: float = 0.4238
    msl_anneal_steps: int | None = None
    first_order_until: int = 0
    lslr: bool = True
    multi_step_loss: bool = True

    def check(self) -> None:
        super().check()
        if self.msl_anneal_steps is not None:
            check_int(self.owner, "msl_anneal_steps", self.msl_anneal_steps)
        check_int(self.owner, "first_order_until", self.first_order_until, minimum=0)
        check_bool(self.owner, "lslr", self.lslr)
        check_bool(self.owner, "multi_step_loss", self.multi_step_loss)

    def anneal_steps(self, meta_steps: int) -> int:
        """``msl_anneal_steps``, or :data:`MSL_ANNEAL_FRACTION` of ``meta_steps`` (>= 1)."""
        if self.msl_anneal_steps is not None:
            return self.msl_anneal_steps
        return max(1, round(MSL_ANNEAL_FRACTION * meta_steps))


@dataclass(frozen=True)
class ImamlSettings(AdaptSettings):
    """Implicit MAML (:func:`funcgraph.meta.imaml`).

    Attributes:
        lam: the proximal regulariser's strength (finite, ``> 0``).
        cg_steps: conjugate-gradient steps at most (``>= 1``).
        cg_tol: CG stops at this relative residual (finite, ``>= 0``; 0: always ``cg_steps``).
    """

    OWNER: ClassVar[str] = "imaml"
    inner_steps: int = 5
    inner_lr: float = 0.1
    eval_steps: int = 10
    lam: float = 1.0
    cg_steps: int = 5
    cg_tol: float = 1e-3

    def check(self) -> None:
        super().check()
        check_rate(self.owner, "lam", self.lam)
        check_int(self.owner, "cg_steps", self.cg_steps)
        check_number(self.owner, "cg_tol", self.cg_tol)


@dataclass(frozen=True)
class ReptileSettings(AdaptSettings):
    """Reptile (:func:`funcgraph.meta.reptile`).

    Attributes:
        inner_optimizer: ``"sgd"`` or ``"adam"`` (betas ``(0, 0.999)``, fresh per task).
        inner_minibatches: each inner step fits one example of every class (cycling through
            the task) instead of all of the task's examples at once; fitting all 30 examples
            of a 5-way task at once transferred poorly (77.8% on glyphs 5-way 1-shot).
    """

    OWNER: ClassVar[str] = "reptile"
    inner_steps: int = 5
    inner_lr: float = 0.1
    eval_steps: int = 30
    inner_optimizer: str = "sgd"
    inner_minibatches: bool = True

    def check(self) -> None:
        super().check()
        check_choice(self.owner, "inner_optimizer", self.inner_optimizer, INNER_OPTIMIZERS)
        check_bool(self.owner, "inner_minibatches", self.inner_minibatches)


@dataclass(frozen=True)
class ProtonetSettings(Settings):
    """Prototypical networks (:func:`funcgraph.meta.protonet`): no inner loop, nothing to
    set (the number of ways comes from the tasks)."""

    OWNER: ClassVar[str] = "protonet"


__all__ = ["INNER_OPTIMIZERS", "MAMLPP_META_STEPS", "MSL_ANNEAL_FRACTION", "AdaptSettings",
           "FomamlSettings", "ImamlSettings", "MamlSettings", "MamlppSettings",
           "ProtonetSettings", "ReptileSettings", "Settings"]
