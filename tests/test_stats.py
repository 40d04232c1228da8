"""Statistics: planted speedups are found with the right CI and verdict."""

import numpy as np
import pytest

from harness.analysis.comparisons.paired import compare_groups, comparisons, precise_enough
from harness.analysis.comparisons.stats import compare_log_ratios, median, t975, verdict
from harness.analysis.pooled import pooled
from harness.analysis.summary import distribution, summarize
from harness.core.records import RequestRecord
from harness.core.results import Cell, Run


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


def _run(records, label, repeat=0, mode="latency", load=None):
    cell = Cell("fake", label, mode, load or {"concurrency": 1}, 64, repeat, "w")
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
    assert tok.lo <= tok.estimate <= tok.hi and tok.n == 3
    assert tok.lo <= planted <= tok.hi
    assert tok.verdict == expect
    assert ratios["tpot"].verdict == expect
    assert ratios["tpot"].lo <= planted <= ratios["tpot"].hi


def test_comparisons_pair_spec_with_baseline():
    rng = np.random.default_rng(1)
    runs = [_run(_records(rng, 1.0), "baseline"), _run(_records(rng, 1.3), "ngram")]
    comps = comparisons(runs)
    tok = next(c for c in comps if c["metric"] == "output_tok_s")
    assert tok["baseline"] == "fake/baseline" and tok["candidate"] == "fake/ngram"
    assert tok["decides"]
    assert {"metric", "estimate", "lo", "hi", "n", "method", "verdict"} <= set(tok)
    # one repeat: the estimate is shown, no CI and no verdict
    assert tok["estimate"] == pytest.approx(1.3, rel=0.05) and tok["n"] == 1
    assert tok["lo"] is None and tok["verdict"] == "n/a (n too small)"


def test_verdict_rules():
    assert verdict(1.5, 1.2, 1.8, 0.02) == "faster"
    assert verdict(1.01, 1.005, 1.015, 0.02) == "within +-2%"  # significant, below min effect
    assert verdict(0.99, 0.985, 0.995, 0.05) == "within +-5%"
    assert verdict(1.1, 0.9, 1.3, 0.02) == "no significant difference"  # CI crosses 1
    assert verdict(0.5, 0.4, 0.6, 0.02) == "slower"
    assert verdict(1.5, None, None, 0.02) == "n/a (n too small)"
    assert verdict(None, None, None, 0.02) == "n/a"


def test_below_three_repeats_there_is_no_ci():
    c = compare_log_ratios("output_tok_s", [np.log(2.0), np.log(2.2)], 0.02)
    assert c.estimate == pytest.approx(np.sqrt(2.0 * 2.2)) and c.n == 2
    assert c.lo is None and c.hi is None and c.verdict == "n/a (n too small)"
    c = compare_log_ratios("output_tok_s", np.log([2.0, 2.2, 2.1]), 0.02)
    assert c.lo < c.estimate < c.hi and c.verdict == "faster"


def test_estimate_is_the_statistic_the_ci_is_made_of():
    """The estimate is the geometric mean of the per-prompt ratios the CI is built from (it was
    a ratio of medians while the CI resampled pairs)."""
    rng = np.random.default_rng(3)
    base_tpot = np.array([0.010, 0.011, 0.012, 0.013, 0.030, 0.031, 0.032])
    cand_tpot = base_tpot * np.array([1.1, 1.1, 1.1, 1.1, 1.1, 1.1, 0.3])

    def runs(tpot, label):
        out = []
        for rep in range(3):
            recs = []
            for i, t in enumerate(tpot * rng.normal(1.0, 0.005)):
                times = tuple(0.01 + t * np.arange(17))
                recs.append(RequestRecord(f"p{i}", 0.0, times[-1], times, (1,) * 17))
            out.append(_run(recs, label, rep))
        return out

    c = compare_groups(runs(base_tpot, "baseline"), runs(cand_tpot, "ngram"), min_effect=0.02)
    expect = np.exp(np.mean(np.log(base_tpot / cand_tpot)))
    assert c["tpot"].estimate == pytest.approx(expect, rel=0.01)
    assert c["tpot"].lo <= c["tpot"].estimate <= c["tpot"].hi


def _batch_run(label, repeat, ttft, e2e, tokens=32, rate=None):
    """A throughput-mode run: 16 requests whose first tokens come in one step (same TTFT)."""
    recs = []
    for i in range(16):
        t0 = i / rate if rate else 0.0
        times = tuple(t0 + ttft + (e2e - ttft) * np.arange(tokens) / (tokens - 1))
        recs.append(RequestRecord(f"p{i}", t0, times[-1], times, (1,) * tokens))
    load = {"request_rate": rate, "arrivals": "constant"} if rate else {"concurrency": 16}
    return _run(recs, label, repeat, "throughput", load)


def test_throughput_ttft_ci_has_the_run_noise_not_zero_width():
    """Every request of a run had the same TTFT; over prompts the CI was "0.77x [0.77, 0.77]".
    Over repeats it carries the run-to-run spread."""
    base = [_batch_run("baseline", r, t, 1.0) for r, t in enumerate([0.127, 0.089, 0.079])]
    cand = [_batch_run("ngram", r, t, 1.0) for r, t in enumerate([0.101, 0.091, 0.172])]
    c = compare_groups(base, cand, min_effect=0.02)["ttft"]
    assert c.hi / c.lo > 1.5 and c.verdict == "no significant difference"


def test_open_loop_verdict_is_decided_by_e2e_not_tok_s():
    """At a request rate tokens/s follows the arrivals: a candidate that halves every request's
    latency must be "faster" on E2E, the metric that decides there."""
    base = [_batch_run("baseline", r, 0.05, 2.0 * (1 + 0.02 * r), rate=4.0) for r in range(3)]
    cand = [_batch_run("ngram", r, 0.05, 1.0 * (1 + 0.01 * r), rate=4.0) for r in range(3)]
    comps = comparisons(base + cand)
    decide = [c for c in comps if c["decides"]]
    assert [c["metric"] for c in decide] == ["e2e"] and decide[0]["verdict"] == "faster"
    tok = next(c for c in comps if c["metric"] == "output_tok_s")
    assert not tok["decides"] and tok["estimate"] < 1.3  # tok/s barely moves


def test_target_ci_stops_on_the_comparisons_ci():
    rng = np.random.default_rng(5)
    runs = []
    for r in range(3):
        runs.append(_run(_records(rng, 1.0), "baseline", r))
        runs.append(_run(_records(rng, 1.3), "ngram", r))
    assert not precise_enough(runs[:4], 0.5)  # two repeats: no valid CI yet
    assert precise_enough(runs, 0.5)
    assert not precise_enough(runs, 0.001)


def test_median_of_an_even_count_is_the_true_median():
    assert median([1.0, 2.0, 3.0, 10.0]) == 2.5 and median([]) is None
    rng = np.random.default_rng(2)
    runs = [_run(_records(rng, s), "baseline", r) for r, s in enumerate([1.0, 1.0, 2.0, 2.0])]
    per_run = [summarize(r.records) for r in runs]
    per_rep = [s["output_tok_s"] for s in per_run]
    assert pooled(runs, per_run)["summary"]["output_tok_s"] == pytest.approx(np.median(per_rep))


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


def test_t_quantiles_are_student_t():
    """scipy.stats' quantiles, checked against printed tables (4 significant digits)."""
    assert t975(2) == pytest.approx(4.303, abs=5e-4) and t975(7) == pytest.approx(2.365, abs=5e-4)
    for df, exact in [(31, 2.0395), (60, 2.0003), (120, 1.9799)]:
        assert t975(df) == pytest.approx(exact, abs=1e-4)


def test_sequential_design_claims_no_paired_verdict():
    """Each variant's repeats back to back: drift between the blocks is confounded with the
    variant, so the estimate is shown without a CI or verdict (interleaved: a verdict)."""
    from dataclasses import replace

    from harness.core.design import INTERLEAVED, SEQUENTIAL, Slot

    rng = np.random.default_rng(4)
    runs = [
        _run(_records(rng, s), lb, r)
        for r in range(3)
        for lb, s in [("baseline", 1), ("ngram", 1.5)]
    ]
    for design, verdict_ in [(INTERLEAVED, "faster"), (SEQUENTIAL, "n/a (sequential design)")]:
        slotted = [
            replace(run, schedule=Slot(design, 0, run.cell.repeat, 0, i))
            for i, run in enumerate(runs)
        ]
        tok = next(c for c in comparisons(slotted) if c["metric"] == "output_tok_s")
        assert tok["design"] == design and tok["verdict"] == verdict_
        assert tok["estimate"] == pytest.approx(1.5, rel=0.1)
        assert (tok["lo"] is None) == (design == SEQUENTIAL)


def test_target_ci_in_a_sequential_design_falls_back_to_each_lanes_own_ci():
    from dataclasses import replace

    from harness.core.design import SEQUENTIAL, Slot

    rng = np.random.default_rng(6)
    runs = [
        _run(_records(rng, s), lb, r)
        for lb, s in [("baseline", 1), ("ngram", 1.3)]
        for r in range(3)
    ]
    runs = [
        replace(run, schedule=Slot(SEQUENTIAL, 0, run.cell.repeat, 0, i))
        for i, run in enumerate(runs)
    ]
    assert precise_enough(runs, 0.5)  # no paired CI exists; the lanes' own are narrow
    assert not precise_enough(runs, 0.0001)
