"""A batch norm with batch statistics called on one example warns once, naming the fix."""

from __future__ import annotations

import warnings

import pytest
import torch

from funcgraph import bind, nn, random
from funcgraph.models import conv4
from funcgraph.nn import norm as norm_module
from funcgraph.runs import memory


@pytest.fixture(autouse=True)
def _not_warned_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(norm_module, "_warned_one_example", False)


def _one_image_and_batch() -> tuple[torch.Tensor, torch.Tensor]:
    batch = random.uniform(random.key(1), (5, 1, 28, 28))
    return batch[:1], batch


def test_one_image_through_a_transductive_conv4_warns_once_and_differs_from_the_batch() -> None:
    model = conv4(5, variant="strided")  # batch norm with batch statistics at evaluation too
    params, state = model.init(random.key(0))
    f = bind(model, state)
    one, batch = _one_image_and_batch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the once is funcgraph's, not Python's filter
        alone = f(params, one)
        f(params, one)
    found = [w for w in caught if issubclass(w.category, nn.BatchStatisticsWarning)]
    assert len(found) == 1, [str(w.message) for w in caught]
    message = str(found[0].message)
    assert "pass a batch" in message and "running statistics" in message
    # what the warning is about: the same image gives another output inside a batch
    assert not torch.allclose(alone[0], f(params, batch)[0])


def test_a_batch_and_a_vmapped_task_do_not_warn() -> None:
    norm = nn.batch_norm(3, track_running_stats=False)
    params, state = norm.init(random.key(0))
    x = random.uniform(random.key(2), (4, 2, 3, 5, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("error", nn.BatchStatisticsWarning)
        norm.apply(params, state, x[0])
        # inside a transform a learner's task chose its own batch: one example per task is
        # the task's affair, not a user's single image
        torch.func.vmap(lambda t: norm.apply(params, state, t[:1])[0])(x)


def test_a_probe_on_the_meta_device_neither_warns_nor_uses_up_the_once() -> None:
    model = conv4(5, variant="strided")
    with warnings.catch_warnings():
        warnings.simplefilter("error", nn.BatchStatisticsWarning)
        # the run layer's memory check counts one example's forward on meta tensors
        assert memory.forward_bytes(model, *memory.meta_init(model),
                                    memory.meta_example((1, 1, 28, 28)))
    params, state = model.init(random.key(0))
    one, _ = _one_image_and_batch()
    with pytest.warns(nn.BatchStatisticsWarning):
        bind(model, state)(params, one)


def test_running_statistics_at_evaluation_do_not_warn() -> None:
    norm = nn.batch_norm(3)
    params, state = norm.init(random.key(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", nn.BatchStatisticsWarning)
        norm.apply(params, state, torch.ones(1, 3, 4, 4), train=False)
    with pytest.warns(nn.BatchStatisticsWarning):
        norm.apply(params, state, torch.rand(1, 3, 4, 4), train=True)
