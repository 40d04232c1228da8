"""The whole harness, end to end, on the real HF engine and the tiny pair (subprocesses)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.core.records_file import load_with_records

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


TINY = ("--model", "tiny", "--workload", "tiny")  # the test pair: seconds, not minutes


def harness(*args: str, **kw) -> subprocess.CompletedProcess:
    """``python -m harness ARGS`` on the tiny pair unless ARGS name a model or a subcommand."""
    if args and args[0] not in ("report", "compare") and "--model" not in args:
        args = (*TINY, *args)
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        **kw,
    )


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory, tiny_pair):
    out = tmp_path_factory.mktemp("hf")
    proc = harness(
        "--engine",
        "hf",
        "--spec",
        "--mode",
        "latency",
        "--num-prompts",
        "4",
        "--max-new-tokens",
        "32",
        "--repeats",
        "2",
        "--warmup",
        "1",
        "--output-dir",
        str(out),
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_results_json_has_the_schema(hf_run):
    out, proc = hf_run
    res = load_with_records(out / "results.json")
    assert res["schema_version"] == 4 and res["status"] == "complete"
    for key in ("python", "torch", "transformers", "vllm"):
        assert key in res["environment"]
    labels = {r["label"] for r in res["runs"]}
    assert labels == {"baseline", "draft_model", "ngram", "eagle3"}  # tiny ships a head
    for run in res["runs"]:
        if run["label"] == "eagle3":  # HF has no EAGLE: its cells say so, nothing runs
            assert run["status"] == "unsupported (hf has no eagle3)" and not run["records"]
            continue
        assert {
            "engine",
            "variant",
            "spec_config",
            "mode",
            "workload",
            "max_new_tokens",
            "load",
            "repeat",
            "records",
            "summary",
            "spec_metrics",
        } <= set(run)
        rec = run["records"][-1]
        assert {
            "id",
            "prompt_tokens",
            "output_tokens",
            "ttft_s",
            "e2e_s",
            "itl_s",
            "ok",
            "error",
        } <= set(rec)
        assert run["summary"]["completed"] == 4
        if run["variant"] == "spec":
            m = run["spec_metrics"]
            assert m["num_drafts"] > 0
            assert 0 < m["acceptance_rate"] < 1, m
            assert m["mean_acceptance_length"] == pytest.approx(
                1 + m["num_accepted_tokens"] / m["num_drafts"]
            )
        else:
            assert run["spec_metrics"] is None
    warm = [r for run in res["runs"] for r in run["records"] if r["warmup"]]
    assert warm, "warm-up requests are kept in the JSON"
    comps = [c for c in res["comparisons"] if c["metric"] == "output_tok_s"]
    assert {c["candidate"] for c in comps} == {"hf/draft_model", "hf/ngram"}
    for c in comps:
        # 2 repeats: an estimate, but too few for a t-interval (tests/test_stats.py has CIs)
        assert c["estimate"] > 0 and c["n"] == 2 and c["method"]
        assert c["lo"] is None and c["verdict"] == "n/a (n too small)"
        assert res["lossless"][c["lossless"]]["compared"] == 4


def test_summary_is_printed_and_report_rebuilds_it(hf_run):
    out, proc = hf_run
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# Answer: ") and "hf/draft_model" in summary and "accept" in summary
    assert summary.splitlines()[0].endswith(", latency, n = 2 repeats x 4 prompts")  # fixed n
    assert summary.split("## Plots")[0].strip() in proc.stdout
    assert ".png)" not in proc.stdout  # no image links on a terminal
    html = (out / "report.html").read_text()
    assert "hf/draft_model" in html and "<svg" in html
    pngs = ("speedup_vs_load.png", "distributions_0.png", "acceptance_by_position.png")
    for png in pngs:
        assert (out / png).stat().st_size > 1000 and f"({png})" in summary
        (out / png).unlink()
    (out / "report.html").unlink()
    again = harness("report", str(out / "results.json"))  # redraws everything from the JSON
    assert again.returncode == 0
    assert again.stdout.strip() == summary.split("## Plots")[0].strip()
    assert all((out / png).stat().st_size > 1000 for png in pngs)
    assert (out / "report.html").read_text().count("<svg") == html.count("<svg")


def test_every_number_of_the_real_summary_is_in_results_json(hf_run):
    from tests.test_markdown import check_summary

    out, _ = hf_run
    res = load_with_records(out / "results.json")
    assert check_summary((out / "summary.md").read_text(), res) > 50
    passes = [t["tokens_per_target_pass"] for t in res["theory"]]
    assert len(passes) == 2 and all(p > 1 for p in passes)  # HF counts its target passes
    assert {t["c_source"] for t in res["theory"]} == {"step times"}


def test_compare_two_files_and_refuse_different_prompts(hf_run, tmp_path):
    out, _ = hf_run
    res = load_with_records(out / "results.json")
    other = tmp_path / "b" / "results.json"
    other.parent.mkdir()
    other.write_text(json.dumps(res))
    ok = harness("compare", str(out / "results.json"), str(other))
    assert ok.returncode == 0 and "Paired comparisons" in ok.stdout
    res["workload"]["fingerprint"] = "different"
    other.write_text(json.dumps(res))
    bad = harness("compare", str(out / "results.json"), str(other))
    assert bad.returncode == 2 and "different prompt sets" in bad.stderr and "--force" in bad.stderr
    forced = harness("compare", str(out / "results.json"), str(other), "--force")
    assert forced.returncode == 0
    joined = out.parent / f"compare-{out.name}-b" / "report.html"  # beside the first dir
    assert "hf@b/ngram" in joined.read_text()


def test_the_real_report_html_in_a_browser(hf_run, tmp_path):
    """The real run's report.html, offline in headless Chromium (tests/test_report_html.py has
    the checks in full): the stored answer shown, a row per variant, no console error."""
    from tests.browser import Browser, find

    if find() is None:
        pytest.skip("no Chromium on PATH: bin/browser installs Debian's chromium")
    out, _ = hf_run
    res = load_with_records(out / "results.json")
    b = Browser(find())
    try:
        b.open(out / "report.html")
        answer = b.eval("document.querySelector('#answer').innerText")
        assert res["answer"]["speculation"] and all(
            e["candidate"] in answer for e in res["answer"]["speculation"]
        )
        shown = b.eval(
            "Array.from(document.querySelectorAll('tr[data-variant]'), t => t.dataset.variant)"
        )
        assert set(res["answer"]["variants"]) <= set(shown)
        b.screenshot(tmp_path / "report.png")
        assert b.errors() == []
        assert all(u.startswith(("file:", "data:")) for u in b.requests())
    finally:
        b.close()


def test_sigint_keeps_finished_records_and_resume_finishes(tmp_path, tiny_pair):
    out = tmp_path / "cut"
    args = [
        *TINY,
        "--engine",
        "hf",
        "--mode",
        "latency",
        "--num-prompts",
        "12",
        "--max-new-tokens",
        "48",
        "--repeats",
        "2",
        "--warmup",
        "0",
        "--output-dir",
        str(out),
        "--quiet",
    ]
    # processes the session already holds (the shared managed servers, when a test that uses
    # them ran first in this order) are not this run's: only new ones count below
    before = {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    journal = out / "journal.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline:
        if journal.exists() and journal.read_text().count('"kind": "record"') >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "partial results in" in err and "Traceback" not in err
    res = load_with_records(out / "results.json")
    assert res["status"].startswith("interrupted")
    kept = [r for run in res["runs"] for r in run["records"] if r["ok"]]
    assert len(kept) >= 3
    assert not [
        p for p in psutil.Process(os.getpid()).children(recursive=True) if p.pid not in before
    ]
    # resume: the interrupted cell is run again, nothing finished is redone
    done = harness(*args[:-3], "--resume", str(out), "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    res = load_with_records(out / "results.json")
    assert res["status"] == "complete"
    finished = [r for r in res["runs"] if r["status"] == "ok"]
    assert sorted(r["repeat"] for r in finished) == [0, 1]
    assert all(r["summary"]["completed"] == 12 for r in finished)
