"""The model factory: configs build the same models as code, references and overrides resolve,
files in every format load, the registry resolves custom layers, and every mistake is one
ConfigError that names the config path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from typer.testing import CliRunner

from funcgraph import nn, random
from funcgraph.cli import app
from funcgraph.errors import ConfigError
from funcgraph.factory import (
    REGISTRY,
    apply_overrides,
    build,
    check_model,
    load_config,
    load_model,
    parse_overrides,
    register_layer,
)
from funcgraph.factory.expr import ExprError, evaluate_in
from funcgraph.factory.layer_type import LayerType, describe_params
from funcgraph.factory.registry import entry_points
from funcgraph.factory.values import coerce
from funcgraph.model import Model

MLP = {
    "name": "mlp",
    "vars": {"hidden": 16, "wide": "$hidden * 2"},
    "input_shape": [3, 8],
    "layers": [
        {"type": "linear", "params": {"out_features": "$wide"}},
        "relu",
        {"type": "layer_norm"},
        {"type": "linear", "name": "head", "params": {"out_features": 4}},
    ],
}


def raises_at(path: str, config: Any, **kw: Any) -> str:
    """Build ``config``; assert a ConfigError whose message starts with ``path``."""
    with pytest.raises(ConfigError) as info:
        build(config, **kw)
    message = str(info.value)
    assert message.startswith(f"{path}:"), f"expected path {path!r} in: {message}"
    return message


def same_outputs(a: Model, b: Model, params: dict[str, torch.Tensor], x: Any) -> None:
    ya, _ = a.apply(params, a.init(random.key(0))[1], x)
    yb, _ = b.apply(params, b.init(random.key(0))[1], x)
    torch.testing.assert_close(ya, yb, rtol=1e-5, atol=1e-6)


# --- building ------------------------------------------------------------------------------

def test_config_equals_hand_built_serial() -> None:
    built = build(MLP)
    code = nn.serial({"0": nn.linear(8, 32), "1": nn.relu(), "2": nn.layer_norm(32),
                      "head": nn.linear(32, 4)}, name="mlp")
    p_cfg, s_cfg = built.model.init(random.key(5))
    p_code, _ = code.init(random.key(5))
    assert list(p_cfg) == list(p_code), "param names must match the code-built model"
    for n in p_code:
        assert torch.equal(p_cfg[n], p_code[n]), f"{n}: same key must give the same params"
    x = random.normal(random.key(1), (3, 8))
    same_outputs(built.model, code, p_code, x)
    assert built.output_shape == (3, 4) and built.total_params == sum(r.params for r in built.rows)


def test_rows_list_shapes_and_counts() -> None:
    rows = build(MLP).rows
    assert [(r.module, r.type, r.output_shape, r.params) for r in rows] == [
        ("0", "linear", (3, 32), 8 * 32 + 32), ("1", "relu", (3, 32), 0),
        ("2", "layer_norm", (3, 32), 64), ("head", "linear", (3, 4), 32 * 4 + 4)]


def test_conv_stack_infers_channels_and_features() -> None:
    config = {"input_shape": [2, 3, 12, 12], "layers": [
        {"type": "conv2d", "params": {"out_channels": 8, "kernel_size": [3, 3], "padding": 1}},
        {"type": "batch_norm"}, "relu", {"type": "max_pool2d", "params": {"kernel_size": 2}},
        {"type": "group_norm", "params": {"num_groups": 2}},
        "flatten", {"type": "linear", "params": {"out_features": 5}}]}
    built = build(config)
    assert built.rows[0].output_shape == (2, 8, 12, 12)
    assert built.rows[-1].output_shape == (2, 5)
    params, state = built.model.init(random.key(0))
    assert params["6.weight"].shape == (5, 8 * 6 * 6), "linear in_features inferred after flatten"
    y, new_state = built.model.apply(params, state, random.normal(random.key(1), (2, 3, 12, 12)),
                                     train=True)
    assert y.shape == (2, 5) and "1.running_mean" in new_state
    assert torch.isfinite(y).all() and y.std() > 0, f"outputs not finite or all equal: {y}"
    moved = new_state["1.running_mean"] - state["1.running_mean"]
    assert torch.isfinite(moved).all() and moved.abs().max() > 0, "train mode updates the stats"


def test_conv_batch_norm_layer_equals_the_nn_block_with_inferred_channels() -> None:
    config = {"input_shape": [4, 1, 10, 10], "layers": [
        {"type": "conv_batch_norm", "params": {"out_channels": 18, "kernel_size": 3,
                                               "padding": 1}}]}
    built = build(config)
    assert built.rows[0].output_shape == (4, 18, 10, 10)
    reference = nn.serial({"0": nn.conv_batch_norm(1, 18, 3, padding=1)})
    params, state = built.model.init(random.key(0))
    want_params, want_state = reference.init(random.key(0))
    assert params.keys() == want_params.keys() and state.keys() == want_state.keys()
    x = random.normal(random.key(1), (4, 1, 10, 10))
    y, _ = built.model.apply(params, state, x, train=True)
    torch.testing.assert_close(y, reference.apply(params, state, x, train=True)[0])


def test_residual_parallel_and_refs_to_shapes() -> None:
    config = {"input_shape": [2, 6], "layers": [
        {"type": "linear", "name": "stem", "params": {"out_features": 10}},
        {"type": "residual", "body": [
            {"type": "linear", "params": {"out_features": "$in_shape[-1]"}}, "tanh"]},
        {"type": "parallel", "params": {"combine": "concat"}, "branches": [
            {"type": "linear", "params": {"out_features": 3}},
            {"type": "linear", "params": {"out_features": "$shapes['stem'][1] // 2"}}]}]}
    built = build(config)
    params, state = built.model.init(random.key(0))
    assert params["1.body.0.weight"].shape == (10, 10)
    assert params["2.1.weight"].shape == (5, 10)
    x = torch.ones(2, 6)
    y, _ = built.model.apply(params, state, x)
    assert y.shape == (2, 8) == built.output_shape
    lin = torch.nn.functional.linear
    stem = lin(x, params["stem.weight"], params["stem.bias"])
    h = stem + torch.tanh(lin(stem, params["1.body.0.weight"], params["1.body.0.bias"]))
    want = torch.cat([lin(h, params["2.0.weight"], params["2.0.bias"]),
                      lin(h, params["2.1.weight"], params["2.1.bias"])], dim=-1)
    torch.testing.assert_close(y, want, msg="residual, then the two branches concatenated")


def test_embedding_with_integer_input_and_model_node() -> None:
    config = {"input_shape": [2, 7], "input_dtype": "int64", "layers": [
        {"type": "embedding", "params": {"num_embeddings": 20, "embedding_dim": 4}},
        {"type": "linear", "params": {"out_features": 3}}]}
    built = build(config)
    params, state = built.model.init(random.key(0))
    tokens = torch.randint(0, 20, (2, 7), generator=torch.Generator().manual_seed(0))
    y, _ = built.model.apply(params, state, tokens)
    assert y.shape == (2, 7, 3) == built.output_shape
    table = params[next(n for n in params if n.startswith("0."))]
    want = torch.nn.functional.linear(table[tokens], params["1.weight"], params["1.bias"])
    torch.testing.assert_close(y, want, msg="an embedding lookup, then the linear layer")


def test_model_meta_keeps_config_with_overrides() -> None:
    model = build(MLP, {"hidden": "4"}).model
    assert model.meta["config"]["vars"]["hidden"] == 4
    assert model.meta["input_shape"] == (3, 8)


def test_build_without_input_shape_needs_explicit_sizes() -> None:
    config = {"layers": [{"type": "linear", "params": {"in_features": 3, "out_features": 2}}]}
    built = build(config)
    assert built.output_shape is None and built.total_params == 8
    raises_at("layers[0].params.in_features",
              {"layers": [{"type": "linear", "params": {"out_features": 2}}]})


# --- references, overrides, expressions ----------------------------------------------------

def test_overrides_set_vars_and_paths() -> None:
    out = apply_overrides(MLP, parse_overrides(["hidden=4", "layers[3].params.out_features=7",
                                                "input_shape=[1, 8]"]))
    assert out["vars"]["hidden"] == 4 and out["layers"][3]["params"]["out_features"] == 7
    assert build(out).output_shape == (1, 7)
    assert MLP["vars"]["hidden"] == 16, "overrides must not mutate the input config"
    with pytest.raises(ConfigError, match="did you mean 'hidden'"):
        apply_overrides(MLP, {"hiden": "3"})
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_overrides(["hidden"])
    with pytest.raises(ConfigError, match=r"layers\[9\] does not exist"):
        apply_overrides(MLP, {"layers[9].params.out_features": "3"})


def test_parse_overrides_keeps_text_and_values_parse_as_json() -> None:
    assert parse_overrides(["a=1", "b = relu", "c=[1, 2]"]) == {"a": "1", "b": "relu",
                                                                 "c": "[1, 2]"}
    out = apply_overrides({"vars": {"a": 0, "b": "", "c": None}, "layers": []},
                          {"a": "1.5", "b": "relu", "c": "[1, 2]"})
    assert out["vars"] == {"a": 1.5, "b": "relu", "c": [1, 2]}


@pytest.mark.parametrize(("expr", "value"), [
    ("$h * 2", 32), ("$h // 3 + 1", 6), ("$a * $h", 48), ("-$h ** 2", -256),
    ("max($h, 20) - min(1, 2)", 19), ("$s[-1]", 4), ("$h if $h > 10 else 0", 16),
    ("$h % 5", 1), ("$h / 4", 4.0), ("$name", "relu"), ("($h, 2)", (16, 2)),
])
def test_expression_values(expr: str, value: Any) -> None:
    env = {"h": 16, "a": 3, "s": (1, 2, 4), "name": "relu"}
    assert evaluate_in(expr, env) == value


@pytest.mark.parametrize("expr", [
    "$h.__class__", "$__import__('os')", "$(lambda: 1)()", "$[x for x in s]", "$h ** 1000",
    "$open('f')", "$s[0:2]", "$h *", "$unknown + 1", "$'ab' * 100", "$h / 0",
])
def test_expression_rejects_unsafe_or_bad(expr: str) -> None:
    with pytest.raises(ExprError):
        evaluate_in(expr, {"h": 16, "s": (1, 2, 4)})


def test_variable_cycles_and_unknown_names() -> None:
    message = raises_at("vars.a", {**MLP, "vars": {"a": "$b + 1", "b": "$a"}})
    assert "cyclic reference a -> b -> a" in message
    message = raises_at("layers[0].params.out_features",
                        {**MLP, "vars": {"hidden": 3}})
    assert "unknown variable $wide" in message
    raises_at("vars.x", {**MLP, "vars": {**MLP["vars"], "x": "$hiddn"}})


# --- files ---------------------------------------------------------------------------------

def test_json_and_toml_files_build_the_same_model(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text(json.dumps(MLP))
    (tmp_path / "m.toml").write_text(
        'name = "mlp"\ninput_shape = [3, 8]\n[vars]\nhidden = 16\nwide = "$hidden * 2"\n'
        '[[layers]]\ntype = "linear"\nparams = { out_features = "$wide" }\n'
        '[[layers]]\ntype = "relu"\n[[layers]]\ntype = "layer_norm"\n'
        '[[layers]]\ntype = "linear"\nname = "head"\nparams = { out_features = 4 }\n')
    assert load_config(tmp_path / "m.toml")["layers"][1] == {"type": "relu"}
    a = load_model(str(tmp_path / "m.json"))
    b = load_model(str(tmp_path / "m.toml"), {"hidden": "16"})
    pa, pb = a.init(random.key(2))[0], b.init(random.key(2))[0]
    assert all(torch.equal(pa[n], pb[n]) for n in pa) and list(pa) == list(pb)


def test_file_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text('{"layers": [\n  {"type": "linear",,}\n]}')
    with pytest.raises(ConfigError, match=r"bad.json: invalid JSON at line 2"):
        load_config(tmp_path / "bad.json")
    (tmp_path / "bad.toml").write_text("layers = [")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(tmp_path / "bad.toml")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="mapping at the top"):
        load_config(tmp_path / "list.json")
    with pytest.raises(ConfigError, match="no such config file"):
        load_model(str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="did you mean 'conv4'"):
        load_model("conv5")


def test_yaml_needs_pyyaml_or_loads(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text("input_shape: [1, 2]\nlayers:\n  - type: relu\n")
    try:
        import yaml  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="PyYAML"):
            load_config(tmp_path / "m.yaml")
    else:
        assert load_config(tmp_path / "m.yaml")["layers"] == [{"type": "relu"}]


def test_errors_from_files_name_the_file(tmp_path: Path) -> None:
    config = {**MLP, "layers": [{"type": "linear", "params": {"out_features": "64x"}}]}
    (tmp_path / "m.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as info:
        load_model(str(tmp_path / "m.json"))
    assert str(info.value) == (f"{tmp_path / 'm.json'}: layers[0].params.out_features: "
                               'expected a positive int, got "64x"')


# --- registry ------------------------------------------------------------------------------

@pytest.fixture
def scaled_layer() -> Any:
    @register_layer("custom.scaled", infer={"in_features": lambda s: s[-1]},
                    positive=("out_features",))
    def scaled(in_features: int, out_features: int, *, scale: float = 2.0) -> Model:
        inner = nn.linear(in_features, out_features)
        if scale == 0:
            raise TypeError("scale must be non-zero")  # a layer's own TypeError
        return nn.serial({"lin": inner, "mul": nn.lift(lambda x: x * scale, "mul")})

    yield scaled
    REGISTRY.remove("custom.scaled")


def test_custom_layer_registered_in_code(scaled_layer: Any) -> None:
    config = {"input_shape": [2, 3], "layers": [
        {"type": "custom.scaled", "params": {"out_features": 4, "scale": 3}}]}
    built = build(config)
    params, state = built.model.init(random.key(0))
    x = torch.ones(2, 3)
    y, _ = built.model.apply(params, state, x)
    expected = 3 * (x @ params["0.lin.weight"].T + params["0.lin.bias"])
    torch.testing.assert_close(y, expected)
    message = raises_at("layers[0].params.scale", {**config, "layers": [
        {"type": "custom.scaled", "params": {"out_features": 4, "scale": 0}}]})
    assert "TypeError: scale must be non-zero" in message
    raises_at("layers[0].type", {**config, "layers": [{"type": "custom.scaeld"}]})
    with pytest.raises(ValueError, match="already registered"):
        register_layer("custom.scaled", scaled_layer)


def test_custom_prefix_never_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    message = raises_at("layers[0].type", {"layers": [{"type": "custom.os:system"}]})
    assert "unknown layer type" in message


def test_entry_point_layers_load_on_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeEntryPoint:
        name = "plugin.double"
        value = "plugin:double"

        def load(self) -> Any:
            return lambda: nn.lift(lambda x: 2 * x, "double")

    monkeypatch.setattr("funcgraph.factory.registry.entry_points", lambda: (FakeEntryPoint(),))
    assert "plugin.double" in REGISTRY.names()
    try:
        built = build({"input_shape": [1, 2], "layers": ["plugin.double"]})
        y, _ = built.model.apply({}, {}, torch.ones(1, 2))
        assert torch.equal(y, torch.full((1, 2), 2.0))
    finally:
        REGISTRY.remove("plugin.double")
    assert isinstance(entry_points(), tuple)


def test_lazy_entry_for_missing_module_is_a_config_error() -> None:
    REGISTRY.add_lazy("custom.absent", "funcgraph.no_such_module:thing")
    try:
        message = raises_at("layers[0].type", {"layers": ["custom.absent"]})
        assert "not available" in message
    finally:
        REGISTRY.remove("custom.absent")


def test_shape_rule_when_meta_cannot_run() -> None:
    def data_dependent() -> Model:
        def fn(x: torch.Tensor) -> torch.Tensor:
            return x[: int(x.sum().item() > 0) + 1]  # needs values: impossible on meta

        return nn.lift(fn, "data_dependent")

    REGISTRY.add(LayerType("custom.dd", data_dependent, shape_rule=lambda s: (2, *s[1:])))
    REGISTRY.add(LayerType("custom.dd_norule", data_dependent))
    try:
        built = build({"input_shape": [4, 3], "layers": ["custom.dd", {
            "type": "linear", "params": {"out_features": 2}}]})
        assert built.rows[0].output_shape == (2, 3) and built.output_shape == (2, 2)
        message = raises_at("layers[0]", {"input_shape": [4, 3], "layers": ["custom.dd_norule"]})
        assert "cannot take input of shape (4, 3)" in message
    finally:
        REGISTRY.remove("custom.dd")
        REGISTRY.remove("custom.dd_norule")


# --- errors --------------------------------------------------------------------------------

@pytest.mark.parametrize(("layers", "path", "fragment"), [
    ([{"type": "linear", "params": {"out_features": "64x"}}], "layers[0].params.out_features",
     'expected a positive int, got "64x"'),
    ([{"type": "linaer"}], "layers[0].type", "did you mean 'linear'"),
    ([{"params": {}}], "layers[0].type", "missing"),
    ([{"type": "linear", "params": {"out_feature": 3}}], "layers[0].params.out_feature",
     "did you mean 'out_features'"),
    ([{"type": "linear", "params": {"in_features": 5, "out_features": 3}}],
     "layers[0].params.in_features", "does not match the input shape (3, 8)"),
    (["relu", {"type": "residual", "body": {"type": "linear", "params": {"out_features": 4}}}],
     "layers[1]", "body output shape (3, 4) does not match input (identity shortcut) shape (3, 8)"),
    ([{"type": "parallel", "params": {"combine": "sum"}, "branches": [
        {"type": "linear", "params": {"out_features": 4}}, "relu"]}],
     "layers[0]", "branch 1 output shape (3, 8) and branch 0 output shape (3, 4)"),
    ([{"type": "conv2d", "params": {"out_channels": 4, "kernel_size": 3}}], "layers[0]",
     "conv2d cannot take input of shape (3, 8)"),
    ([{"type": "linear", "params": {"out_features": 3, "bias": "yes"}}],
     "layers[0].params.bias", 'expected a boolean (true/false), got "yes"'),
    ([{"type": "conv1d", "params": {"out_channels": 3, "kernel_size": [3, "a"]}}],
     "layers[0].params.kernel_size", "expected an int or a list of ints"),
    ([{"type": "dropout", "params": {"drop_prob": 1.5}}], "layers[0].params.drop_prob",
     "drop_prob must be in [0, 1)"),
    ([{"type": "linear", "params": {"out_features": 3}, "extra": 1}], "layers[0].extra",
     "unknown key for linear"),
    (["relu", {"type": "relu", "name": "0"}], "layers[1].name", "duplicate layer name"),
    ([{"type": "relu", "name": "a.b"}], "layers[0].name", "letters, digits and underscores"),
    ([{"type": "residual"}], "layers[0].body", "missing: residual needs body"),
    ([{"type": "parallel", "branches": []}], "layers[0].branches", "non-empty list"),
    ([3], "layers[0]", "expected a layer"),
    ([], "layers", "at least one layer"),
    ([{"type": "linear", "params": [1]}], "layers[0].params", "expected a mapping"),
])
def test_invalid_configs_name_the_path(layers: Any, path: str, fragment: str) -> None:
    message = raises_at(path, {**MLP, "layers": layers})
    assert fragment in message, message


@pytest.mark.parametrize(("config", "path"), [
    ({"layers": ["relu"], "model": "relu"}, "layers"),
    ({"vars": []}, "vars"),
    ({"layers": "relu"}, "layers"),
    ({"layerz": []}, "layerz"),
    ({"input_shape": [1, "a"], "layers": ["relu"]}, "input_shape"),
    ({"input_shape": [1, 2], "input_dtype": "float33", "layers": ["relu"]}, "input_dtype"),
    ({"name": 3, "layers": ["relu"]}, "name"),
])
def test_invalid_top_level(config: dict[str, Any], path: str) -> None:
    raises_at(path, config)


# --- CLI -----------------------------------------------------------------------------------

def test_cli_model_check_prints_table(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text(json.dumps(MLP))
    result = CliRunner().invoke(app, ["model", "check", str(tmp_path / "m.json"),
                                      "--set", "hidden=4", "--input-shape", "5,8"])
    assert result.exit_code == 0, result.output
    for text in ("layer_norm", "(5, 8)", "head", "total", f"{(8 * 8 + 8) + 16 + (8 * 4 + 4)}"):
        assert text in result.output, f"{text!r} missing from:\n{result.output}"


def test_cli_model_check_bad_config_exits_2_with_one_line(tmp_path: Path) -> None:
    config = {**MLP, "layers": [{"type": "linaer", "params": {"out_features": 3}}]}
    (tmp_path / "m.json").write_text(json.dumps(config))
    result = CliRunner().invoke(app, ["model", "check", str(tmp_path / "m.json")])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "layers[0].type" in lines[0], result.output
    result = CliRunner().invoke(app, ["model", "check", str(tmp_path / "m.json"),
                                      "--input-shape", "1,x"])
    assert result.exit_code == 2 and "--input-shape" in result.output


def test_cli_model_list() -> None:
    result = CliRunner().invoke(app, ["model", "list"])
    assert result.exit_code == 0 and "linear" in result.output and "conv4" in result.output


def test_check_model_for_a_registered_model_sets_constructor_params() -> None:
    built = check_model("mlp", {"hidden": "[8]"})
    assert built.total_params == (1 * 8 + 8) + (8 * 1 + 1)


def test_registered_model_by_name_takes_overrides_as_params() -> None:
    built = check_model("gru", {"input_size": "3", "hidden_size": "4"})
    assert built.total_params == 3 * 4 * (3 + 4) + 2 * 3 * 4, "nn.GRU's parameter count"


def test_huge_layers_check_without_allocating() -> None:
    config = {"input_shape": [1, 100_000], "layers": [
        {"type": "linear", "params": {"out_features": 100_000}},
        {"type": "linear", "params": {"out_features": 3}, "init": {"weight": "orthogonal"}}]}
    built = build(config)
    assert built.total_params == 100_000 * 100_001 + 3 * 100_001
    assert built.output_shape == (1, 3)


# --- example configs (docs/factory.md runs in tests/test_docs.py) ---------------------------

ROOT = Path(__file__).resolve().parents[1]
DATA_SIZES = {"darts_search.toml": ({"model.params.num_classes": "5"}, (2, 1, 8, 8))}
"""What a command gives an example from its data: ``funcgraph search --model`` configs leave
out the sizes the search sets (tests/test_search_model.py)."""


@pytest.mark.parametrize("path", sorted((ROOT / "examples" / "configs").iterdir()),
                         ids=lambda p: p.name)
def test_example_configs_build_init_and_run(path: Path) -> None:
    overrides, input_shape = DATA_SIZES.get(path.name, (None, None))
    built = check_model(str(path), overrides, input_shape=input_shape)
    params, state = built.model.init(random.key(0))
    x = random.normal(random.key(1), built.input_shape)
    y, _ = built.model.apply(params, state, x)
    assert tuple(y.shape) == built.output_shape


# --- extension points and value checking ---------------------------------------------------

def test_user_block_with_a_slot() -> None:
    from funcgraph.factory import Slot

    @register_layer("custom.twice", slots=(Slot("body"),))
    def twice(body: Model) -> Model:
        """Apply ``body`` two times with the same params."""
        return nn.composite("twice", {"body": body}, lambda run, x: run("body", run("body", x)))

    try:
        built = build({"input_shape": [2, 4], "layers": [{"type": "custom.twice", "body": [
            {"type": "linear", "params": {"out_features": 4}}, "tanh"]}]})
        params, state = built.model.init(random.key(0))
        assert list(params) == ["0.body.0.weight", "0.body.0.bias"]
        x = torch.ones(2, 4)
        once = torch.tanh(x @ params["0.body.0.weight"].T + params["0.body.0.bias"])
        expected = torch.tanh(once @ params["0.body.0.weight"].T + params["0.body.0.bias"])
        torch.testing.assert_close(built.model.apply(params, state, x)[0], expected)
        assert [r.module for r in built.rows] == ["0", "0.body.0", "0.body.1"]
        message = raises_at("layers[0].body[0].params.out_features", {
            "input_shape": [2, 4], "layers": [{"type": "custom.twice", "body": [
                {"type": "linear", "params": {"out_features": "x"}}]}]})
        assert "expected a positive int" in message
    finally:
        REGISTRY.remove("custom.twice")


def test_meta_run_false_needs_a_shape_rule() -> None:
    with pytest.raises(ValueError, match="needs a shape_rule"):
        register_layer("custom.norule", nn.relu, meta_run=False)
    assert "custom.norule" not in REGISTRY


@pytest.mark.parametrize(("value", "hint", "expected"), [
    ([3, 3], int | tuple[int, int], (3, 3)),
    (3, int | tuple[int, int], 3),
    (4.0, int, 4),
    (2, float, 2.0),
    ("float64", torch.dtype, torch.float64),
    (None, int | None, None),
    ("row", Literal["batch", "row"], "row"),
    ([1, 2, 3], tuple[int, ...], (1, 2, 3)),
])
def test_coerce_accepts(value: Any, hint: Any, expected: Any) -> None:
    assert coerce(value, hint, "p") == expected


@pytest.mark.parametrize(("value", "hint"), [
    (True, int), (4.5, int), ("3", int), ([3], tuple[int, int]), ("float33", torch.dtype),
    ("col", Literal["batch", "row"]), ({"a": 1}, list[int]), (1, bool), (None, str),
])
def test_coerce_rejects_with_path(value: Any, hint: Any) -> None:
    with pytest.raises(ConfigError, match=r"^p: expected "):
        coerce(value, hint, "p")


def test_describe_params_marks_inferred_required_optional_and_slots() -> None:
    assert describe_params(REGISTRY.get("linear")) == "(in_features) out_features [bias dtype]"
    assert describe_params(REGISTRY.get("residual")) == "| body [shortcut]"


def test_stochastic_depth_block_equals_code_and_post_sees_the_body_output() -> None:
    config = {"input_shape": [2, 3, 6, 6], "layers": [{
        "type": "stochastic_depth", "name": "block", "params": {"drop_prob": 0.5},
        "body": [{"type": "conv2d", "name": "conv", "params": {"out_channels": 4,
                                                               "kernel_size": 3, "padding": 1}},
                 {"type": "batch_norm", "name": "bn"}],
        "shortcut": {"type": "conv2d", "params": {"out_channels": 4, "kernel_size": 1}},
        "post": {"type": "batch_norm"}}]}  # num_features inferred from the body's 4 channels
    built = build(config)
    code = nn.serial({"block": nn.stochastic_depth(
        nn.serial({"conv": nn.conv2d(3, 4, 3, padding=1), "bn": nn.batch_norm(4)}), 0.5,
        shortcut=nn.conv2d(3, 4, 1), post=nn.batch_norm(4))})
    p_code, s_code = code.init(random.key(0))
    p_cfg, s_cfg = built.model.init(random.key(0))
    assert list(p_cfg) == list(p_code) and list(s_cfg) == list(s_code)
    assert all(torch.equal(p_cfg[n], p_code[n]) for n in p_code), "same key, same params"
    x = random.normal(random.key(1), (2, 3, 6, 6))
    for seed in range(4):  # both outcomes of the drop draw
        y_code, _ = code.apply(p_code, s_code, x, key=random.key(seed), train=True)
        y_cfg, _ = built.model.apply(p_code, s_code, x, key=random.key(seed), train=True)
        torch.testing.assert_close(y_cfg, y_code)
    assert [r.output_shape for r in built.rows if r.module == "block.post"] == [(2, 4, 6, 6)]
