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
from harness.report.html import page
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


def answer_bullets(md: str) -> list[str]:
    """The answer block's lines: the bullets between "# Answer" and the first table heading."""
    block = md.split("# Answer", 1)[1].split("\n## ", 1)[0]
    return [ln[2:] for ln in block.splitlines() if ln.startswith("- ")]


def check_answer(md: str, res: Mapping[str, Any]) -> int:
    """summary.md opens with the answer block; each of its lines formats one stored entry of
    results.json ``answer`` (speculation, where it stops, engines, warnings, in that order)."""
    assert md.startswith("# Answer: "), md[:80]
    a = res["answer"]
    stored = [*a["speculation"], *a["stops"], *a["engines"], *a["warnings"]]
    bullets = answer_bullets(md)
    assert len(bullets) == len(stored), (bullets, stored)
    found = 0
    for line, entry in zip(bullets, stored):
        assert not missing(line, [entry]), (line, missing(line, [entry]))
        found += len(NUMBER.findall(line))
    return found


def check_summary(md: str, res: Mapping[str, Any]) -> int:
    """Walk the answer block, every table line and the speed-of-light lines; return how many
    numbers were checked."""
    comps, checks = res["comparisons"], res["lossless"]
    at = lambda items, i: [] if i is None else [items[i]]  # noqa: E731
    points = list(dict.fromkeys(r["point"] for r in res["rows"]))
    rank = {name: i for i, name in enumerate(res["answer"]["variants"])}
    found = check_answer(md, res)
    main = iter(points)
    point_heading = None
    for heading, rows in tables(md):
        if heading.startswith("Theory"):
            theory = sorted(res["theory"], key=lambda t: rank[t["name"]])
            assert [t["name"] for t in theory] == [row[0] for row in rows], heading
            stored = [[t, *at(comps, t["comparison"])] for t in theory]
        elif heading.startswith("Paired comparisons"):
            stored = [[c] for c in sorted(comps, key=lambda c: rank[c["candidate"]])]
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
            entries.sort(key=lambda r: rank[r["name"]])  # the stored order, baseline first
            assert [r["name"] for r in entries] == [row[0] for row in rows], heading
            stored = [[r, *at(comps, r["comparison"]), *at(checks, r["lossless"])] for r in entries]
        assert len(stored) == len(rows), heading
        for row, objs in zip(rows, stored):
            for cell in row:
                assert not missing(cell, objs), (heading, cell, missing(cell, objs))
                found += len(NUMBER.findall(cell))
    assert next(main, None) is None, "a point without its table"
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
    assert md.count("\n## ") >= 3 and "## Theory" in md and "**Where it stops paying**" in md
    assert derived["crossover"] and len(derived["answer"]["stops"]) == len(derived["crossover"])
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
    assert "schema 1 file" in out and "## Theory" in out
    html = (tmp_path / "report.html").read_text()  # the full column set, lossless check too
    assert "<td>4/4</td>" in html and (tmp_path / "speedup_vs_load.png").exists()
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
    (line,) = [ln for ln in md.splitlines() if ln.startswith("- fake/ngram (64 tok)")]
    # equal at 8 req/s, but the fixed-n interval includes 1: undecided there, not "does not pay"
    assert "pays up to request rate 2; from 8 undecided at 3 repeats (no significant " in line
    assert line.endswith("cannot say whether it pays (E2E 1.00x [1.00, 1.00] n=3 t)"), line
    assert check_summary(md, res) > 20


def two_engines(res: Mapping[str, Any]) -> dict[str, Any]:
    """The fixture's runs as two engines: "hf" (the same records) first, then "vllm" with every
    time scaled by 0.5 (+3% per repeat): vLLM about twice as fast, known."""
    from dataclasses import replace

    runs = [Run.from_json(r) for r in res["runs"]]
    out = []
    for run in runs:
        out.append(replace(run, cell=replace(run.cell, engine="hf")))
    for run in runs:
        f = 0.5 * (1 + 0.03 * run.cell.repeat)
        recs = tuple(
            replace(r, t_send=r.t_send * f, t_end=r.t_end * f,
                    chunk_times=tuple(t * f for t in r.chunk_times))
            for r in run.records
        )  # fmt: skip
        out.append(replace(run, cell=replace(run.cell, engine="vllm"), records=recs))
    return {**res, **analyze(out, min_effect=0.02, temperature=0.0, bound=res["speed_of_light"])}


def compact_lines(md: str) -> list[str]:
    """The lines of the per-point tables (the compact ones, before the design line)."""
    head = md.split("\nRun ", 1)[0]
    return [ln for ln in head.splitlines() if ln.startswith("|")]


def test_the_answer_comes_first_and_names_what_each_speedup_is_relative_to(derived):
    res = two_engines(derived)
    md = render(json.loads(json.dumps(res)))
    a = res["answer"]
    assert (
        a["variants"][:2] == ["hf/baseline", "hf/draft_model"] and "vllm/baseline" in a["variants"]
    )
    assert {e["candidate"] for e in a["engines"]} == {"vllm/baseline"}
    assert all(e["baseline"] == "hf/baseline" and e["answer"] == "pays" for e in a["engines"])
    assert all(1.8 < e["estimate"] < 2.1 for e in a["engines"])  # planted: 1 / (0.5 * 1.03^r)
    assert "**Is vLLM faster than HF?**" in md
    lines = [b for b in answer_bullets(md) if b.startswith("vllm/baseline,")]
    assert len(lines) == 2 and all(
        ": faster, tok/s 1.9" in b and "vs hf/baseline" in b for b in lines
    )
    rows = compact_lines(md)
    assert rows and max(map(len, rows)) <= 120, max(map(len, rows))
    vllm_base = [r for r in rows if r.startswith("| vllm/baseline ")]
    assert len(vllm_base) == 2 and all("vs hf/baseline" in r for r in vllm_base)
    assert all(" vs baseline" not in r for r in rows)  # every speedup names its whole baseline
    assert check_summary(md, res) > 150
    main_rows = [r for r in compact_lines(md) if r.startswith("| ") and "variant" not in r]
    assert main_rows[0].startswith("| hf/baseline ")  # the reference row first


def test_compact_table_stays_within_120_columns(derived):
    """Long speedups and names drop the optional columns (E2E, TTFT, acceptance) until the
    table fits; the speedup, its baseline and the verdict stay."""
    res = json.loads(json.dumps(derived))
    for c in res["comparisons"]:
        if c["estimate"] is not None:
            c.update(estimate=12.3456, lo=10.1234, hi=154.4321, n=100)
    for r in res["rows"]:
        r["summary"]["output_tok_s"] = 12345.678
    md = render(res)
    rows = compact_lines(md)
    assert max(map(len, rows)) <= 120
    assert all("speedup" in r and "verdict" in r for r in rows if r.startswith("| variant"))
    assert "12.35x [10.12, 154.43] n=100 t vs vllm/baseline" in md
    assert check_summary(md, res) > 100


def test_the_compact_note_explains_only_the_columns_shown(derived):
    """$/M tok and J/tok are shown only where a row stores them; the note under the tables
    explains each only when some table shows it."""

    def note(md: str) -> str:
        return next(ln for ln in md.splitlines() if ln.startswith("Medians over counted"))

    def header(md: str) -> str:  # every point's table's header
        return "\n".join(ln for ln in compact_lines(md) if ln.startswith("| variant"))

    res = json.loads(json.dumps(derived))
    md = render(res)
    assert "$/M tok" not in header(md) and "J/tok" not in header(md)
    assert "$/M tok" not in note(md) and "J/tok" not in note(md)
    res["rows"][0]["cost"] = {"usd_per_million_tokens": 1.25}
    md = render(res)
    assert "| $/M tok" in header(md) and "J/tok" not in header(md)
    assert "$/M tok = USD per million" in note(md) and "J/tok" not in note(md)
    res["rows"][-1]["energy"] = {"joules_per_token": 0.5}
    md = render(res)
    assert "| $/M tok" in header(md) and "| J/tok" in header(md)
    assert "$/M tok = USD per million" in note(md) and "J/tok = joules per" in note(md)
    del res["rows"][0]["cost"]  # energy on one point's table only: the note still names it
    md = render(res)
    assert "$/M tok" not in header(md) and "$/M tok" not in note(md)
    assert "J/tok = joules" in note(md) and len(header(md).splitlines()) > 1


def test_warnings_name_lossless_failures_and_unmet_concurrency(derived):
    from harness.analysis.answer import answer_of

    res = json.loads(json.dumps(derived))
    res["lossless"][0].update(identical=3, first_divergence_min=7)
    tp = next(r for r in res["rows"] if r["mode"] == "throughput")
    tp["summary"]["peak_in_flight"] = 2
    res["answer"] = answer_of(res)
    kinds = [w["kind"] for w in res["answer"]["warnings"]]
    assert "not identical" in kinds and "concurrency not reached" in kinds
    md = render(res)
    assert (
        "vllm/draft_model vs vllm/baseline, 1 at a time: 3/4 outputs identical (first diff "
        "at token 7): not lossless" in md
    )
    assert f"{tp['name']}, concurrency 4: peak in flight 2 < 4 asked" in md
    assert check_answer(md, res) > 10


def test_every_table_lists_the_baseline_first_in_one_order(derived):
    """Runs built candidates first (rows in that order): every table still opens with the
    baseline and lists the variants in the one stored order."""
    res = json.loads(json.dumps(derived))
    runs = sorted(res["runs"], key=lambda r: r["label"] == "baseline")  # baseline built last
    res |= analyze([Run.from_json(r) for r in runs], min_effect=0.02, temperature=0.0)
    assert [r["label"] for r in res["rows"]][0] != "baseline"
    assert res["answer"]["variants"][0] == "vllm/baseline" and len(res["answer"]["variants"]) == 3
    md = render(res)
    for heading, rows in tables(md):
        if not heading.startswith(("latency", "throughput")):
            continue
        assert [row[0] for row in rows] == res["answer"]["variants"], heading
    html = page(res)
    first = [html.index(f'<tr data-variant="{n}">') for n in res["answer"]["variants"]]
    assert first == sorted(first)
    assert check_summary(md, res) > 100
