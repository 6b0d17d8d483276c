"""``funcgraph.runs.graph``: the library function behind ``funcgraph graph``, and its checks."""

from __future__ import annotations

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from funcgraph.cli import app
from funcgraph.debug import render
from funcgraph.errors import ConfigError, ShapeError
from funcgraph.runs import resolve_model
from funcgraph.runs.graph import capture_model_graph, model_input_shape


def test_the_command_prints_what_the_library_captures() -> None:
    g = capture_model_graph("mlp", overrides={"hidden": "[3]"}, input_shape=(2, 1), seed=3)
    result = CliRunner().invoke(app, ["graph", "--model", "mlp", "--set", "hidden=[3]",
                                      "--input-shape", "2,1", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert result.output == render.render(g, "text") + "\n", result.output
    assert [n.op for n in g.nodes].count("addmm") == 2, render.render(g, "text")


def test_a_model_object_gives_the_same_graph_as_its_name() -> None:
    model = resolve_model("mlp", {"hidden": "[3]"})
    by_object = capture_model_graph(model, input_shape=(2, 1))
    by_name = capture_model_graph("mlp", overrides={"hidden": "[3]"}, input_shape=(2, 1))
    assert render.render(by_object, "text") == render.render(by_name, "text")


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"seed": -1}, ConfigError, "capture_model_graph: seed must be an int >= 0, got -1"),
    ({"input_shape": (2, 0)}, ConfigError, "capture_model_graph: input_shape must be an int"),
    ({"input_shape": (2, 3)}, ShapeError, "model 'mlp' failed on input shape [2, 3]"),
    ({"train": "yes"}, ConfigError, "capture_model_graph: train must be True or False, got 'yes'"),
])
def test_bad_arguments_are_funcgraph_errors(kwargs: dict[str, object], error: type[Exception],
                                            message: str) -> None:
    args: dict[str, object] = {"input_shape": (2, 1), **kwargs}
    with pytest.raises(error) as info:
        capture_model_graph("mlp", **args)  # type: ignore[arg-type]
    assert message in str(info.value), str(info.value)


def test_overrides_of_a_model_object_are_refused() -> None:
    model = resolve_model("mlp")
    with pytest.raises(ConfigError, match="overrides apply to a model name or config, not to"):
        capture_model_graph(model, overrides={"hidden": "[3]"}, input_shape=(1, 1))


def test_a_model_without_an_input_shape_needs_one() -> None:
    model = replace(resolve_model("mlp"), meta={})
    with pytest.raises(ConfigError, match="records no input shape; pass input_shape"):
        model_input_shape(model)
    assert model_input_shape(model, [4, 1]) == (4, 1)
