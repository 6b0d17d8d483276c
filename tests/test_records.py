"""Results as records: the writer, the run wrapper, the files in ``results/`` and the
docs' results pages, whose tables must be what the records give."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = ROOT / "results"
PAGES = sorted((ROOT / "docs" / "results").glob("*.md"))
KEYS = {"name", "command", "commit", "dirty", "torch", "python", "machine", "date", "seconds",
        "figures"}


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> dict[str, ModuleType]:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import record_run
    import records
    import results_glance
    import results_pages
    import results_plots
    import results_tables

    return {"records": records, "record_run": record_run, "results_pages": results_pages,
            "results_tables": results_tables, "results_plots": results_plots,
            "results_glance": results_glance}


def test_record_run_records_a_runs_test_line_metrics_and_printed_json(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"kind": "validation", "acc": 0.9}\n'
        '{"kind": "test", "acc": 0.974612, "acc_ci95": 0.00301, "episodes": 600}\n')
    line = "test (best checkpoint, 5way1shot): acc 97.46% +- 0.30% (95% CI, 600 tasks)"
    script = (f"print('run directory: {run}'); print({line!r}); "
              "print('{\"cells\": 3, \"cpu_s\": 1.5}')")
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "record_run.py"), "--name", "demo", "--results",
         str(tmp_path / "results"), "--", sys.executable, "-c", script],
        capture_output=True, text=True, timeout=120, env={"OMP_NUM_THREADS": "1",
                                                          "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert line in proc.stdout, "the command's output is passed through"
    [record] = [json.loads(x) for x in (tmp_path / "results/demo.jsonl").read_text().splitlines()]
    assert KEYS <= set(record), record.keys()
    assert record["command"].startswith("OMP_NUM_THREADS=1 ") and "-c" in record["command"]
    figures = record["figures"]
    assert figures[0] == {"cells": 3, "cpu_s": 1.5}
    assert figures[1]["test_line"] == line and figures[1]["acc"] == pytest.approx(0.9746)
    assert figures[1]["acc_ci95"] == pytest.approx(0.0030) and figures[1]["episodes"] == 600
    assert figures[2]["metrics_test"]["acc"] == 0.974612, "the unrounded test record"
    assert set(figures[3]) == {"wall_s", "cpu_s"} and figures[3]["wall_s"] > 0
    assert record["machine"]["cores"] >= 1 and record["machine"]["cpu"]


def test_a_failing_command_is_not_recorded(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "record_run.py"), "--name", "demo", "--results",
         str(tmp_path), "--", sys.executable, "-c", "raise SystemExit(3)"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and "nothing recorded" in proc.stderr
    assert not (tmp_path / "demo.jsonl").exists()


def test_a_benchmark_records_itself_with_the_record_flag(
        bench: dict[str, ModuleType], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[list[str]] = []

    def main(argv: list[str]) -> int:
        seen.append(argv)
        print("a table row")
        print(json.dumps({"ratio": 2.5}))
        return 7

    wrapped = bench["records"].recorded("toy", results=tmp_path)(main)
    assert wrapped(["--steps", "2"]) == 7 and not (tmp_path / "toy.jsonl").exists()
    assert wrapped(["--steps", "2", "--record"]) == 7
    assert seen == [["--steps", "2"], ["--steps", "2"]], "--record is not passed on"
    [record] = bench["records"].read("toy", tmp_path)
    assert record["figures"] == [{"ratio": 2.5}]
    assert record["command"].endswith("python benchmarks/toy.py --steps 2")
    assert "a table row" in capsys.readouterr().out


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.jsonl")), ids=lambda p: p.name)
def test_every_record_says_what_where_and_when(path: Path) -> None:
    for i, line in enumerate(path.read_text().splitlines()):
        record = json.loads(line)
        where = f"{path.name}:{i + 1}"
        assert KEYS <= set(record), f"{where}: missing {KEYS - set(record)}"
        assert record["name"] == path.stem, where
        assert re.fullmatch(r"[0-9a-f]{40}", record["commit"]), where
        assert record["machine"]["cpu"] and record["machine"]["cores"] >= 1, where
        datetime.fromisoformat(record["date"])
        assert record["figures"], f"{where}: a record without figures"


def test_every_benchmark_can_record_itself() -> None:
    scripts = [p for p in BENCHMARKS.glob("*.py")
               if p.stem not in ("records", "record_run") and not p.stem.startswith("results_")
               and not p.stem.endswith("_worker")]  # a worker process another benchmark starts
    missing = [p.name for p in scripts if f'recorded("{p.stem}")(main)' not in p.read_text()]
    assert not missing, f"benchmarks without --record: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_results_pages_are_generated_from_the_records(
        bench: dict[str, ModuleType], page: Path) -> None:
    text = page.read_text()
    assert bench["results_pages"].BLOCK.search(text), f"{page.name} has no record table"
    assert bench["results_pages"].render(text) == text, (
        f"{page.name} is stale: run `python benchmarks/results_pages.py`")


# A measured figure: a number with a unit of time, memory, share or ratio.
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:%|s\b|ms\b|min\b|x\b|[KMG]i?B\b)")


def figures_outside_tables(text: str, block: re.Pattern[str]) -> list[str]:
    text = block.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # commands, not figures
    text = re.sub(r"`[^`]*`", "", text)
    return FIGURE.findall(text)


def test_the_figure_finder_finds_figures_and_skips_commands(
        bench: dict[str, ModuleType]) -> None:
    block = bench["results_pages"].BLOCK
    text = ("It took 3 min, 4.2 s and 1.35 GB at 1.14x; 93.15% +- 0.46%.\n"
            "`--steps 500` and 5-way 1-shot on 2 cores\n"
            "<!-- records: x -->\n| 97.46% |\n<!-- end records -->\n")
    assert figures_outside_tables(text, block) == ["3 min", "4.2 s", "1.35 GB", "1.14x",
                                                   "93.15%", "0.46%"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_results_pages_quote_no_figure_outside_their_record_tables(
        bench: dict[str, ModuleType], page: Path) -> None:
    found = figures_outside_tables(page.read_text(), bench["results_pages"].BLOCK)
    assert not found, f"{page.name} quotes figures no record holds: {found}"


def test_a_records_commit_is_dirty_for_code_changes_not_for_other_records(
        bench: dict[str, ModuleType], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "x.jsonl").write_text("{}\n")
    (tmp_path / "code.py").write_text("A = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "start")
    monkeypatch.setattr(bench["records"], "ROOT", tmp_path)
    head, dirty = bench["records"].commit()
    assert len(head) == 40 and not dirty
    (tmp_path / "results" / "x.jsonl").write_text("{}\n{}\n")
    assert bench["records"].commit() == (head, False), "an appended record is not code"
    (tmp_path / "code.py").write_text("A = 2\n")
    assert bench["records"].commit() == (head, True)


def _run_record(command: str, acc: float, **extra: object) -> dict[str, object]:
    return {"command": command, "commit": "a" * 40, "dirty": False, "torch": "2.13.0",
            "machine": {"cpu": "cpu", "cores": 2}, "date": "2026-12-06T10:00:00+00:00",
            "figures": [{"test_line": "...", "acc": acc, "acc_ci95": 0.004, "metric": "acc",
                         "tasks": "5way1shot"},
                        {"metrics_test": {"step": 700}}, {"cpu_s": 321.4, "wall_s": 400.0}],
            **extra}


def test_a_run_table_has_named_columns_and_the_command_a_user_types(
        bench: dict[str, ModuleType]) -> None:
    tables = bench["results_tables"]
    record = _run_record("funcgraph meta-train --dataset rgb-shapes --image-size 28 --algo maml "
                         "--seed 2 --out /tmp/runs/maml", 0.7103)
    text = tables.block([record])
    header, _, row = text.splitlines()[:3]
    assert header.split(" | ")[:4] == ["| algorithm", "data set", "tasks", "accuracy (95% CI)"]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:7] == ["maml", "rgb-shapes 28px", "5way1shot", "71.03% ± 0.40", "700", "321",
                         "2"], cells
    assert cells[-1] == "`funcgraph meta-train --dataset rgb-shapes --image-size 28 --algo maml "\
                        "--seed 2`", "the scratch --out directory is left out"
    resumed = "funcgraph search --seed 2 --out runs/s2 --resume"
    assert tables.user_command(resumed) == resumed, "--resume needs the --out it continues"
    assert "<details>" in text and '"/tmp/runs/maml"' not in text.split("<details>")[0]
    assert json.loads(text.split("```json\n")[1].split("\n")[0]) == record, \
        "the full record is one click away"


def test_benchmark_figures_become_columns_and_constant_columns_one_line(
        bench: dict[str, ModuleType]) -> None:
    record = {**_run_record("python benchmarks/x.py", 0.0), "figures": [
        {"model": "mlp", "ratio": 1.5, "threads": 1}, {"model": "cnn", "ratio": 0.9,
                                                       "threads": 1}]}
    text = bench["results_tables"].block([record])
    assert text.startswith("Every row: threads 1, machine cpu, date 2026-12-06, commit "
                           "aaaaaaa.\n\n"
                           "| model | ratio |\n| --- | --- |\n| mlp | 1.5 |\n| cnn | 0.9 |\n")
    other = {**record, "machine": {"cores": 2, "cpu": "another cpu"}}
    text = bench["results_tables"].block([record, other])
    assert "| model | ratio | machine |\n" in text and "| mlp | 1.5 | another cpu |" in text, \
        "records from two machines: each row names its CPU"


def test_the_readme_glance_and_the_plots_are_what_the_records_give(
        bench: dict[str, ModuleType]) -> None:
    pages = bench["results_pages"]
    readme = (ROOT / "README.md").read_text()
    assert bench["results_glance"].GLANCE_BLOCK.search(readme), "the README has no glance table"
    assert bench["results_glance"].render_glance(readme, pages.read) == readme, \
        "README.md's glance table is stale: run `python benchmarks/results_pages.py`"
    stale = bench["results_plots"].stale_plots(pages.PLOTS, pages.read)
    assert not stale, f"stale plots: {[str(p) for p, _ in stale]}; run results_pages.py"


def test_a_plot_is_stale_when_its_records_change(bench: dict[str, ModuleType],
                                                 tmp_path: Path) -> None:
    plots = bench["results_plots"]
    records = {"readme": [_run_record("funcgraph meta-train --tasks 5way1shot", 0.97)]}
    read = lambda name: records.get(name, [])  # noqa: E731
    [(path, data)] = [(p, d) for p, d in plots.stale_plots(tmp_path, read)
                      if p.name == "accuracy_glyphs.png"]
    plots.draw(path, data)
    assert not [p for p, _ in plots.stale_plots(tmp_path, read) if p == path]
    records["readme"].append(_run_record("funcgraph meta-train --tasks 5way1shot --seed 1", 0.96))
    assert [p for p, _ in plots.stale_plots(tmp_path, read) if p == path], \
        "a new record redraws the plot"


def test_a_resumed_default_run_fills_its_settings_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--resume`` continues a run's own recorded options, so a resumed default run is a
    default run; any option that changes the recipe is not."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from results_settings import is_default

    base = "funcgraph meta-train --tasks 5way5shot --algo mamlpp --threads 1 --out runs/x"
    assert is_default(base, "mamlpp", "5way5shot")
    assert is_default(f"{base} --resume", "mamlpp", "5way5shot")
    assert not is_default(f"{base} --resume --inner-lr 0.5", "mamlpp", "5way5shot")
    assert not is_default(f"{base} --resume", "mamlpp", "20way5shot")
