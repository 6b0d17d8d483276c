"""Generate the record tables of the docs' results pages from ``results/*.jsonl``.

A results page (``docs/results/*.md``) marks where a table of records goes::

    <!-- records: readme -->
    ...generated table...
    <!-- end records -->

and this script rewrites everything between the markers from ``results/readme.jsonl``
(tables with named columns, newest record first, then the records in full:
``benchmarks/results_tables.py``), redraws the plots under ``docs/results/plots/`` whose
records changed (``benchmarks/results_plots.py``) and the README's "at a glance" table
(``benchmarks/results_glance.py``). Run it after recording::

    python benchmarks/results_pages.py          # rewrite the pages, plots and README table
    python benchmarks/results_pages.py --check  # exit 1 if any of them is stale

``tests/test_records.py`` runs the check, so a page, plot or README figure cannot show what
its records do not give, and checks that a results page quotes no figure outside its
generated tables.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from results_glance import render_glance
from results_plots import draw, stale_plots
from results_settings import settings_table
from results_tables import block

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
PAGES = ROOT / "docs" / "results"
PLOTS = PAGES / "plots"
README = ROOT / "README.md"
BLOCK = re.compile(r"(<!-- records: ([\w.-]+) -->\n)(.*?)(<!-- end records -->)", re.S)


def read(name: str, results: Path = RESULTS) -> list[dict[str, Any]]:
    path = results / f"{name}.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def render(text: str, results: Path = RESULTS) -> str:
    """``text`` with every marked block regenerated from its records; the block of
    ``standard-settings`` starts with the four-settings table
    (``benchmarks/results_settings.py``)."""
    def regenerate(m: re.Match[str]) -> str:
        table = (settings_table(lambda name: read(name, results)) + "\n"
                 if m[2] == "standard-settings" else "")
        return m[1] + table + block(read(m[2], results)) + m[4]

    return BLOCK.sub(regenerate, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    args = parser.parse_args(argv)
    stale = []
    for page in [*sorted(PAGES.glob("*.md")), README]:
        text = page.read_text()
        new = render(text) if page != README else render_glance(text, read)
        if new != text:
            stale.append(page)
            if not args.check:
                page.write_text(new)
    for path, data in stale_plots(PLOTS, read):
        stale.append(path)
        if not args.check:
            draw(path, data)
    if args.check and stale:
        print("stale: " + ", ".join(str(p.relative_to(ROOT)) for p in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
