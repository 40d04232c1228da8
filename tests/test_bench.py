"""The benchmark suite's own arithmetic: verdicts with CIs, and why-lines built from measured parts.

The benchmarks themselves are not run here (too slow and noisy for CI: ``python -m bench``).
"""

from __future__ import annotations

import pytest

from bench.common import median_ci, ratio_headline
from bench.overhead import SCALED_LABEL, why


def test_median_ci_is_seeded_and_brackets_the_median() -> None:
    xs = [0.9, 0.95, 1.0, 1.02, 0.97, 0.93, 1.05, 0.99, 0.96]
    lo, hi = median_ci(xs)
    assert (lo, hi) == median_ci(xs)  # seeded: the same figures give the same interval
    assert lo <= sorted(xs)[4] <= hi and lo >= min(xs) and hi <= max(xs)
    assert median_ci([1.0, 1.1]) is None  # too few pairs for an interval


@pytest.mark.parametrize(
    ("ratios", "ok", "noise"),
    [
        ([0.99, 1.0, 1.01, 0.995, 1.02], True, False),  # met
        ([0.90, 0.91, 0.92, 0.905, 0.915], False, False),  # missed, CI far below
        ([0.90, 1.05, 0.95, 1.1, 0.96], False, True),  # missed, but the CI reaches 0.98
    ],
)
def test_ratio_headline_verdicts(ratios: list[float], ok: bool, noise: bool) -> None:
    h = ratio_headline("x", ratios, 0.98, float("inf"), ">= 0.98")
    assert h.ok is ok and h.within_noise is noise
    assert "95% CI of the median" in h.detail and f"{len(ratios)} pairs" in h.detail


def test_ratio_headline_band_and_empty() -> None:
    assert ratio_headline("x", [1.04, 1.03, 1.02], 0.95, 1.05, "within 5%").ok is True
    assert ratio_headline("x", [1.2, 1.3, 1.25], 0.95, 1.05, "within 5%").ok is False
    empty = ratio_headline("x", [], 0.95, 1.05, "within 5%")
    assert empty.value is None and empty.ok is None and not empty.within_noise


def _fact(label: str, ratio: float, **kw: float | None) -> dict:
    base = {"cpu_us": 10.0, "tps": 2000.0, "raw_vs_first": None, "raw_tps": 2100.0, "n_req": 32}
    base["ci"] = (ratio - 0.05, ratio + 0.05)
    return {"label": label, "ratio": ratio, **base, **kw}


def test_why_attributes_measured_parts_only() -> None:
    facts = [
        _fact("vllm throughput", 0.90),
        _fact("vllm throughput vs raw streamed", 0.95, raw_vs_first=0.96),
        _fact(SCALED_LABEL, 0.97, cpu_us=20.0, tps=400.0, raw_tps=410.0),
        _fact("vllm latency", 0.99),  # met: no line
    ]
    (text,) = why(facts)
    assert "vllm throughput: 0.900" in text and "vllm latency" not in text
    assert "2.0% of the harness side's wall time" in text  # 10 us x 2000 tok/s
    assert "0.960x `llm.generate`'s speed" in text
    # 10% gap - 2% event loop - 4% streamed outputs = 4% left, outside the CI [0.85, 0.95]
    assert "remaining 4.0% is not attributed" in text and "outside the 95% CI" in text
    assert "8x512 Llama (78 ms per step of 32 requests, against 15 ms)" in text


def test_why_is_empty_when_every_target_is_met() -> None:
    assert why([_fact("hf latency", 0.99), _fact("vllm throughput", 1.01)]) == []
