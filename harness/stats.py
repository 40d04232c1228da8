"""Statistics over records: distributions, run summaries, paired ratios with bootstrap CIs.

Every metric has one definition here; markdown, plots and compare all call these.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.records import RequestRecord

PERCENTILES = (50, 90, 99)


def distribution(values: Iterable[float | None]) -> dict[str, float | None]:
    """mean, median, p90, p99, stdev of the non-missing values (None when there are none)."""
    xs = np.array([v for v in values if v is not None], dtype=float)
    if xs.size == 0:
        return {"n": 0, "mean": None, "median": None, "p90": None, "p99": None, "stdev": None}
    p50, p90, p99 = np.percentile(xs, PERCENTILES)
    return {
        "n": int(xs.size),
        "mean": float(xs.mean()),
        "median": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "stdev": float(xs.std(ddof=1)) if xs.size > 1 else 0.0,
    }


def peak_in_flight(records: Sequence[RequestRecord]) -> int:
    """The most requests that were in flight at once, from send and end times."""
    events = sorted([(r.t_send, 1) for r in records] + [(r.t_end, -1) for r in records])
    peak = cur = 0
    for _, step in events:
        cur += step
        peak = max(peak, cur)
    return peak


def summarize(
    records: Sequence[RequestRecord], goodput: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """The per-run summary: counts, throughput and latency distributions (warm-ups excluded)."""
    counted = [r for r in records if not r.warmup]
    ok = [r for r in counted if r.ok]
    failed = [r for r in counted if not r.ok]
    out: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(failed),
        "errors": _error_counts(failed),
    }
    if not ok:
        return out
    start = min(r.t_send for r in counted)
    end = max(r.t_end for r in counted)
    duration = end - start
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    sends = sorted(r.t_send for r in counted)
    span = sends[-1] - sends[0]
    out.update(
        duration_s=duration,
        output_tokens=out_tokens,
        request_throughput=len(ok) / duration if duration > 0 else None,
        output_tok_s=out_tokens / duration if duration > 0 else None,
        total_tok_s=(out_tokens + in_tokens) / duration if duration > 0 else None,
        achieved_rate=(len(sends) - 1) / span if span > 0 else None,
        peak_in_flight=peak_in_flight(counted),
        ttft_s=distribution(r.ttft for r in ok),
        tpot_s=distribution(r.tpot for r in ok),
        itl_s=distribution(x for r in ok for x in r.itl),
        itl_per_token_s=distribution(x for r in ok for x in r.itl_per_token),
        e2e_s=distribution(r.e2e for r in ok),
        mean_chunk_tokens=out_tokens / max(1, sum(len(r.chunk_tokens) for r in ok)),
    )
    if goodput:
        good = [r for r in ok if _meets(r, goodput)]
        out["goodput"] = len(good) / duration if duration > 0 else None
    return out


def _error_counts(failed: Sequence[RequestRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in failed:
        kind = (r.error or "error").split(":")[0].strip()
        counts[kind] = counts.get(kind, 0) + 1
    return counts


GOODPUT_METRICS: dict[str, Callable[[RequestRecord], float | None]] = {
    "ttft": lambda r: r.ttft,
    "tpot": lambda r: r.tpot,
    "e2e": lambda r: r.e2e,
}


def _meets(r: RequestRecord, slo_ms: Mapping[str, float]) -> bool:
    for name, ms in slo_ms.items():
        v = GOODPUT_METRICS[name](r)
        if v is not None and v * 1000.0 > ms:
            return False
    return True


# ---- paired comparisons --------------------------------------------------------------------


@dataclass(frozen=True)
class Ratio:
    """A speedup (>1 = the candidate is better) with its 95% bootstrap CI and a verdict."""

    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    verdict: str
    n: int

    def to_json(self) -> dict[str, Any]:
        return {
            "ratio": self.ratio,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "verdict": self.verdict,
            "n": self.n,
        }


def verdict(ratio: float | None, lo: float | None, hi: float | None, min_effect: float) -> str:
    """ "faster", "slower" or "no significant difference" (CI crosses 1 or effect too small)."""
    if ratio is None:
        return "n/a"
    if lo is None or hi is None:
        return "n/a (no CI)"
    if lo > 1.0 and ratio >= 1.0 + min_effect:
        return "faster"
    if hi < 1.0 and ratio <= 1.0 - min_effect:
        return "slower"
    return "no significant difference"


# A paired metric: from the baseline's and the candidate's values on the same groups
# (prompts, or repeats) to one speedup.
Statistic = Callable[[np.ndarray, np.ndarray], float]


def paired_ratio(
    base: np.ndarray,
    cand: np.ndarray,
    statistic: Statistic,
    *,
    min_effect: float = 0.02,
    resamples: int = 2000,
    seed: int = 0,
) -> Ratio:
    """Bootstrap the ``statistic`` over paired groups (rows of ``base``/``cand``)."""
    n = len(base)
    if n == 0:
        return Ratio(None, None, None, "n/a", 0)
    point = statistic(base, cand)
    if n < 2 or not math.isfinite(point):
        return Ratio(point if math.isfinite(point) else None, None, None, "n/a (no CI)", n)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    boots = np.array([statistic(base[i], cand[i]) for i in idx])
    boots = boots[np.isfinite(boots)]
    lo, hi = (float(x) for x in np.percentile(boots, [2.5, 97.5]))
    return Ratio(point, lo, hi, verdict(point, lo, hi, min_effect), n)


def throughput_speedup(base: np.ndarray, cand: np.ndarray) -> float:
    """Rows are (output tokens, seconds): ratio of summed tokens/s, candidate over baseline."""
    b = base[:, 0].sum() / base[:, 1].sum()
    c = cand[:, 0].sum() / cand[:, 1].sum()
    return float(c / b) if b > 0 else math.nan


def median_speedup(base: np.ndarray, cand: np.ndarray) -> float:
    """Rows are a latency: baseline median over candidate median (>1 = candidate faster)."""
    c = float(np.median(cand[:, 0]))
    return float(np.median(base[:, 0]) / c) if c > 0 else math.nan


def instability(values: Sequence[float]) -> float | None:
    """Spread (stdev / median) of repeated measurements; pyperf warns above 10%."""
    xs = np.array(values, dtype=float)
    if xs.size < 2 or np.median(xs) == 0:
        return None
    return float(xs.std(ddof=1) / np.median(xs))


def ci_half_width(values: Sequence[float], resamples: int = 1000, seed: int = 0) -> float | None:
    """Half-width of the 95% bootstrap CI of the mean, relative to the mean (0.05 = +-5%)."""
    xs = np.array(values, dtype=float)
    if xs.size < 2 or xs.mean() == 0:
        return None
    rng = np.random.default_rng(seed)
    means = xs[rng.integers(0, xs.size, size=(resamples, xs.size))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float((hi - lo) / 2 / xs.mean())
