"""The DARTS evaluation protocol of benchmarks/darts.py: cache keys, the distribution's
figures, and a whole run with the training replaced by a stand-in (cached, plotted, printed)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from funcgraph import random
from funcgraph.nas import random_genotype

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "darts.py"


@pytest.fixture
def darts(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("_bench_darts", SCRIPT)
    assert spec is not None and spec.loader is not None, f"cannot load {SCRIPT}"
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "_bench_darts", module)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


def test_the_cache_key_holds_what_an_accuracy_depends_on(darts: ModuleType) -> None:
    g, other = random_genotype(random.key(0)), random_genotype(random.key(1))
    budget = darts.Budget(train_steps=10, classes=5)
    key = budget.cache_key(g, 0)
    assert key == darts.Budget(train_steps=10, classes=5, seeds=9).cache_key(g, 0), \
        "the number of seeds is no part of one training"
    changed = [budget.cache_key(other, 0), budget.cache_key(g, 1),
               darts.Budget(train_steps=11, classes=5).cache_key(g, 0),
               darts.Budget(train_steps=10, classes=6).cache_key(g, 0),
               darts.Budget(train_steps=10, classes=5, C=4).cache_key(g, 0),
               darts.Budget(dataset="rgb-shapes", train_steps=10, classes=5).cache_key(g, 0)]
    assert len({key, *changed}) == 7, \
        "genotype, seed, steps, classes, width and dataset change the key"
    assert json.loads(key)["data"]["split"] == "test", f"held-out data in the key: {key}"


def test_percentile_counts_ties_half(darts: ModuleType) -> None:
    population = [0.5, 0.6, 0.6, 0.7]
    got = [darts.percentile(v, population) for v in (0.4, 0.6, 0.8)]
    assert got == [0.0, 50.0, 100.0], got


def test_distribution_figures(darts: ModuleType) -> None:
    accs = {"s": [0.7, 0.7], "random0": [0.5, 0.7], "random1": [0.8, 0.8], "random2": [0.9, 0.9]}
    summary = darts.distribution(accs, ["s"])
    r = summary["random"]
    assert (r["n"], r["min"], r["max"]) == (3, 0.6, 0.9), r
    assert r["mean"] == pytest.approx(23 / 30) and r["std"] == pytest.approx(0.152753, abs=1e-6), r
    assert r["seed_sd"] == pytest.approx((0.02 / 3) ** 0.5), f"pooled seed sd: {r}"
    assert summary["searched"] == [{"arch": "s", "test_acc": 0.7,
                                    "percentile": pytest.approx(100 / 3)}], summary


def test_protocol_run_is_cached_plotted_and_printed(darts: ModuleType, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    trained: list[tuple[str, int]] = []

    def stand_in(job: tuple[dict[str, Any], Any, int]) -> float:
        genotype, _, seed = job
        text = json.dumps(genotype)
        trained.append((text, seed))
        return sum(map(ord, text)) % 50 / 100 + 0.01 * seed

    monkeypatch.setattr(darts, "_train_job", stand_in)
    run = tmp_path / "search-a"
    run.mkdir()
    random_genotype(random.key(7)).save(run / "genotype.json")
    budget = darts.Budget(train_steps=3, classes=4)
    args = {"n_random": 3, "cache": tmp_path / "cache.json", "plot": tmp_path / "p.png",
            "workers": 1}
    first = darts.protocol([run], budget, **args)
    assert len(trained) == 4 * 2, f"4 cells x 2 seeds trained, got {len(trained)}"
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG", "the plot is a PNG"
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [x["arch"] for x in lines[:-1]] == ["search-a", "random0", "random1", "random2"], lines
    assert lines[0]["kind"] == "searched" and "percentile" in lines[0], lines[0]
    assert lines[-1]["bench"] == "darts_protocol_summary" and lines[-1]["random"]["n"] == 3, \
        lines[-1]
    again = darts.protocol([run / "genotype.json"], budget, **args)
    assert len(trained) == 8 and again == first, "a rerun reads every accuracy from the cache"
    darts.protocol([run], darts.Budget(train_steps=4, classes=4), **args)
    assert len(trained) == 16, "another budget is trained anew"
