"""ONNX export run by onnxruntime against the eager model (onnx, onnxscript and onnxruntime are
in the ``test`` extra, so this runs wherever the suite does)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

import funcgraph
from funcgraph import nn as fnn
from funcgraph import random
from funcgraph.export import export_onnx, onnx_available
from funcgraph.models import conv4


def convnet() -> funcgraph.Model:
    """Batch norm with running statistics (evaluation mode), as an exported model uses it."""
    return fnn.serial({
        "conv": fnn.conv2d(1, 3, 3, padding=1), "bn": fnn.batch_norm(3), "act": fnn.relu(),
        "pool": fnn.adaptive_avg_pool2d(1), "flat": fnn.flatten(), "fc": fnn.linear(3, 2),
    })


def test_onnx_exporter_dependencies_are_installed() -> None:
    assert onnx_available(), "onnx and onnxscript are test dependencies (pyproject's test extra)"


@pytest.mark.parametrize(("name", "shape"), [("convnet", (2, 1, 4, 4)), ("conv4", (3, 1, 8, 8))])
def test_onnxruntime_matches_the_eager_model(tmp_path: Path, name: str,
                                             shape: tuple[int, ...]) -> None:
    # conv4 normalises with the statistics of the batch it sees: the exported graph must too.
    model = convnet() if name == "convnet" else conv4(5, hidden=8, image_size=8)
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), shape)
    _, state = model.apply(params, state, x, train=True)  # running statistics that are not 0/1
    out = export_onnx(model, params, state, torch.ones(shape), tmp_path / f"{name}.onnx",
                      batch_dependent=name == "conv4")
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (feed,) = session.get_inputs()
    for batch in (shape[0], 5):  # the example's batch and another one (dynamic batch)
        x = random.normal(random.key(batch), (batch, *shape[1:]))
        (got,) = session.run(None, {feed.name: x.numpy()})
        want = model.apply(params, state, x)[0].detach().numpy()
        assert got.shape == want.shape, f"{name} batch {batch}: {got.shape} vs {want.shape}"
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5,
                                   err_msg=f"{name} batch {batch}: onnxruntime vs eager")
