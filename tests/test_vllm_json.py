"""vLLM bench result files in and out: harness runs exported in vLLM's shape and read by vLLM's
own sweep-plot code; vLLM results (ms, percent) imported as runs (s, fraction) for compare."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.analysis.summary import summarize
from harness.cli.commands import compare, load_results
from harness.core.records import RequestRecord
from harness.core.results import Cell, Run
from harness.report.vllm_json import export_dir, from_run, to_run


def _run(label: str, n: int, scale: float, repeat: int = 0) -> dict:
    recs = []
    for i in range(n):
        t = i * 0.1
        times = tuple(t + scale * (0.05 + 0.01 * k) for k in range(4))
        recs.append(
            RequestRecord(
                str(i), t, times[-1] + 0.001, times, (1, 2, 1, 1), None, 7 + i, None, f"out{i}"
            )
        )
    spec = None if label == "baseline" else {"method": "ngram", "num_speculative_tokens": 4}
    metrics = (
        None
        if spec is None
        else {
            "num_drafts": 10,
            "num_draft_tokens": 40,
            "num_accepted_tokens": 12,
            "acceptance_rate": 0.3,
            "mean_acceptance_length": 2.2,
            "acceptance_per_pos": [0.6, 0.3, 0.2, 0.1],
        }
    )
    cell = Cell("vllm", label, "throughput", {"concurrency": 4}, 5, repeat, "random")
    run = Run(cell, spec, tuple(recs), 0.0, metrics)
    return run.to_json(summarize(run.records, {"e2e": 80.0}, (50, 90, 99, 99.9)))


def _results(runs: list[dict]) -> dict:
    return {
        "schema_version": 1,
        "created": "2026-11-30T10:00:00+00:00",
        "config": {"model": "m", "metric_percentiles": [50, 90, 99, 99.9], "burstiness": 1.0},
        "metadata": {"site": "lab"},
        "workload": {"name": "random", "fingerprint": "abc", "num_requests": 8},
        "runs": runs,
    }


def test_export_shape_units_and_round_trip(tmp_path: Path) -> None:
    res = _results([_run("baseline", 8, 1.0), _run("ngram", 8, 0.5)])
    d = from_run(res, res["runs"][1])
    s = res["runs"][1]["summary"]
    assert d["median_ttft_ms"] == pytest.approx(s["ttft_s"]["median"] * 1000)
    assert d["p99.9_e2el_ms"] == pytest.approx(s["e2e_s"]["p99.9"] * 1000)
    assert d["output_throughput"] == pytest.approx(s["output_tok_s"])
    assert d["spec_decode_acceptance_rate"] == pytest.approx(30.0)  # vLLM: percent
    assert (d["max_concurrency"], d["request_rate"], d["site"]) == (4, "inf", "lab")
    assert len(d["itls"]) == len(d["ttfts"]) == len(d["start_times"]) == 8
    back = to_run(d)
    assert back["spec_metrics"]["acceptance_rate"] == pytest.approx(0.3)  # fraction again
    assert back["summary"]["ttft_s"]["median"] == pytest.approx(s["ttft_s"]["median"])
    assert (back["mode"], back["load"], back["max_new_tokens"]) == (
        "throughput",
        {"concurrency": 4},
        5,
    )
    orig = Run.from_json(res["runs"][1]).records
    again = Run.from_json(back).records
    for a, b in zip(orig, again):
        assert (a.request_id, a.output_tokens, a.prompt_tokens) == (
            b.request_id,
            b.output_tokens,
            b.prompt_tokens,
        )
        assert (a.ttft, a.e2e, a.tpot) == pytest.approx((b.ttft, b.e2e, b.tpot))


def test_compare_takes_a_vllm_file_next_to_a_harness_file(tmp_path: Path, capsys) -> None:
    res = _results([_run("baseline", 8, 1.0, r) for r in range(3)])
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "results.json").write_text(json.dumps(res))
    vllm_file = tmp_path / "vllm-result.json"
    d = from_run(res, _run("baseline", 8, 0.5))  # "vLLM" twice as fast per token
    vllm_file.write_text(json.dumps(d))
    assert load_results(str(vllm_file))["runs"][0]["engine"] == "vllm-bench"
    assert compare([str(tmp_path / "h"), str(vllm_file)]) == 0
    out = capsys.readouterr().out
    assert "vllm-bench@" in out and "vllm@" in out
    ttft = [line for line in out.splitlines() if "vllm-bench" in line and "| ttft" in line]
    assert ttft and "2.00x" in ttft[0]  # paired by prompt index: half the TTFT


def test_bad_file_is_one_line(tmp_path: Path, capsys) -> None:
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"completed": 3}))
    from harness.cli.main import main

    assert main(["compare", str(p), str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a results file" in err[0]
    agg = {k: v for k, v in from_run(_results([]), _run("baseline", 4, 1.0)).items()}
    del agg["start_times"]  # written without --save-detailed
    p.write_text(json.dumps(agg))
    assert main(["compare", str(p), str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--save-detailed" in err[0]


def test_result_filename_lands_in_the_result_dir(tmp_path: Path, monkeypatch) -> None:
    """``--result-dir D --result-filename F`` writes D/F, as vllm bench serve joins them, not F
    in the working directory; an absolute F stays where it was asked."""
    res = _results([_run("baseline", 4, 1.0, r) for r in range(2)])
    monkeypatch.chdir(tmp_path)
    out = export_dir(res, tmp_path / "results", "runs.jsonl")
    assert out == tmp_path / "results" / "vllm"
    assert (out / "vllm-baseline-throughput-concurrency=4-5tok" / "run=1.json").is_file()
    lines = (tmp_path / "results" / "runs.jsonl").read_text().splitlines()
    assert [json.loads(x)["run_number"] for x in lines] == [0, 1]
    assert not (tmp_path / "runs.jsonl").exists()
    export_dir(res, tmp_path / "other", str(tmp_path / "abs.jsonl"))
    assert len((tmp_path / "abs.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow
def test_vllm_sweep_plot_reads_the_export(tmp_path: Path) -> None:
    """vLLM's own ``vllm bench sweep plot`` code loads the exported directory and draws it."""
    from vllm.benchmarks.sweep.plot import PlotBinners, PlotFilters, plot

    res = _results([_run(lb, 8, s, r) for lb, s in (("baseline", 1.0), ("ngram", 0.5))
                    for r in range(2)])  # fmt: skip
    out = export_dir(res, tmp_path, "all.jsonl")
    summaries = sorted(out.rglob("summary.json"))
    assert len(summaries) == 2 and len(json.loads(summaries[0].read_text())) == 2
    assert len((tmp_path / "all.jsonl").read_text().splitlines()) == 4
    plot(
        out, tmp_path / "figs", [], [], [], ["label"],
        var_x="max_concurrency", var_y="output_throughput",
        filter_by=PlotFilters.parse_str(""), bin_by=PlotBinners.parse_str(""),
        scale_x=None, scale_y=None, dry_run=False,
    )  # fmt: skip
    assert list((tmp_path / "figs").glob("*.png"))


def test_tables_show_asked_percentiles_and_a_short_peak_in_flight() -> None:
    from harness.analysis.derived import analyze
    from harness.report.markdown import render

    res = _results([_run("baseline", 8, 1.0, r) for r in range(2)])
    runs = [Run.from_json(r) for r in res["runs"]]
    res["config"]["percentile_metrics"] = ["ttft", "e2el"]
    md = render({**res, **analyze(runs, min_effect=0.02, percentiles=(50, 99.9))})
    # the records never overlap: 1 in flight although 4 were asked
    assert "vllm/baseline, concurrency 4: peak in flight 1 < 4 asked" in md
    assert "TTFT p99.9 ms" in md and "E2EL p50 ms" in md and "TPOT p99.9" not in md
    res["config"]["percentile_metrics"] = []
    assert "p99.9" not in render({**res, **analyze(runs, min_effect=0.02)})


def test_csv_export_of_the_per_point_table() -> None:
    import csv
    import io

    from harness.analysis.derived import analyze
    from harness.report.table_csv import to_csv

    res = _results([_run(lb, 8, s, r) for lb, s in (("baseline", 1.0), ("ngram", 0.5))
                    for r in range(3)])  # fmt: skip
    derived = analyze([Run.from_json(r) for r in res["runs"]], min_effect=0.02, percentiles=(99.9,))
    rows = list(csv.DictReader(io.StringIO(to_csv(derived))))
    assert [r["variant"] for r in rows] == ["baseline", "ngram"]
    ngram = rows[1]
    row = derived["rows"][1]
    assert float(ngram["output_tok_s"]) == row["summary"]["output_tok_s"]
    assert float(ngram["ttft_s_p99.9"]) == row["summary"]["ttft_s"]["p99.9"]
    assert float(ngram["acceptance_rate"]) == row["spec"]["acceptance_rate"]
    comp = derived["comparisons"][row["comparison"]]
    assert ngram["baseline"] == "vllm/baseline" and float(ngram["speedup"]) == comp["estimate"]


def test_vllms_client_queue_keeps_its_own_name() -> None:
    """vLLM's client_queue_time runs from when its client got round to the request (only with
    --max-concurrency), ours (client_queue_s) from the schedule: a vLLM file's value is read
    under its own name, never as ours, and written back under vLLM's name (a round trip)."""
    d = {"completed": 2, "duration": 1.0, "output_throughput": 4.0, "backend": "vllm",
         "request_rate": 2.0, "max_concurrency": 1, "p99_client_queue_time_ms": 300.0,
         "mean_client_queue_time_ms": 150.0, "p99_e2el_including_client_queue_ms": 500.0}  # fmt: skip
    s = to_run(d)["summary"]
    assert "client_queue_s" not in s and "e2e_from_schedule_s" not in s
    assert s["vllm_client_queue_s"] == {"p99": 0.3, "mean": 0.15}
    assert s["vllm_e2e_including_client_queue_s"] == {"p99": 0.5}
    run = {"engine": "vllm-bench", "label": "baseline", "summary": s, "load": {}, "records": []}
    back = from_run({"config": {"metric_percentiles": [99]}}, run)
    assert back["p99_client_queue_time_ms"] == pytest.approx(300.0)
    assert back["p99_e2el_including_client_queue_ms"] == pytest.approx(500.0)
