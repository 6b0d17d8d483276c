"""Generate the record tables of the docs' results pages from ``results/*.jsonl``.

A results page (``docs/results/*.md``) marks where a table of records goes::

    <!-- records: readme -->
    ...generated table...
    <!-- end records -->

and this script rewrites everything between the markers from ``results/readme.jsonl``, newest
record first: date, commit, machine, torch, the command, and its figures. Run it after
recording::

    python benchmarks/results_pages.py          # rewrite the pages
    python benchmarks/results_pages.py --check  # exit 1 if a page is stale

``tests/test_records.py`` runs the check, so a page cannot show a table its records do not
give, and checks that a results page quotes no figure outside its generated tables.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
PAGES = ROOT / "docs" / "results"
BLOCK = re.compile(r"(<!-- records: ([\w.-]+) -->\n)(.*?)(<!-- end records -->)", re.S)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value)


def figure_text(figure: dict[str, Any]) -> str:
    """One figure as a table cell shows it: a test line as printed, else ``key: value``
    pairs with floats to four significant digits."""
    if "test_line" in figure:
        return figure["test_line"].split(": ", 1)[1]
    if "line" in figure and len(figure) == 1:
        return figure["line"]
    if "metrics_test" in figure:
        return ""  # the same figure as the test line, unrounded: kept in the record only
    return _short(figure).strip("{}")


def table(records: list[dict[str, Any]]) -> str:
    if not records:
        return "No record yet.\n"
    rows = ["| date | commit | machine | torch | command | figures |",
            "| --- | --- | --- | --- | --- | --- |"]
    for r in sorted(records, key=lambda r: r["date"], reverse=True):
        m = r["machine"]
        machine = f"{m['cpu']}, {m['cores']} cores" + (f", {m['gpu']}" if m.get("gpu") else "")
        commit = r["commit"][:10] + (" (modified)" if r.get("dirty") else "")
        figures = "<br>".join(t for t in map(figure_text, r["figures"]) if t)
        cells = [r["date"][:16].replace("T", " "), commit, machine, r["torch"],
                 f"`{r['command']}`", figures]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def read(name: str, results: Path = RESULTS) -> list[dict[str, Any]]:
    path = results / f"{name}.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def render(text: str, results: Path = RESULTS) -> str:
    """``text`` with every marked block regenerated from its records."""
    return BLOCK.sub(lambda m: m[1] + table(read(m[2], results)) + m[4], text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    args = parser.parse_args(argv)
    stale = []
    for page in sorted(PAGES.glob("*.md")):
        text = page.read_text()
        new = render(text)
        if new != text:
            stale.append(page)
            if not args.check:
                page.write_text(new)
    if args.check and stale:
        print("stale: " + ", ".join(str(p.relative_to(ROOT)) for p in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
