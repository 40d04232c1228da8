"""report.html opened as a user opens it: from file://, in headless Chromium (Debian's package,
installed by bin/browser), with the network off (a fresh network namespace where the kernel
allows one; always unresolvable host names and a dead proxy). The page must show the stored
answer, a row for every variant, sort and toggle, log no console error and fetch nothing but
itself and its inline data; the screenshot is kept for a person to look at."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from harness.report.answer_text import answer_sections
from harness.report.views import write_views
from tests.browser import Browser, find
from tests.test_markdown import FIXTURE, two_engines

EXE = find()
pytestmark = pytest.mark.skipif(
    EXE is None,
    reason="no Chromium on PATH: bin/browser installs Debian's chromium where apt is allowed",
)


@pytest.fixture(scope="module")
def results() -> dict:
    from harness.analysis.derived import analyze
    from harness.core.results import Run

    res = json.loads(FIXTURE.read_text())
    runs = [Run.from_json(r) for r in res["runs"]]
    res |= analyze(runs, min_effect=0.02, temperature=0.0, bound=res["speed_of_light"])
    return json.loads(json.dumps(two_engines(res)))  # as results.json holds it


def test_report_html_in_a_browser_offline(results, tmp_path):
    write_views(results, tmp_path)
    page = tmp_path / "report.html"
    text = page.read_text()
    assert "http://" not in text.replace("http://www.w3.org/", "")  # SVG namespaces only
    assert (
        "https://" not in text and "<script src" not in text and '<link rel="stylesheet' not in text
    )
    b = Browser(EXE)
    try:
        b.open(page)
        answer = b.eval("document.querySelector('#answer').innerText")
        for head, items in answer_sections(results):
            assert head in answer
            assert all(x in answer for x in items), (items, answer)
        assert "Is vLLM faster than HF?" in answer
        names = results["answer"]["variants"]
        assert len(names) == 6
        shown = b.eval(
            "Array.from(document.querySelectorAll('tr[data-variant]'), t => t.dataset.variant)"
        )
        assert set(names) <= set(shown), (names, shown)
        # sorting: the first table by its tok/s column, descending on the second click
        col = "Array.from(document.querySelector('table.sortable').tBodies[0].rows, r => " \
            "parseFloat(r.cells[2].textContent))"  # fmt: skip
        b.eval("document.querySelector('table.sortable th:nth-child(3)').click()")
        b.eval("document.querySelector('table.sortable th:nth-child(3)').click()")
        values = b.eval(col)
        assert values == sorted(values, reverse=True) and len(values) == 6
        # toggling a variant hides its rows and its plot lines, and shows them again
        first = "document.querySelector('#variants input[value=\"vllm/ngram\"]')"
        hidden = "document.querySelectorAll('tr[data-variant=\"vllm/ngram\"][hidden]').length"
        lines = b.eval(
            f"document.querySelectorAll('svg [id^=\"v' + {first}.dataset.index + '-\"]').length"
        )
        assert lines >= 3  # speedup, distributions, throughput/latency, acceptance
        b.eval(f"{first}.click()")
        assert b.eval(hidden) >= 2
        gone = f"Array.from(document.querySelectorAll('svg [id^=\"v' + {first}.dataset.index + '-\"]')).every(g => g.style.display === 'none')"  # noqa: E501
        assert b.eval(gone)
        b.eval(f"{first}.click()")
        assert b.eval(hidden) == 0
        assert b.eval("document.querySelectorAll('figure svg').length") >= 4
        shot = tmp_path / "report.png"
        b.screenshot(shot)
        assert shot.stat().st_size > 20_000
        keep = os.environ.get("HARNESS_SCREENSHOTS")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, Path(keep) / "report.png")
        assert b.errors() == []
        fetched = b.requests()
        assert fetched and all(u.startswith(("file:", "data:")) for u in fetched), fetched
        if b.namespaced:  # the network is really off: a fetch cannot leave the machine
            probe = b.send(
                "Runtime.evaluate",
                {
                    "expression": "fetch('http://example.com/').then(() => 'reached', () => 'blocked')",
                    "awaitPromise": True,
                    "returnByValue": True,
                },
            )
            assert probe["result"]["value"] == "blocked"
    finally:
        b.close()
