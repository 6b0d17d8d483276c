"""Hostile configs end at once: expressions stay within their limits (integer bits, sizes,
nesting, text, ``round`` digits), and checking or building a model of any size allocates
nothing for it (big tensors live on meta until the caller runs ``model.init``)."""

from __future__ import annotations

import json
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from typer.testing import CliRunner

from funcgraph import random
from funcgraph.cli import app
from funcgraph.errors import ConfigError
from funcgraph.factory import build, check_model
from funcgraph.factory.expr import MAX_DEPTH, MAX_SIZE, MAX_TEXT, evaluate_in
from funcgraph.factory.meta_tensors import BIG_DRAW

MLP_JSON = Path(__file__).resolve().parents[1] / "examples" / "configs" / "mlp.json"


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()``'s result, or the exception it raised, asserting it ended within ``seconds``;
    it runs in a daemon thread, so a regression fails the test instead of hanging it."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except Exception as e:  # the caller asserts on it
            box["value"] = e

    start = time.perf_counter()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=10 * seconds)
    elapsed = time.perf_counter() - start
    assert not thread.is_alive(), f"still running after {10 * seconds:.0f} s"
    assert elapsed < seconds, f"took {elapsed:.2f} s, more than {seconds} s"
    return box["value"]


def refused(config: dict[str, Any], path: str, *needles: str,
            overrides: dict[str, str] | None = None) -> str:
    """Build ``config`` (within a second); assert a ConfigError at a config path starting
    with ``path`` (a deep one is long) that mentions each needle; return its message."""
    error = within(1.0, lambda: build(config, overrides))
    assert isinstance(error, ConfigError), f"expected a ConfigError, got {error!r}"
    message = str(error)
    where = message.partition(": ")[0]
    assert where.startswith(path), f"expected a path starting {path!r} first in: {message}"
    for needle in needles:
        assert needle in message, f"expected {needle!r} in: {message}"
    return message


@pytest.fixture(scope="module", autouse=True)
def warm() -> None:
    """Builds of the same kinds first: lazy imports and the first calls of torch's meta
    kernels (about a second on a busy machine) are not the limits under test."""
    build({"vars": {"n": 1}, "layers": ["relu"]})
    check_model(str(MLP_JSON), {"hidden": "100000"})  # fc1 is past BIG_DRAW: on meta
    build({"model": {"type": "conv4", "params": {"ways": 2, "in_channels": 1, "hidden": 1000}}})


def with_vars(**variables: Any) -> dict[str, Any]:
    return {"vars": variables, "layers": ["relu"]}


# --- bounded expressions -----------------------------------------------------------------

def test_chained_powers_are_refused_before_computing() -> None:
    chain = {"n": 10, "a": "$n ** 64", "b": "$a ** 64", "c": "$b ** 64", "d": "$c ** 64",
             "e": "$d ** 64"}
    message = refused(with_vars(**chain), "vars.a", "10 ** 64", "|x| < 2**63")
    assert "193 bits" in message, f"the message should say how big the result is: {message}"
    squares = {"n": 10, "a": "$n ** 16", "b": "$a * $a", "c": "$b * $b", "d": "$c * $c"}
    refused(with_vars(**squares), "vars.b", "at most 63 bits")


def test_round_with_huge_digits_is_refused() -> None:
    refused(with_vars(x="$round(10**64, -10**9)"), "vars.x", "10 ** 64", "2**63")
    refused(with_vars(big=10**18, x="$round($big, -10**9)"), "vars.x", "ndigits -1000000000",
            "-64 <= ndigits <= 64")
    assert evaluate_in("$round(x, -2)", {"x": 12345}) == 12300, "a normal round still works"
    assert evaluate_in("$round(x, 2)", {"x": 1.23456}) == 1.23, "a normal round still works"


@pytest.mark.parametrize("expr", ["$n * [0]", "$[0] * $n", "$s * $n", "$n * (1, 2)"])
def test_repetition_is_refused_whatever_the_count(expr: str) -> None:
    refused(with_vars(n=10**9, s="ab", x=expr), "vars.x", "do not repeat", "1000000000")


def test_concatenation_beyond_the_size_limit_is_refused_before_building() -> None:
    doubling = {"s0": "x", **{f"s{i}": f"$s{i - 1} + $s{i - 1}" for i in range(1, 40)}}
    refused(with_vars(**doubling), "vars.s14", f"more than {MAX_SIZE} items")
    nesting = {"l0": [0], **{f"l{i}": f"$[l{i - 1}, l{i - 1}]" for i in range(1, 40)}}
    refused(with_vars(**nesting), "vars.l12", f"at most {MAX_SIZE} items")
    assert evaluate_in("$a + b", {"a": [1], "b": [2, 3]}) == [1, 2, 3], "small lists still join"


def test_string_formatting_and_complex_results_are_refused() -> None:
    refused(with_vars(s="%*d", x="$s % (10**6, 1)"), "vars.x", "do not format strings")
    refused(with_vars(n=-1, x="$n ** 0.5"), "vars.x", "complex number")


def test_nesting_is_bounded_through_variables_lists_and_syntax() -> None:
    chain = {"a0": 1, **{f"a{i}": f"$a{i - 1} + 1" for i in range(1, 3000)}}
    refused(with_vars(**dict(reversed(chain.items()))), "vars.a", f"deeper than {MAX_DEPTH}")
    refused(with_vars(n=1, x="$n" + "+-" * 200 + "1"), "vars.x", f"deeper than {MAX_DEPTH}")
    nested: Any = "$n"
    for _ in range(58):
        nested = [nested]
    assert build(with_vars(n=1, a=nested)).total_params == 0, "58 lists deep alone is fine"
    refused(with_vars(n=1, c=["$b"], b=["$a"], a=nested), "vars.a[0]", f"deeper than {MAX_DEPTH}")
    assert evaluate_in("$n" + " + 1" * 30, {"n": 0}) == 30, "a sum of 30 terms is fine"


def test_long_expressions_are_refused_before_parsing() -> None:
    refused(with_vars(n=1, x="$n" + "+1" * MAX_TEXT), "vars.x", f"at most {MAX_TEXT}",
            f"{2 * MAX_TEXT + 1} characters")


def test_config_nesting_is_bounded_before_copying_or_building() -> None:
    nested: Any = 0
    for _ in range(100):
        nested = [nested]
    refused(with_vars(x=nested), "vars.x[0]", "deeper than 64 levels")
    layer: Any = "relu"
    for _ in range(500):
        layer = {"type": "serial", "layers": [layer]}
    refused({"input_shape": [2, 3], "model": layer}, "model.layers[0]", "deeper than 64")
    refused(with_vars(x=0), "vars.x[0]", "deeper than 64", overrides={"x": "[" * 99 + "]" * 99})
    built = within(1.0, lambda: build(with_vars(x=0), {"x": "[" * 5000 + "]" * 5000}))
    assert built.model.meta["config"]["vars"]["x"].startswith("[["), (
        "brackets too deep for the JSON parser stay text")


@pytest.mark.parametrize(("expr", "env", "value"), [
    ("$n ** 62", {"n": 2}, 2**62), ("$n ** -2", {"n": 2}, 0.25), ("$n ** 10**18", {"n": 1}, 1),
    ("$(h + 1) * 2", {"h": 3}, 8), ("$[h, h]", {"h": 3}, [3, 3]), ("$x * 1e300", {"x": 1.0}, 1e300),
    ("$s + 'b'", {"s": "a"}, "ab"), ("$-n", {"n": 2**63 - 1}, -(2**63 - 1)),
])
def test_values_within_the_limits_still_evaluate(expr: str, env: dict[str, Any],
                                                 value: Any) -> None:
    assert evaluate_in(expr, env) == value, f"{expr} with {env}"


# --- checking and building never allocate --------------------------------------------------

class LargestRealTensor(TorchFunctionMode):
    """Records the most elements of any non-meta tensor a torch function returns."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self.numel = max(self.numel, t.numel())
        return out


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def allocates_nothing_big(fn: Callable[[], Any]) -> Any:
    """``fn()`` within a second, creating no real tensor over ``BIG_DRAW`` elements and
    raising the peak RSS by less than 256 MB."""
    spy = LargestRealTensor()

    def spied() -> Any:
        with spy:  # torch function modes are per thread: enter it in the one that runs fn
            return fn()

    before = peak_rss_mb()
    value = within(1.0, spied)
    assert spy.numel <= BIG_DRAW, f"a real tensor of {spy.numel} elements was created"
    assert peak_rss_mb() - before < 256, f"peak RSS grew by {peak_rss_mb() - before:.0f} MB"
    return value


def test_check_model_counts_a_huge_mlp_without_allocating() -> None:
    built = allocates_nothing_big(lambda: check_model(str(MLP_JSON), {"hidden": "1000000000"}))
    assert not isinstance(built, Exception), f"check failed: {built!r}"
    assert built.total_params > 10**12, f"total {built.total_params}"
    assert built.rows[1].params == 784 * 10**9 + 10**9, f"fc1 row {built.rows[1]}"


def test_a_model_too_big_for_torch_is_a_config_error_naming_the_layer() -> None:
    error = allocates_nothing_big(lambda: check_model(str(MLP_JSON), {"hidden": "1e12"}))
    assert isinstance(error, ConfigError), f"expected a ConfigError, got {error!r}"
    message = str(error)
    assert "layers[4]" in message and "5e+23 elements" in message, message
    assert "2**63 - 1" in message, f"the message should name torch's limit: {message}"


def test_cli_model_check_of_a_huge_mlp() -> None:
    runner = CliRunner()
    result = within(2.0, lambda: runner.invoke(app, ["model", "check", str(MLP_JSON), "--set",
                                                     "hidden=1000000000"]))
    assert result.exit_code == 0, result.output
    assert "500,000,795,500,000,020" in result.output, result.output
    result = within(2.0, lambda: runner.invoke(app, ["model", "check", str(MLP_JSON), "--set",
                                                     "hidden=1e12"]))
    assert result.exit_code == 2, result.output
    assert "layers[4]" in result.output and "Traceback" not in result.output, result.output


def registered_conv4(hidden: int) -> dict[str, Any]:
    return {"name": "conv4",
            "model": {"type": "conv4", "params": {"ways": 5, "in_channels": 1, "hidden": hidden}}}


def test_building_a_registered_model_does_not_allocate_until_init() -> None:
    built = allocates_nothing_big(lambda: build(registered_conv4(10**8)))
    assert not isinstance(built, Exception), f"build failed: {built!r}"
    assert built.total_params > 10**12, f"total {built.total_params}"
    error = allocates_nothing_big(lambda: build(registered_conv4(10**12)))
    assert isinstance(error, ConfigError), f"expected a ConfigError, got {error!r}"
    assert str(error).startswith("model: conv4 init: needs a tensor of"), str(error)
    small = build(registered_conv4(4)).model
    params, _ = small.init(random.key(0))
    assert all(t.device.type == "cpu" for t in params.values()), "init allocates for real"


def test_init_specs_of_huge_layers_are_checked_on_meta() -> None:
    config = {"input_shape": [1, 8], "layers": [
        {"type": "linear", "params": {"out_features": 10**9},
         "init": {"weight": "orthogonal", "bias": {"type": "constant", "value": 0.5}}}]}
    built = allocates_nothing_big(lambda: build(config))
    assert not isinstance(built, Exception), f"build failed: {built!r}"
    assert built.output_shape == (1, 10**9), f"output {built.output_shape}"


def test_a_200_deep_config_is_refused_before_it_is_walked(tmp_path: Path) -> None:
    from funcgraph.factory.config import MAX_CONFIG_DEPTH

    deep: Any = "relu"
    for _ in range(200):
        deep = [deep]
    message = refused({"name": "deep", "input_shape": [1, 4], "layers": deep}, "layers",
                      f"the config nests deeper than {MAX_CONFIG_DEPTH} levels")
    assert "[0]" * (MAX_CONFIG_DEPTH - 1) in message, message
    path = tmp_path / "deep.json"
    path.write_text(json.dumps({"name": "deep", "input_shape": [1, 4], "layers": deep}))
    result = CliRunner().invoke(app, ["model", "check", str(path)])
    assert result.exit_code == 2 and "nests deeper than" in result.output, result.output
    assert "Traceback" not in result.output, result.output


def test_a_placed_model_is_shaped_on_meta_like_the_model_itself() -> None:
    """A placed model's init moves every tensor to its device; shaping it keeps them on meta
    (with the move's dtype), so its size is checked as the unplaced model's."""
    from funcgraph.factory.meta_tensors import meta_init
    from funcgraph.models import mlp
    from funcgraph.placement import placed_model

    model = mlp(3, 2, hidden=[600, 600])  # a 360,000-entry weight: made on meta
    params, _ = meta_init(placed_model(model, "*=cpu"))
    want, _ = meta_init(model)
    assert {n: (t.device.type, t.shape, t.dtype) for n, t in params.items()} == {
        n: ("meta", t.shape, t.dtype) for n, t in want.items()}
