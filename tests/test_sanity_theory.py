"""Output sanity (degenerate outputs, lossless only when greedy), target passes and the theory,
on known inputs."""

from __future__ import annotations

import random

import pytest

from harness.analysis.pooled import spec_totals
from harness.analysis.sanity import blank_share, degenerate, loop_period, lossless
from harness.analysis.theory.speedup import best_gamma, expected_tokens, predicted_speedup, theory
from harness.core.records import RequestRecord
from harness.core.results import Cell, Run

CODE = '''def merge(a, b):
    """Merge two sorted lists."""
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out + a[i:] + b[j:]
'''


def rec(text: str | None = None, ids: list[int] | None = None, chunks=(), rid="p") -> RequestRecord:
    chunks = chunks or ((len(ids),) if ids else ())  # output has a first token (the record check)
    return RequestRecord(
        request_id=rid,
        t_send=0.0,
        t_end=1.0,
        chunk_times=tuple(0.1 * (i + 1) for i in range(len(chunks))),
        chunk_tokens=tuple(chunks),
        output_token_ids=None if ids is None else tuple(ids),
        output_text=text,
    )


def test_indented_code_is_not_whitespace_but_blank_lines_are():
    assert sum(ch.isspace() for ch in CODE) / len(CODE) > 0.3  # raw share: what indentation adds
    deep = "\n".join("            " + line for line in CODE.splitlines())  # nested 3 levels more
    assert sum(ch.isspace() for ch in deep) / len(deep) > 0.5  # the old check called this blank
    assert degenerate(rec(CODE)) is None and degenerate(rec(deep)) is None
    assert blank_share(deep) < 0.3
    assert degenerate(rec("\n\n    \n\t\t\n        \n\n")) == "whitespace"
    assert degenerate(rec("ok" + " " * 40)) == "whitespace"


def test_loops_up_to_period_32_in_a_trailing_window():
    rng = random.Random(0)
    prose = [rng.randrange(2048) for _ in range(200)]
    assert loop_period(prose) is None and degenerate(rec(ids=prose)) is None
    for period in (1, 3, 8, 20, 32):
        loop = [rng.randrange(2048) for _ in range(period)]
        ids = prose[:30] + loop * (96 // period + 1)
        assert loop_period(ids) == period, period
        assert degenerate(rec(ids=ids)) == "repetition"
    long_loop = [rng.randrange(2048) for _ in range(40)] * 3  # period 40: beyond the window's 32
    assert loop_period(long_loop) is None
    late = prose + ([7, 8, 9, 10, 11] * 14)  # a long output that gets stuck at the end
    assert loop_period(late) == 5


def _run(label: str, recs: list[RequestRecord], spec_metrics=None, repeat: int = 0) -> Run:
    cell = Cell("e", label, "latency", {"concurrency": 1}, 32, repeat, "w")
    spec = None if label == "baseline" else {"method": label, "num_speculative_tokens": 4}
    return Run(cell, spec, tuple(recs), spec_metrics=spec_metrics)


def test_lossless_only_when_greedy():
    base = [_run("baseline", [rec(ids=[1, 2, 3], rid="a"), rec(ids=[4, 5, 6], rid="b")])]
    cand = [_run("ngram", [rec(ids=[1, 2, 3], rid="a"), rec(ids=[4, 9, 6], rid="b")])]
    check = lossless(base, cand, temperature=0.0)
    assert (check["identical"], check["compared"], check["first_divergence_min"]) == (1, 2, 1)
    assert lossless(base, cand, temperature=0.7) == {"status": "n/a (sampling)"}
    assert lossless(base, cand, temperature=None)["status"].startswith("n/a")


def _metrics(drafts: int, accepted: int, passes: int | None = None) -> dict:
    return {
        "num_drafts": drafts,
        "num_draft_tokens": 4 * drafts,
        "num_accepted_tokens": accepted,
        "accepted_per_pos": [drafts // 2],
        "target_passes": passes,
    }


def test_target_passes_from_counters_and_steps():
    # two requests, each: a prefill pass (1 token) and two passes of 3 tokens (1 + 2 accepted)
    recs = [rec(ids=[1] * 7, chunks=(1, 3, 3), rid=r) for r in "ab"]
    exact = spec_totals([_run("ngram", recs, _metrics(4, 8))])
    assert exact["target_passes"] == 6 and exact["tokens_per_target_pass"] == pytest.approx(14 / 6)
    assert exact["mean_acceptance_length"] == pytest.approx(3.0)  # vLLM's: drafting passes only
    # vLLM counted 2 accepted tokens that max_tokens cut off: the chunks are the closer bound
    cut = spec_totals([_run("ngram", recs, _metrics(4, 10))])
    assert (cut["target_passes"], cut["target_passes_source"]) == (6, "stream chunks")
    # a server merged two steps into one chunk: the counters are the closer bound
    merged = [rec(ids=[1] * 7, chunks=(1, 6), rid=r) for r in "ab"]
    m = spec_totals([_run("ngram", merged, _metrics(4, 8))])
    assert (m["target_passes"], m["target_passes_source"]) == (6, "output - accepted tokens")
    hf = spec_totals([_run("ngram", merged, _metrics(4, 8, passes=7))])
    assert (hf["target_passes"], hf["target_passes_source"]) == (7, "counted by the engine")


def test_theory_takes_c_from_step_times_and_best_gamma_only_at_a_finite_optimum():
    assert expected_tokens(0.5, 4) == pytest.approx(1.9375)
    assert predicted_speedup(0.5, 4, 0.25) == pytest.approx(1.9375 / 2)
    assert best_gamma(0.5, 0.0)[0] is None  # c = 0: more drafting is always free
    assert best_gamma(0.999, 1e-6)[0] is None  # the optimum lies beyond the search
    g, _ = best_gamma(0.7, 0.05)
    assert 1 < g < 20 and predicted_speedup(0.7, g, 0.05) >= predicted_speedup(0.7, g + 1, 0.05)
    base = {"decode": {"requests": 10.0, "seconds": 1.0, "tokens": 100.0}}
    spec = {
        "name": "e/ngram",
        "point": "p",
        "max_new_tokens": 32,
        "spec_config": {"method": "ngram", "num_speculative_tokens": 4},
        "spec": {"alpha": 0.5, "target_passes": 60, "tokens_per_target_pass": 1.8},
        "decode": {"requests": 10.0, "seconds": 1.0, "tokens": 80.0},
    }
    th = theory(spec, base)  # 0.02 s per decode pass vs 0.01 s per baseline token: round = 2
    assert th["c"] == pytest.approx(0.25) and th["c_source"] == "step times"
    assert th["predicted_speedup"] == pytest.approx(1.9375 / 2)
    fast = {**spec, "decode": {"requests": 10.0, "seconds": 0.4, "tokens": 80.0}}  # 0.008 s/pass
    drift = theory(fast, base)  # a pass cheaper than a baseline token: c < 0, no prediction
    assert drift["c"] < 0 and drift["predicted_speedup"] is None and drift["best_gamma"] is None
    assert "drifted" in drift["predicted_note"]
    alone = theory(spec, None)  # no baseline to time against, no bare forward timing: no c
    assert alone["c"] is None and alone["predicted_speedup"] is None
    assert alone["best_gamma"] is None
