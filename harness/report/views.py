"""Every view of a results dict written into one directory: summary.csv, summary.md, the plots
(PNG) and report.html. The run's end (``harness.cli.finalize``), `harness report` and
`harness compare` all call this, so each regenerates the same files from the JSON alone."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from harness.report.capacity_plot import draw_capacity
from harness.report.html import page
from harness.report.markdown import render
from harness.report.plots import draw
from harness.report.table_csv import to_csv


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def write_views(
    results: Mapping[str, Any],
    out: Path,
    *,
    plots: bool = True,
    csv: bool = True,
    write: Callable[[Path, str], None] = _write,
) -> str:
    """Write the views into ``out``; return summary.md without its image links (what stdout
    prints: a terminal shows no images)."""
    md = render(results)
    drawn = draw(results, out) if plots else None
    links = drawn.markdown if drawn else ""
    if results.get("capacity") and plots:  # --slo: the attainment plot
        links += draw_capacity(results, out)
    if csv:
        write(out / "summary.csv", to_csv(results))
    write(out / "summary.md", md + links)
    write(out / "report.html", page(results, drawn.svgs if drawn else ()))
    return md
