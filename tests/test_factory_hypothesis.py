"""Generated configs: valid ones always build, init and run with the declared shapes and the
parameter count is the sum over layers; invalid ones (and arbitrary JSON) always raise
ConfigError with a config path, never another exception."""

from __future__ import annotations

import copy
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

from funcgraph import random
from funcgraph.errors import ConfigError
from funcgraph.factory import build

ACTIVATIONS = ["relu", "tanh", "gelu", "sigmoid", "identity", "elu", "leaky_relu"]


@st.composite
def layer_stacks(draw: st.DrawFn) -> tuple[dict[str, Any], int, int]:
    """``(config, output width, expected param count)`` for a serial stack over (B, F)."""
    batch = draw(st.integers(2, 3))
    width = draw(st.integers(1, 6))
    config: dict[str, Any] = {"vars": {}, "input_shape": [batch, width], "layers": []}
    count = 0
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["linear", "act", "layer_norm", "batch_norm", "dropout",
                                     "residual"]))
        if kind == "linear":
            out = draw(st.integers(1, 6))
            bias = draw(st.booleans())
            params: dict[str, Any] = {"out_features": out, "bias": bias}
            if draw(st.booleans()):
                config["vars"][f"w{i}"] = out
                params["out_features"] = f"$w{i}"
            if draw(st.booleans()):
                params["in_features"] = width  # given explicitly and consistent
            config["layers"].append({"type": "linear", "params": params})
            count += width * out + (out if bias else 0)
            width = out
        elif kind == "act":
            config["layers"].append(draw(st.sampled_from(ACTIVATIONS)))
        elif kind in ("layer_norm", "batch_norm"):
            config["layers"].append({"type": kind})
            count += 2 * width
        elif kind == "dropout":
            config["layers"].append({"type": "dropout",
                                     "params": {"drop_prob": draw(st.floats(0.0, 0.9))}})
        else:
            config["layers"].append({"type": "residual", "body": [
                {"type": "linear", "params": {"out_features": "$in_shape[-1]"}},
                draw(st.sampled_from(ACTIVATIONS))]})
            count += width * width + width
    return config, width, count


@given(layer_stacks(), st.integers(0, 2**31))
def test_generated_valid_configs_build_init_and_run(case: tuple[dict[str, Any], int, int],
                                                    seed: int) -> None:
    config, width, count = case
    built = build(config)
    batch = config["input_shape"][0]
    assert built.output_shape == (batch, width)
    assert built.total_params == count, "param count must match the per-layer formula"
    assert sum(r.params for r in built.rows if r.depth == 0) == count, "sum over layers"
    params, state = built.model.init(random.key(seed))
    assert sum(t.numel() for t in params.values()) == count
    x = random.normal(random.key(seed + 1), tuple(config["input_shape"]))
    y, _ = built.model.apply(params, state, x)
    assert y.shape == (batch, width) and torch.isfinite(y).all()
    y_train, _ = built.model.apply(params, state, x, key=random.key(seed), train=True)
    assert y_train.shape == (batch, width) and torch.isfinite(y_train).all()


NOT_POSITIVE_INTS = st.one_of(
    st.text(max_size=4), st.floats(allow_nan=True).filter(lambda f: not float(f).is_integer()),
    st.integers(max_value=0), st.booleans(), st.none(), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)


@st.composite
def broken_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid stack with one mistake in a layer that has a linear."""
    config, _, _ = draw(layer_stacks())
    config = copy.deepcopy(config)
    config["layers"].append({"type": "linear", "params": {"out_features": 3}})
    layer = config["layers"][-1]
    mistake = draw(st.sampled_from(["value", "missing_type", "missing_param", "bad_ref",
                                    "syntax", "cycle", "mismatch", "unknown_type", "unknown_key",
                                    "params_type", "residual_mismatch", "unknown_param"]))
    if mistake == "value":
        layer["params"]["out_features"] = draw(NOT_POSITIVE_INTS)
    elif mistake == "missing_type":
        del layer["type"]
    elif mistake == "missing_param":
        del layer["params"]["out_features"]
    elif mistake == "bad_ref":
        layer["params"]["out_features"] = "$" + draw(st.sampled_from(["nope", "w99", "in_shap"]))
    elif mistake == "syntax":
        layer["params"]["out_features"] = draw(st.sampled_from(["$3 +", "$(", "$a b", "$x.y"]))
    elif mistake == "cycle":
        config["vars"].update({"a": "$b * 2", "b": "$c", "c": "$a"})
    elif mistake == "mismatch":
        layer["params"]["in_features"] = f"$in_shape[-1] + {draw(st.integers(1, 5))}"
    elif mistake == "unknown_type":
        layer["type"] = draw(st.sampled_from(["linaer", "Linear", "custom.nothing", "", "os"]))
    elif mistake == "unknown_key":
        layer[draw(st.sampled_from(["parms", "layers", "body", "kind"]))] = {}
    elif mistake == "params_type":
        layer["params"] = draw(st.one_of(st.lists(st.integers(), max_size=2), st.text(max_size=3),
                                         st.integers()))
    elif mistake == "residual_mismatch":
        config["layers"][-1] = {"type": "residual", "body": {
            "type": "linear", "params": {"out_features": "$in_shape[-1] + 1"}}}
    else:
        layer["params"][draw(st.sampled_from(["out_feature", "in", "bias_", "dims"]))] = 1
    return config


@given(broken_configs())
def test_generated_invalid_configs_raise_config_error_with_path(config: dict[str, Any]) -> None:
    try:
        build(config)
    except ConfigError as e:
        message = str(e)
        where = message.split(":", 1)[0]
        assert where.startswith(("layers[", "vars.")), f"no config path in: {message}"
    else:
        raise AssertionError(f"built an invalid config: {config}")


KEYS = ["type", "params", "layers", "name", "init", "body", "shortcut", "branches", "vars",
        "input_shape", "input_dtype", "model", "out_features", "in_features", "weight", "bias",
        "kernel_size", "combine", "dim", "x"]
SCALARS = st.one_of(
    st.sampled_from(["linear", "relu", "conv2d", "residual", "parallel", "serial", "layer_norm",
                     "embedding", "zeros", "kaiming_normal", "$x", "$in_shape[-1]", "$x * 2",
                     "float32", "concat", "tuple", "lstm", "conv4"]),
    st.integers(-3, 8), st.booleans(), st.none(), st.floats(-2, 2), st.text(max_size=3),
)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
    max_leaves=25,
)


@given(st.dictionaries(st.sampled_from(KEYS), JSONISH, max_size=6))
def test_arbitrary_json_never_raises_anything_but_config_error(config: dict[str, Any]) -> None:
    try:
        build(config)
    except ConfigError:
        pass


PARAM_NAMES = ["out_features", "in_features", "out_channels", "kernel_size", "stride", "padding",
               "num_features", "num_groups", "drop_prob", "combine", "dim", "ways", "hidden",
               "depth", "hidden_size", "num_embeddings", "embedding_dim", "output_size",
               "variant", "bias", "start_dim", "normalized_shape", "dtype"]
LAYER = st.fixed_dictionaries(
    {"type": st.sampled_from(sorted(REGISTRY_NAMES := [
        "linear", "conv1d", "conv2d", "batch_norm", "conv_batch_norm", "layer_norm",
        "group_norm", "embedding",
        "dropout", "relu", "flatten", "max_pool2d", "adaptive_avg_pool2d", "serial", "residual",
        "parallel", "lstm", "gru", "conv4", "mlp", "stochastic_depth"])),
     "params": st.dictionaries(st.sampled_from(PARAM_NAMES),
                               st.one_of(SCALARS, st.lists(st.integers(-1, 4), max_size=3)),
                               max_size=4)},
    optional={"init": st.dictionaries(st.sampled_from(["weight", "bias", "*", "x"]), JSONISH,
                                      max_size=2),
              "body": st.just(["relu"]), "branches": st.just(["relu", "tanh"])},
)


@given(st.lists(LAYER, min_size=1, max_size=3),
       st.lists(st.integers(0, 5), min_size=1, max_size=4))
def test_random_layers_of_every_type_raise_only_config_errors(layers: list[Any],
                                                              shape: list[int]) -> None:
    try:
        build({"input_shape": shape, "layers": layers})
    except ConfigError as e:
        assert str(e).split(":", 1)[0].startswith(("layers", "input_shape")), str(e)
