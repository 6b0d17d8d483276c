"""A compiled ``meta-train`` run says that it compiles and how long it took (as lines, not only
on a terminal's progress bar), records whether its meta-step ran compiled in ``config.json``
and ``metrics.jsonl``, and compiles into the documented cache folder even when
``--strategy measure``'s probe compiles first; a resume is not refused for that record."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import funcgraph.meta.strategy as strategy_module
from funcgraph.runs.meta_training.loop import default_config, meta_train


def test_a_compiled_run_says_and_records_that_it_compiled(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    documented = tmp_path / "cache" / "funcgraph" / "torch-compile"
    at_compile: list[str | None] = []
    compiled_mean_grads = strategy_module.compiled_mean_grads

    def spy(*args: Any, **kwargs: Any) -> Any:
        at_compile.append(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
        return compiled_mean_grads(*args, **kwargs)

    monkeypatch.setattr(strategy_module, "compiled_mean_grads", spy)
    cfg = default_config("maml", "sinusoid", steps=2, meta_batch=2, validate_every=0,
                         test_episodes=2, val_episodes=2, checkpoint_every=1,
                         strategy="measure")
    cfg = replace(cfg, compile="aot_eager",  # type: ignore[arg-type]  # a backend's name
                  model={"name": "mlp", "in_features": 1, "out_features": 1, "hidden": [4]})
    lines: list[str] = []
    meta_train(cfg, tmp_path / "run", show_progress=False, echo=lines.append)

    assert at_compile and set(at_compile) == {str(documented)}, (
        f"compiled with the cache folder {set(at_compile)}, not {documented}")
    said = "\n".join(lines)
    first = next(i for i, line in enumerate(lines) if line.startswith("compile:"))
    measuring = next(i for i, line in enumerate(lines) if line.startswith("measuring"))
    assert first < measuring and str(documented) in lines[first], said
    assert "compiling the meta-step" in said and "compiled the meta-step in" in said, said
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["compiled"] is True, config
    records = [json.loads(line) for line in
               (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    compiles = [r for r in records if r["kind"] == "compile"]
    assert compiles and all(r["compiled"] and r["seconds"] > 0 for r in compiles), compiles

    # a resume (here without compiling, which may change) is not refused for the record
    lines.clear()
    meta_train(replace(cfg, steps=3, compile=False), tmp_path / "run", resume=True,
               show_progress=False, echo=lines.append)
    assert not any(line.startswith("compile:") for line in lines), lines
