"""Statistics: planted speedups are found with the right CI and verdict."""

import numpy as np
import pytest

from harness.analysis import compare_groups, comparisons
from harness.records import RequestRecord
from harness.results import Cell, Run
from harness.stats import distribution, paired_ratio, summarize, throughput_speedup, verdict


def _records(rng, speed: float, n_prompts=20, tokens=64):
    out = []
    for i in range(n_prompts):
        per_token = 0.02 * (1 + 0.5 * (i % 5)) / speed  # prompts differ; noise on top
        noise = rng.normal(1.0, 0.03, size=tokens) * rng.normal(1.0, 0.08)  # per token, per request
        gaps = per_token * noise
        t0 = i * 10.0
        times = tuple(t0 + np.cumsum(gaps))
        out.append(
            RequestRecord(f"p{i}", t0, times[-1], times, (1,) * tokens, tuple(range(tokens)))
        )
    return out


def _run(records, label, repeat=0, mode="latency"):
    cell = Cell("fake", label, mode, {"concurrency": 1}, 64, repeat, "w")
    return Run(cell, None if label == "baseline" else {"method": label}, tuple(records))


@pytest.mark.parametrize(
    "planted,expect", [(1.5, "faster"), (1.0, "no significant difference"), (0.7, "slower")]
)
def test_planted_speedup_is_recovered(planted, expect):
    rng = np.random.default_rng(0)
    base = [_run(_records(rng, 1.0), "baseline", r) for r in range(3)]
    cand = [_run(_records(rng, planted), "ngram", r) for r in range(3)]
    ratios = compare_groups(base, cand, min_effect=0.02)
    tok = ratios["output_tok_s"]
    assert tok.ci_low <= tok.ratio <= tok.ci_high
    assert tok.ci_low <= planted <= tok.ci_high
    assert tok.verdict == expect
    assert ratios["tpot"].verdict == expect


def test_comparisons_pair_spec_with_baseline_and_check_lossless():
    rng = np.random.default_rng(1)
    runs = [_run(_records(rng, 1.0), "baseline"), _run(_records(rng, 1.3), "ngram")]
    comps = comparisons(runs)
    tok = next(c for c in comps if c["metric"] == "output_tok_s")
    assert tok["baseline"] == "fake/baseline" and tok["candidate"] == "fake/ngram"
    assert tok["lossless"]["share_identical"] == 1.0


def test_verdict_rules():
    assert verdict(1.5, 1.2, 1.8, 0.02) == "faster"
    assert verdict(1.01, 1.005, 1.015, 0.02) == "no significant difference"  # effect too small
    assert verdict(1.1, 0.9, 1.3, 0.02) == "no significant difference"  # CI crosses 1
    assert verdict(0.5, 0.4, 0.6, 0.02) == "slower"
    assert verdict(None, None, None, 0.02) == "n/a"


def test_single_pair_has_no_ci():
    r = paired_ratio(np.array([[10.0, 1.0]]), np.array([[20.0, 1.0]]), throughput_speedup)
    assert r.ratio == pytest.approx(2.0) and r.ci_low is None and r.verdict == "n/a (no CI)"


def test_distribution_and_missing_values():
    d = distribution([1.0, 2.0, 3.0, None])
    assert d["n"] == 3 and d["median"] == 2.0
    assert distribution([])["median"] is None


def test_summary_counts_failures_apart_and_excludes_warmups():
    ok = RequestRecord("a", 0.0, 1.0, (0.2, 0.6, 1.0), (1, 1, 1), (1, 2, 3), prompt_tokens=4)
    warm = RequestRecord("w", 0.0, 9.0, (5.0,), (1,), (1,), warmup=True)
    bad = RequestRecord("b", 0.5, 1.5, (), (), None, ok=False, error="http 500: boom")
    s = summarize([warm, ok, bad])
    assert s["completed"] == 1 and s["failed"] == 1 and s["errors"] == {"http 500": 1}
    assert s["ttft_s"]["median"] == pytest.approx(0.2)
    assert s["duration_s"] == pytest.approx(1.5)
    assert s["output_tok_s"] == pytest.approx(3 / 1.5)
    assert s["peak_in_flight"] == 2
