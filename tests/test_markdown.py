"""summary.md shows only what results.json holds: every number in every table cell (and in the
crossover and speed-of-light lines) is found in the stored entry that line formats.

The fixture is the results.json of a real small run (`--engine vllm --spec --mode both
--num-prompts 4 --max-new-tokens 32 --repeats 3 --warmup 1 --concurrency 4`); the analysis is
derived again from its raw runs, so the test follows changes to the analysis."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.derived import analyze
from harness.cli.main import main
from harness.core.results import SCHEMA_VERSION, Run
from harness.report.columns import ci_text, method_tag
from harness.report.markdown import render

FIXTURE = Path(__file__).resolve().parent / "data" / "results-vllm-small.json"
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")
SCALES = (1.0, 1e3, 100.0)  # as stored, seconds -> ms, share -> %


def numbers(obj: Any) -> Iterator[float]:
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        yield float(obj)
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from numbers(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from numbers(v)


def missing(text: str, stored: Sequence[Any], scales: Sequence[float] = SCALES) -> list[str]:
    """The numbers in ``text`` that no stored value formats to (same digits, some scale)."""
    values = [v for obj in stored for v in numbers(obj)]
    out = []
    for token in NUMBER.findall(text):
        digits = len(token.split(".")[1]) if "." in token else 0
        if not any(f"{v * s:.{digits}f}" == token for v in values for s in scales):
            out.append(token)
    return out


def tables(md: str) -> list[tuple[str, list[list[str]]]]:
    """(heading, body rows) of every markdown table."""
    out: list[tuple[str, list[list[str]]]] = []
    heading, rows, in_table = "", [], False
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not in_table:
                in_table, rows = True, []
            elif not set(line) <= set("|-: "):
                rows.append(cells)
            continue
        if in_table:
            out.append((heading, rows))
            in_table = False
        if line.startswith("## "):
            heading = line[3:]
    return out


def check_summary(md: str, res: Mapping[str, Any]) -> int:
    """Walk every table line and the crossover and speed-of-light lines; return how many
    numbers were checked."""
    comps, checks = res["comparisons"], res["lossless"]
    at = lambda items, i: [] if i is None else [items[i]]  # noqa: E731
    points = list(dict.fromkeys(r["point"] for r in res["rows"]))
    found = 0
    main = iter(points)
    point_heading = None
    for heading, rows in tables(md):
        if heading.startswith("Theory"):
            stored = [[t, *at(comps, t["comparison"])] for t in res["theory"]]
        elif heading.startswith("Paired comparisons"):
            stored = [[c] for c in comps]
        elif heading.startswith("Per category"):
            stored = [
                [
                    *t["cells"].values(),
                    *(c["acceptance"] for c in t["cells"].values()),
                ]
                for row in rows
                for t in res["categories"]
                if t["candidate"] == row[0]
                and t["mode"] in heading
                and f"max_new_tokens={t['max_new_tokens']}" in heading
            ]
        else:
            if heading != point_heading:  # a point's main table; its percentile table follows
                point, point_heading = next(main), heading
            entries = [r for r in res["rows"] if r["point"] == point]
            assert [r["name"] for r in entries] == [row[0] for row in rows], heading
            stored = [[r, *at(comps, r["comparison"]), *at(checks, r["lossless"])] for r in entries]
        assert len(stored) == len(rows), heading
        for row, objs in zip(rows, stored):
            for cell in row:
                assert not missing(cell, objs), (heading, cell, missing(cell, objs))
                found += len(NUMBER.findall(cell))
    assert next(main, None) is None, "a point without its table"
    bullets = [
        ln[2:]
        for ln in md.split("## Crossover")[-1].split("##")[0].splitlines()
        if ln.startswith("- ")
    ]
    if res["crossover"]:
        assert len(bullets) == len(res["crossover"])
        for line, x in zip(bullets, res["crossover"]):
            assert not missing(line, [x, comps[x["comparison"]]]), line
            found += len(NUMBER.findall(line))
    for line in md.splitlines():
        if line.startswith("Speed of light"):
            assert not missing(line, [res["speed_of_light"]], (1.0, 100.0, 1e-6, 1e-9)), line
    return found


@pytest.fixture(scope="module")
def derived() -> dict[str, Any]:
    res = json.loads(FIXTURE.read_text())
    runs = [Run.from_json(r) for r in res["runs"]]
    cfg = res["config"]
    res |= analyze(
        runs,
        min_effect=cfg["min_effect"],
        seed=cfg["seed"],
        temperature=0.0,
        bound=res["speed_of_light"],
    )
    return res


def test_every_number_in_the_summary_is_in_results_json(derived):
    md = render(json.loads(json.dumps(derived)))  # rendered from what results.json would hold
    assert md.count("\n## ") >= 4 and "## Theory" in md and "## Crossover" in md
    assert check_summary(md, derived) > 150


def test_every_printed_ci_shows_n_and_method(derived):
    md = render(derived)
    cis = re.findall(r"\d+\.\d\dx[^|]*", md)
    tags = {method_tag(c["method"]) for c in derived["comparisons"]}
    assert cis and all(re.search(rf" n=\d+ ({'|'.join(tags)})\b", x) for x in cis), cis
    assert all(
        f"{method_tag(m)} = {m}" in md for m in {c["method"] for c in derived["comparisons"]}
    )
    two = [Run.from_json(r) for r in derived["runs"] if r["repeat"] < 2]  # too few for a CI
    md2 = render(analyze(two, min_effect=0.02, temperature=0.0))
    few = re.findall(r"\d+\.\d\dx[^|]*", md2)
    assert few and all("CI n/a (n too small) n=2 t" in x for x in few), few
    no_ci = {"estimate": 1.23, "lo": None, "hi": None, "n": 5, "method": "t on log ratios"}
    seq = {**no_ci, "verdict": "n/a (sequential design)"}
    assert ci_text(seq) == "1.23x, CI n/a (sequential design) n=5 t"


def test_report_reads_the_stored_file_and_refuses_unknown_schemas(tmp_path, derived, capsys):
    stored = tmp_path / "results.json"
    stored.write_text(json.dumps({**derived, "schema_version": SCHEMA_VERSION}))
    assert main(["report", str(stored)]) == 0
    assert capsys.readouterr().out.strip() == render(derived).strip()
    old = json.loads(FIXTURE.read_text())
    old = {k: v for k, v in old.items() if k in ("created", "environment", "config", "workload")}
    latency = [r for r in json.loads(FIXTURE.read_text())["runs"] if r["mode"] == "latency"]
    (tmp_path / "v1.json").write_text(json.dumps({**old, "runs": latency, "schema_version": 1}))
    assert main(["report", str(tmp_path / "v1.json")]) == 0  # derived on reading
    out = capsys.readouterr().out
    assert "schema 1 file" in out and "## Theory" in out and "4/4" in out
    (tmp_path / "v9.json").write_text(json.dumps({**old, "runs": [], "schema_version": 9}))
    assert main(["report", str(tmp_path / "v9.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "schema 9" in err


def test_compare_joins_the_files_runs_and_analyses_them_once(tmp_path, capsys):
    for tag in ("a", "b"):
        (tmp_path / tag).mkdir()
        (tmp_path / tag / "results.json").write_text(FIXTURE.read_text())
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b" / "results.json")]) == 0
    out = capsys.readouterr().out
    assert "| vllm@b/ngram vs vllm@a/ngram " in out  # engine vs engine across the files
    assert "| vllm@a/ngram vs vllm@a/baseline " in out and "n=3 t" in out


def test_open_loop_tables_and_crossover_are_judged_by_e2e():
    from tests.test_stats import _batch_run

    runs = []
    for rate, speedup in ((2.0, 2.0), (8.0, 1.0)):  # halves E2E at 2 req/s, nothing at 8
        for r in range(3):
            noise = 1 + 0.01 * r
            runs.append(_batch_run("baseline", r, 0.05, 1.0 * noise, rate=rate))
            runs.append(_batch_run("ngram", r, 0.05, noise / speedup, rate=rate))
    res = analyze(runs, min_effect=0.02, temperature=0.0)
    md = render(res)
    assert md.count("speedup E2E [95% CI]") == 2 and "speedup tok/s" not in md
    (line,) = [ln for ln in md.splitlines() if ln.startswith("- fake/ngram")]
    assert "pays up to request rate 2; from 8 it is E2E 1.00x [" in line, line
    assert check_summary(md, res) > 20
