"""Each input that once ended in a traceback, a silent default or lost work, as a regression
test: one line and exit 2, nothing written, or the run kept intact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from funcgraph.cli import app

SINE = ["meta-train", "--dataset", "sinusoid", "--steps", "2", "--meta-batch", "2",
        "--episodes", "2", "--val-episodes", "2", "--validate-every", "1", "--device", "cpu"]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    output = result.output  # stdout and stderr, interleaved
    assert "Traceback" not in output, output
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{args} raised {result.exception!r}")
    return result.exit_code, output


def one_error_line(output: str) -> str:
    lines = [ln for ln in output.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, f"expected exactly one error line:\n{output}"
    return lines[0]


@pytest.mark.parametrize("args,message", [
    (["--meta-lr", "nan"], "--meta-lr must be a finite number > 0"),
    (["--inner-lr", "inf"], "--inner-lr must be a finite number > 0"),
    (["--meta-lr", "-1"], "--meta-lr must be a finite number > 0"),
    (["--tasks", "5way1shot"], "sinusoid tasks are regression"),
    (["--rotate"], "--rotate"),
    (["--first-order", "--remat"], "--remat"),
    (["--algo", "protonet", "--first-order"], "--first-order applies to the MAML family"),
    (["--backend", "mpi", "--nproc", "2", "--out", "{tmp}/dist"], "--backend mpi"),
])
def test_meta_train_refuses_nonsense_in_one_line(tmp_path: Path, args: list[str],
                                                 message: str) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, output = run(*SINE, *args)
    assert code == 2 and message in one_error_line(output), output


def test_train_refuses_nonsense_and_conflicts(tmp_path: Path) -> None:
    code, output = run("train", "--lr", "inf", "--dry-run")
    assert code == 2 and "--lr must be a finite number > 0" in one_error_line(output), output
    genotype = tmp_path / "g.json"
    genotype.write_text("{}")
    code, output = run("train", "--genotype", str(genotype), "--model", "rnn", "--dry-run")
    assert code == 2 and "--genotype" in one_error_line(output), output


@pytest.mark.parametrize("spec", ["99999999999999999999way1shot", "10000000way1shot",
                                  "2000way1shot"])
def test_impossible_task_specs_are_refused_before_the_model_exists(spec: str) -> None:
    code, output = run("meta-train", "--tasks", spec, "--dry-run")
    assert code == 2 and "way" in one_error_line(output), output


def test_out_that_is_a_file_or_unreachable_is_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    for out in (str(a_file), "/proc/funcgraph-run"):
        code, output = run(*SINE, "--out", out)
        assert code == 2 and "--out" in one_error_line(output), output
    assert a_file.read_text() == "mine", "the file given as --out was touched"


def test_a_binary_model_config_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "model.json"
    config.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    code, output = run(*SINE, "--model", str(config), "--out", str(tmp_path / "run"))
    assert code == 2 and "model.json" in one_error_line(output), output
    assert not (tmp_path / "run").exists(), "a failed start left its run directory"


def test_a_diverging_meta_train_run_stops_with_one_line(tmp_path: Path) -> None:
    code, output = run(*SINE, "--steps", "40", "--meta-lr", "1e30", "--inner-lr", "1e30",
                       "--validate-every", "0", "--out", str(tmp_path / "run"))
    assert code == 2 and "diverged: the loss became" in one_error_line(output), output


def test_a_diverging_loop_keeps_its_last_good_checkpoint(tmp_path: Path) -> None:
    import torch

    from funcgraph.errors import DivergedError
    from funcgraph.train import LoopConfig, Run, run_loop

    def step_fn(step: int, groups: dict) -> tuple[dict, dict]:
        w = groups["params"]["w"] + 1
        return {"params": {"w": w}}, {"loss": float("nan") if step == 3 else float(step)}

    cfg = LoopConfig(total_steps=6, checkpoint_every=1, log_every=1, show_progress=False)
    with Run.create(tmp_path / "run", {"steps": 6}) as r:
        with pytest.raises(DivergedError, match="at step 4; the checkpoint of step 3 is kept"):
            run_loop(r, {"params": {"w": torch.zeros(1)}}, step_fn, cfg)
        groups, meta = r.load("last")
    assert meta["step"] == 3 and float(groups["params"]["w"]) == 3.0, (
        f"the kept checkpoint is step {meta['step']} with w={groups['params']['w']}")
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in metrics.jsonl"))


def test_resume_below_the_steps_done_and_evaluate_names_its_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, output = run(*SINE, "--steps", "3", "--out", str(out))
    assert code == 0, output
    config = (out / "config.json").read_text()
    code, output = run(*SINE, "--steps", "1", "--out", str(out), "--resume")
    assert code == 2 and "--steps 1 is below the 3 steps" in one_error_line(output), output
    assert (out / "config.json").read_text() == config, "a refused resume rewrote config.json"
    code, output = run("evaluate", str(out), "--episodes", "2", "--device", "cpu",
                       "--checkpoint", "last")
    assert code == 0 and "(last checkpoint)" in output, output


def test_export_of_a_run_needs_no_other_flag(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, output = run(*SINE, "--out", str(out))
    assert code == 0, output
    code, output = run("export", str(out), "--out", str(tmp_path / "m.pt2"))
    assert code == 0 and "input [1, 1]" in output, output  # the sinusoid MLP: (batch, 1)


def test_onnx_without_its_packages_writes_nothing(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from funcgraph.runs import export as export_module

    out = tmp_path / "run"
    assert run(*SINE, "--out", str(out))[0] == 0
    monkeypatch.setattr(export_module, "onnx_available", lambda: False)
    code, output = run("export", str(out), "--out", str(tmp_path / "m.pt2"), "--onnx",
                       str(tmp_path / "m.onnx"))
    assert code == 2 and "nothing was written" in one_error_line(output), output
    assert not (tmp_path / "m.pt2").exists() and not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("value,shown", [("abc", "'abc'"), ("0", "0"), ("1.5", "1.5"),
                                         ("true", "True")])
def test_train_data_settings_are_typed_before_use(value: str, shown: str) -> None:
    code, output = run("train", "--model", "rnn", "--set", f"data.max_length={value}",
                       "--dry-run", "--steps", "1")
    line = one_error_line(output)
    assert code == 2 and line == (f"error: --set data.max_length: expected an int >= 1, got "
                                  f"{shown}"), output
    code, output = run("train", "--set", "data.split=5", "--dry-run", "--steps", "1")
    assert code == 2 and "--set data.split: expected a name, got 5" in one_error_line(output)


@pytest.mark.parametrize("args,message", [
    (["--hypergradient", "finite-difference", "--order", "first"],
     "error: SearchConfig: bilevel.hypergradient (--hypergradient) 'finite-difference' "
     "approximates the second-order architecture gradient and has no role in order 'first'"),
    (["--partial-channels", "3"], "error: SearchConfig: partial_channels (--partial-channels) 3 "
                                  "must divide C 8"),
    (["--image-size", "10"], "error: class_halves: image_size (--image-size) must be a "
                             "multiple of 4 (two reduction cells), got 10"),
])
def test_search_options_that_cannot_act_are_refused(args: list[str], message: str) -> None:
    code, output = run("search", *args, "--dry-run", "--steps", "1")
    assert code == 2 and one_error_line(output).startswith(message), output


def test_the_search_checks_live_in_its_config_for_library_users() -> None:
    from funcgraph.errors import ConfigError
    from funcgraph.nas import BilevelConfig, SearchConfig
    from funcgraph.runs import class_halves

    with pytest.raises(ConfigError, match="has no role in order 'first'"):
        SearchConfig(bilevel=BilevelConfig(order="first", hypergradient="finite-difference"))
    SearchConfig(bilevel=BilevelConfig(order="second", hypergradient="finite-difference"))
    with pytest.raises(ConfigError, match="partial_channels .* 4 must divide C 12"):
        SearchConfig(C=12, partial_channels=4)  # 12 / 4 = 3: odd
    with pytest.raises(ConfigError, match="image_size .* must be a multiple of 4"):
        class_halves(image_size=18)
    with pytest.raises(ConfigError, match=r"skip_cap \(--skip-cap\) 2 bounds skip_connect "
                                          r"ops, which the search space \['max_pool_3x3'\]"):
        SearchConfig(skip_cap=2, primitives=("max_pool_3x3",))


def test_evaluate_refuses_inner_steps_on_a_protonet_run(tmp_path: Path) -> None:
    out = tmp_path / "pn"
    code, output = run("meta-train", "--tasks", "5way1shot", "--steps", "1", "--meta-batch",
                       "1", "--episodes", "1", "--val-episodes", "1", "--validate-every", "0",
                       "--device", "cpu", "--out", str(out))
    assert code == 0, output
    code, output = run("evaluate", str(out), "--inner-steps-eval", "5", "--episodes", "1",
                       "--device", "cpu")
    assert code == 2 and one_error_line(output) == (
        "error: --inner-steps-eval: a protonet run adapts by class prototypes, with no inner "
        "steps to set"), output
