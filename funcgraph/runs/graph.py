"""What ``funcgraph graph`` runs: a model's one pass on a random input, captured as a graph.

:func:`capture_model_graph` resolves the model (a registered name, a config file, a run's
recorded model, or a :class:`~funcgraph.model.Model` itself), places it, initialises its params
from a seed, runs it once and returns the :class:`~funcgraph.debug.Graph` of the ops that
actually executed. Library code gets the same checks the command applies: an input shape that
is not positive ints, a model that records no input shape, an input that does not fit in
memory, and an input the model cannot take are each one funcgraph error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..checks import check_int, check_ints
from ..errors import ConfigError, ShapeError
from ..model import Model

if TYPE_CHECKING:
    from ..debug import Graph
    from ..placement import PlacementPlan

FN = "capture_model_graph"


def model_input_shape(model: Model, given: Sequence[int] | None = None) -> tuple[int, ...]:
    """``given`` (batch dimension included) if set, else the ``input_shape`` the model's
    config records; :class:`ConfigError` when there is neither."""
    if given is not None:
        return check_ints(FN, "input_shape", given)
    recorded = model.meta.get("input_shape")
    if recorded:
        return tuple(int(d) for d in recorded)
    raise ConfigError(f"{FN}: model {model.name!r} records no input shape; pass input_shape "
                      "(--input-shape on the command line), e.g. 1,1,28,28")


def capture_model_graph(
    model: str | Mapping[str, Any] | Model,
    *,
    input_shape: Sequence[int] | None = None,
    seed: int = 0,
    train: bool = False,
    overrides: Mapping[str, str] | None = None,
    device: str = "auto",
    place: PlacementPlan | str | None = None,
) -> Graph:
    """Run ``model`` once on a random normal input and return the graph that executed.

    Arguments:
        model: a registered model name, a factory config file or shipped config name, a run's
            recorded model (see :func:`~funcgraph.runs.resolve_model`), or a Model.
        input_shape: the input's shape, batch dimension included (default: the shape the
            model's config records).
        seed: seeds the params (``fold_in(key(seed), 0)``), the input (``1``) and the model's
            key (``2``), so stochastic depth or early exit take the path this seed draws.
        train: run in train mode (stochastic depth and dropout draw from the key).
        overrides: ``--set`` style overrides (``{"ways": "5"}``) of a named or config model.
        device: where params, input and key go (``auto``, ``cpu``, ``cuda:N``, ``mps``).
        place: a placement plan spreading the params over devices instead
            (``"stem=cuda:0,*=cuda:1"``).

    Example::

        g = capture_model_graph("conv4", overrides={"ways": "5"}, input_shape=(1, 1, 28, 28))
        print(render.text(g.collapse(2)))
    """
    from .. import params as P
    from .. import random
    from ..debug import capture
    from ..placement import placed_model, resolve_device
    from .memory import check_input_sizes
    from .resolve import resolve_model

    check_int(FN, "seed", seed, minimum=0)
    if not isinstance(train, bool):
        raise ConfigError(f"{FN}: train must be True or False, got {train!r}")
    dev = resolve_device(device)
    if isinstance(model, Model):
        if overrides:
            raise ConfigError(f"{FN}: overrides apply to a model name or config, not to a "
                              f"Model; got overrides {dict(overrides)} for {model.name!r}")
        built = model
    else:
        built = resolve_model(model, overrides)
    if place is not None:
        built = placed_model(built, place)
    shape = model_input_shape(built, input_shape)
    check_input_sizes(built, shape, dev)  # refuse what cannot fit before allocating it
    root = random.key(seed)
    params, state = built.init(random.fold_in(root, 0))
    if place is None:  # a placement plan has put the params where they belong
        params, state = P.to(params, dev), P.to(state, dev)
    x = random.normal(random.fold_in(root, 1), shape).to(dev)
    key = random.fold_in(root, 2).to(dev)
    try:
        return capture(built.apply, params, state, x, key=key, train=train)
    except RuntimeError as e:  # torch's shape/dtype complaint about this input
        reason = str(e).strip().splitlines()[0]
        raise ShapeError(f"model {built.name!r} failed on input shape {list(shape)}: "
                         f"{reason}") from None


__all__ = ["capture_model_graph", "model_input_shape"]
