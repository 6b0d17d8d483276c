"""The optimisers refuse gradients that are not a dict shaped like the params.

A swapped unpacking of ``torch.func.grad_and_value`` (it returns ``(grads, value)``) once handed
an optimiser the scalar loss, and torch failed inside the update with an index error.
"""

from __future__ import annotations

import pytest
import torch

from funcgraph.errors import ArgumentTypeError, ShapeError
from funcgraph.train import adam, sgd


def _loss(w: dict[str, torch.Tensor]) -> torch.Tensor:
    return (w["a"] * torch.arange(3.0)).square().sum()


@pytest.mark.parametrize("opt", [sgd(0.1), sgd(0.1, momentum=0.9), adam(0.1),
                                 adam(0.1, decoupled=True, weight_decay=0.1)],
                         ids=["sgd", "sgd-momentum", "adam", "adamw"])
def test_grad_and_value_unpacked_in_its_order_takes_a_step_down(opt) -> None:
    w = {"a": torch.ones(3)}
    grads, value = torch.func.grad_and_value(_loss)(w)
    new, _ = opt.update(w, grads, opt.init(w))
    assert float(_loss(new)) < float(value), "one step along -grad must lower the loss"


@pytest.mark.parametrize("opt", [sgd(0.1), adam(0.1)], ids=["sgd", "adam"])
def test_a_swapped_unpacking_is_refused_by_name(opt) -> None:
    w = {"a": torch.ones(3)}
    value, grads = torch.func.grad_and_value(_loss)(w)  # the wrong order, on purpose
    with pytest.raises(ArgumentTypeError,
                       match=rf"{opt.name}\.update: grads must be a dict of tensors.*got Tensor"):
        opt.update(w, grads, opt.init(w))


def test_missing_names_and_wrong_shapes_are_named() -> None:
    opt = sgd(0.1)
    w = {"a": torch.ones(3), "b": torch.ones(2)}
    with pytest.raises(ArgumentTypeError, match=r"sgd\.update: .*missing \['b'\]"):
        opt.update(w, {"a": torch.ones(3)}, {})
    with pytest.raises(ShapeError, match=r"sgd\.update: grads\['b'\] must have the shape of "
                                         r"params\['b'\], \(2,\), got \(3,\)"):
        opt.update(w, {"a": torch.ones(3), "b": torch.ones(3)}, {})
