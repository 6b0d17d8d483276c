"""The algorithm registry: a user's own algorithm runs from the command line, the command's
choices and defaults come from the registry, and every library default equals the CLI's."""

from __future__ import annotations

import inspect
import json
import sys
import textwrap
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from funcgraph.cli import app
from funcgraph.errors import ConfigError
from funcgraph.meta import (
    FomamlSettings,
    ImamlSettings,
    MamlppSettings,
    MamlSettings,
    ReptileSettings,
    TaskInfo,
    algorithm_names,
    algorithm_type,
    evaluate,
    imaml,
    maml,
    mamlpp,
    mean_task_grads,
    register_algorithm,
    reptile,
    task_evals,
)
from funcgraph.meta.registry import unregister_algorithm
from funcgraph.meta.settings import MAMLPP_META_STEPS
from funcgraph.runs.meta_training.config import CONFIG_NAMES, MetaTrainConfig, default_config

SINE = ["meta-train", "--dataset", "sinusoid", "--steps", "2", "--meta-batch", "2",
        "--episodes", "2", "--val-episodes", "1", "--validate-every", "0", "--device", "cpu"]

USER_MODULE = '''
from dataclasses import dataclass

from funcgraph.meta import AdaptSettings, maml, register_algorithm


@dataclass(frozen=True)
class MineSettings(AdaptSettings):
    inner_steps: int = 2
    inner_lr: float = 0.02
    temperature: float = 1.0  # a field no option of meta-train knows


BUILT = []


def build_mine(apply, settings, info):
    BUILT.append(settings)
    return maml(apply, kind=info.kind, inner_steps=settings.inner_steps,
                inner_lr=settings.inner_lr, eval_steps=settings.eval_steps, name="mine")


register_algorithm("mine", settings=MineSettings, build=build_mine,
                   summary="MAML with two inner steps")
'''


def meta_train_params() -> dict[str, Any]:
    """The ``meta-train`` command's options by parameter name."""
    return {p.name: p for p in get_command(app).commands["meta-train"].params}


def test_a_users_algorithm_runs_with_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    (tmp_path / "my_algos.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        result = CliRunner().invoke(app, [*SINE, "--import", "my_algos", "--algo", "mine",
                                          "--out", str(tmp_path / "run")])
        assert result.exit_code == 0, result.output
        config = json.loads((tmp_path / "run" / "config.json").read_text())
        assert config["algo"] == "mine" and config["inner_steps"] == 2, (
            f"the run starts from the algorithm's own defaults: {config}")
        assert config["inner_lr"] == 0.01, "then the dataset's (sinusoid: inner lr 0.01)"
        built = sys.modules["my_algos"].BUILT
        assert built and built[-1].inner_steps == 2 and built[-1].inner_lr == 0.01, built
        assert "mse" in result.output, result.output
    finally:
        unregister_algorithm("mine")
        sys.modules.pop("my_algos", None)


def test_a_plugins_own_settings_and_its_import_live_in_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_algos.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    try:
        result = CliRunner().invoke(app, [*SINE, "--import", "my_algos", "--algo", "mine",
                                          "--setting", "temperature=0.5", "--out", str(run)])
        assert result.exit_code == 0, result.output
        config = json.loads((run / "config.json").read_text())
        assert config["settings"] == {"temperature": 0.5} and config["imports"] == ["my_algos"]
        assert sys.modules["my_algos"].BUILT[-1].temperature == 0.5
        for args in (["--setting", "temprature=2"], ["--setting", "inner_lr=0.1"]):
            bad = CliRunner().invoke(app, [*SINE, "--import", "my_algos", "--algo", "mine", *args,
                                           "--out", str(tmp_path / "bad")])
            assert bad.exit_code == 2 and "Traceback" not in bad.output, bad.output
        assert "mine has no setting 'temprature'; its settings are" in " ".join(
            CliRunner().invoke(app, [*SINE, "--import", "my_algos", "--algo", "mine", "--setting",
                                     "temprature=2"]).output.split())
        # A later process knows nothing of the plugin: evaluate and --resume import it again.
        unregister_algorithm("mine")
        sys.modules.pop("my_algos", None)
        result = CliRunner().invoke(app, ["evaluate", str(run), "--episodes", "2"])
        assert result.exit_code == 0 and "mse" in result.output, result.output
        unregister_algorithm("mine")
        sys.modules.pop("my_algos", None)
        result = CliRunner().invoke(app, [*SINE, "--algo", "mine", "--setting", "temperature=0.5",
                                          "--steps", "3", "--resume", "--out", str(run)])
        assert result.exit_code == 0, result.output
        # Gone: one line naming the run and the module.
        unregister_algorithm("mine")
        sys.modules.pop("my_algos", None)
        (tmp_path / "my_algos.py").unlink()
        result = CliRunner().invoke(app, ["evaluate", str(run), "--episodes", "2"])
        assert result.exit_code == 2, result.output
        said = " ".join(result.output.split())
        assert (f"the run in {run} was made with --import my_algos, which does not import here "
                "(ModuleNotFoundError: No module named 'my_algos')") in said, result.output
    finally:
        unregister_algorithm("mine")
        sys.modules.pop("my_algos", None)


def test_an_unknown_algorithm_names_the_registered_ones() -> None:
    result = CliRunner().invoke(app, [*SINE, "--algo", "mamlp"])
    assert result.exit_code == 2, result.output
    assert "--algo mamlp: not a registered algorithm (did you mean 'mamlpp'?)" in result.output
    assert "register_algorithm" in result.output


def test_the_algo_help_lists_the_registry() -> None:
    help_text = meta_train_params()["algo"].help
    # the help is written when the command module loads: funcgraph's own algorithms are in it;
    # one a test registered later in this process (a docs page's --import) may not be
    built_in = [n for n in algorithm_names()
                if algorithm_type(n).settings.__module__.startswith("funcgraph.")]
    assert len(built_in) >= 8, built_in
    for name in built_in:
        assert name in help_text, f"--algo's help misses {name}"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"settings": dict}, "settings must be a frozen dataclass deriving from"),
    ({"build": 3}, "build must be a function"),
    ({"kinds": ("images",)}, "kinds must name"),
])
def test_an_incomplete_registration_is_refused(kwargs: dict[str, Any], message: str) -> None:
    entry: dict[str, Any] = {"settings": MamlSettings, "build": lambda a, s, i: None, **kwargs}
    with pytest.raises(ConfigError, match=message):
        register_algorithm("broken", **entry)
    assert "broken" not in algorithm_names()
    with pytest.raises(ConfigError, match="'maml' is already registered"):
        register_algorithm("maml", settings=MamlSettings, build=lambda a, s, i: None)


def _signature_default(fn: Any, name: str) -> Any:
    return inspect.signature(fn).parameters[name].default


@pytest.mark.parametrize("algo", ["maml", "fomaml", "metasgd", "anil", "mamlpp", "imaml",
                                  "reptile"])
def test_every_cli_default_equals_the_library_default(algo: str) -> None:
    """For each command option that mirrors a setting, the config ``meta-train --algo A``
    starts from holds the library function's default for that argument."""
    library = {"maml": maml, "fomaml": maml, "metasgd": maml, "anil": maml,
               "mamlpp": mamlpp, "imaml": imaml, "reptile": reptile}[algo]
    options = meta_train_params()
    cfg = default_config(algo, "glyphs")
    entry = algorithm_type(algo)
    checked = 0
    for setting in entry.setting_names():
        held = CONFIG_NAMES.get(setting, setting)
        if held not in options:
            continue
        assert options[held].default in (None, False), (
            f"--{held}'s default is {options[held].default!r}: it must come from the registry")
        want = entry.default(setting)
        # A run recipe may set a setting tied to the run's length (MAML++'s first-order
        # warm-up): the run starts from the recipe's value, the library from the setting's.
        run_want = entry.recipe.given().get(held, want)
        assert getattr(cfg, held) == run_want or (setting == "first_order" and want), (
            f"{algo}: --{held} defaults to {getattr(cfg, held)!r}, the recipe and settings to "
            f"{run_want!r}")
        if setting in inspect.signature(library).parameters:
            lib = _signature_default(library, setting)
            if algo == "fomaml" and setting == "first_order":
                lib = True  # fomaml() is maml(first_order=True)
            assert lib == want, f"{library.__name__}({setting}=) defaults to {lib!r}, {want!r}"
            checked += 1
    assert checked >= 3, f"{algo}: only {checked} settings compared"


def test_the_run_layer_defaults_equal_the_library() -> None:
    assert _signature_default(maml, "inner_lr") == MetaTrainConfig.inner_lr == 0.5
    assert _signature_default(mamlpp, "inner_steps") == MamlppSettings.inner_steps == 3
    assert _signature_default(mamlpp, "meta_steps") == MAMLPP_META_STEPS == (
        default_config("mamlpp").steps)
    assert _signature_default(imaml, "inner_steps") == ImamlSettings.inner_steps == (
        default_config("imaml").inner_steps) == 5
    assert _signature_default(reptile, "eval_steps") == ReptileSettings.eval_steps == (
        default_config("reptile").inner_steps_eval) == 30
    assert FomamlSettings.first_order and not MamlSettings.first_order
    options = meta_train_params()
    assert options["strategy"].default == "auto"
    for fn in (mean_task_grads, task_evals, evaluate):
        assert _signature_default(fn, "strategy") == "auto", fn.__name__


def test_mamlpp_anneals_over_the_studys_share_of_the_run() -> None:
    settings = MamlppSettings()
    assert settings.anneal_steps(MAMLPP_META_STEPS) == 913  # as the chosen trial's run
    assert MamlppSettings(msl_anneal_steps=7).anneal_steps(1000) == 7
    assert TaskInfo().kind == "classification"


def test_settings_records_are_typed_and_checked() -> None:
    for cls in (MamlSettings, MamlppSettings, ImamlSettings, ReptileSettings):
        names = [f.name for f in fields(cls)]
        assert names[:3] == ["inner_steps", "inner_lr", "eval_steps"], (cls, names)
    with pytest.raises(ConfigError, match=r"reptile: inner_optimizer must be one of "
                                          r"\['sgd', 'adam'\], got 'lbfgs'"):
        ReptileSettings(inner_optimizer="lbfgs")
    with pytest.raises(ConfigError, match=r"maml: inner_lr must be a finite number > 0, got nan"):
        MamlSettings(inner_lr=float("nan"))


def test_a_learner_carries_its_settings() -> None:
    learner = maml(lambda p, x: x @ p["w"], inner_lr=0.3)
    assert learner.settings == MamlSettings(inner_lr=0.3)


def test_the_registry_and_settings_import_no_torch() -> None:
    import subprocess

    code = ("import sys; import funcgraph.meta.registry, funcgraph.meta.settings; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False", "reading the algorithm registry imported torch"


def test_functions_named_like_their_modules_stay_functions() -> None:
    import importlib
    import types

    import funcgraph.meta as meta

    for name in ("imaml", "mamlpp", "reptile", "protonet", "evaluate"):
        module = importlib.import_module(f"funcgraph.meta.{name}")
        assert isinstance(module, types.ModuleType)
        assert callable(getattr(meta, name)) and not isinstance(getattr(meta, name),
                                                                types.ModuleType), name
