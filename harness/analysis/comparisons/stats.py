"""Statistics over records: distributions, run summaries, paired speedups with t-intervals.

Every metric has one definition here; markdown, plots and compare all call these.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.core.records import NOT_SENT, RequestRecord

PERCENTILES = (50, 90, 99)


def pkey(p: float) -> str:
    """The key of a percentile as vLLM bench serve writes it: p99, p99.9."""
    return f"p{int(p)}" if float(p).is_integer() else f"p{p:g}"


def distribution(
    values: Iterable[float | None], percentiles: Sequence[float] = PERCENTILES
) -> dict[str, float | None]:
    """mean, median, p90, p99 (and any other ``percentiles``: ``--metric-percentiles``), stdev
    of the non-missing values (None when there are none)."""
    ps = list(dict.fromkeys([*PERCENTILES, *percentiles]))
    xs = np.array([v for v in values if v is not None], dtype=float)
    if xs.size == 0:
        return {"n": 0, "mean": None, "median": None, **{pkey(p): None for p in ps}, "stdev": None}
    qs = np.percentile(xs, ps)
    return {
        "n": int(xs.size),
        "mean": float(xs.mean()),
        "median": float(qs[0]),
        **{pkey(p): float(q) for p, q in zip(ps, qs)},
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
    records: Sequence[RequestRecord],
    goodput: Mapping[str, float] | None = None,
    percentiles: Sequence[float] = PERCENTILES,
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
    sends = sorted(r.t_send for r in counted if r.error != NOT_SENT)  # what the client sent
    span = sends[-1] - sends[0]
    out.update(
        duration_s=duration,
        output_tokens=out_tokens,
        request_throughput=len(ok) / duration if duration > 0 else None,
        output_tok_s=out_tokens / duration if duration > 0 else None,
        total_tok_s=(out_tokens + in_tokens) / duration if duration > 0 else None,
        achieved_rate=(len(sends) - 1) / span if span > 0 else None,
        peak_in_flight=peak_in_flight(counted),
        mean_in_flight=sum(r.t_end - r.t_send for r in counted) / duration
        if duration > 0
        else None,
        ttft_s=distribution((r.ttft for r in ok), percentiles),
        tpot_s=distribution((r.tpot for r in ok), percentiles),
        itl_s=distribution((x for r in ok for x in r.itl), percentiles),
        itl_per_token_s=distribution((x for r in ok for x in r.itl_per_token), percentiles),
        e2e_s=distribution((r.e2e for r in ok), percentiles),
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


# What --goodput and --slo judge: TTFT and E2E as the user waits them (from the schedule under
# an open loop, from the send in a closed one: RequestRecord.user_ttft); TPOT has no clock in it.
# A request with one output token has no TPOT and passes that bound (vLLM counts it as 0).
GOODPUT_METRICS: dict[str, Callable[[RequestRecord], float | None]] = {
    "ttft": lambda r: r.user_ttft,
    "tpot": lambda r: r.tpot,
    "e2e": lambda r: r.user_e2e,
}
# the same metrics from the send (the capacity a client that fell behind would have claimed)
FROM_SEND: dict[str, Callable[[RequestRecord], float | None]] = {
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
#
# The unit is the repeat: a repeat of the baseline and the same repeat of the candidate ran in the
# same round, so one machine state (load, clock, caches) is shared by both, and the next round
# draws a new one. Within a run every request shares that state, so requests (or prompts) are
# not independent units: a CI over prompts misses the run-to-run noise (it printed
# "0.77x [0.77, 0.77]" for throughput-mode TTFT, where 16 requests prefill in one step). Each
# metric gives one log speedup per repeat; the estimate is exp(mean) and the CI a t-interval on
# those n values (exact for normal log ratios; tests/test_calibration.py checks it on simulated
# experiments). A percentile bootstrap over 3 repeats is [min, max] and covered 76%.

MIN_REPEATS = 3  # a t-interval needs 2 df to be of any use; below: "n/a (n too small)"
METHOD = "t on per-repeat log ratios"
TOO_FEW = "n/a (n too small)"


def t975(df: int) -> float:
    """The two-sided 95% Student t quantile (scipy.stats)."""
    return t_quantile(0.975, df)


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, df: int) -> float:
    """The Student t quantile at ``p`` (scipy.stats): other levels than 95%, e.g. Bonferroni's."""
    if df < 1:
        raise ValueError("df must be >= 1")
    from scipy import stats

    return float(stats.t.ppf(p, df))


@dataclass(frozen=True)
class Comparison:
    """A speedup of a candidate over a baseline (>1 = the candidate is better) on one metric.

    ``estimate`` is exp(mean of the per-repeat log speedups), ``lo``/``hi`` its 95% CI (None
    below MIN_REPEATS), ``n`` the repeats paired, ``method`` how the CI was made.
    """

    metric: str
    estimate: float | None
    lo: float | None
    hi: float | None
    n: int
    method: str
    verdict: str

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "estimate": self.estimate,
            "lo": self.lo,
            "hi": self.hi,
            "n": self.n,
            "method": self.method,
            "verdict": self.verdict,
        }


def log_ratio_ci(d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, lo, hi) as speedups from log speedups ``d[..., n]`` (vectorised over the
    leading axes): exp(mean +- t(n-1) * sd / sqrt(n)). lo/hi are nan when n < MIN_REPEATS."""
    d = np.asarray(d, dtype=float)
    n = d.shape[-1]
    m = d.mean(axis=-1)
    if n < MIN_REPEATS:
        nan = np.full_like(m, np.nan)
        return np.exp(m), nan, nan
    h = t975(n - 1) * d.std(axis=-1, ddof=1) / math.sqrt(n)
    return np.exp(m), np.exp(m - h), np.exp(m + h)


def verdicts(est: np.ndarray, lo: np.ndarray, hi: np.ndarray, min_effect: float) -> np.ndarray:
    """Vectorised :func:`verdict` (nan bounds: n too small)."""
    est, lo, hi = (np.asarray(x, dtype=float) for x in (est, lo, hi))
    out = np.full(est.shape, "no significant difference", dtype=object)
    out[(lo > 1.0) | (hi < 1.0)] = f"within +-{min_effect:.0%}"
    out[(lo > 1.0) & (est >= 1.0 + min_effect)] = "faster"
    out[(hi < 1.0) & (est <= 1.0 - min_effect)] = "slower"
    out[np.isnan(lo) | np.isnan(hi)] = TOO_FEW
    out[np.isnan(est)] = "n/a"
    return out


def verdict(est: float | None, lo: float | None, hi: float | None, min_effect: float) -> str:
    """ "faster"/"slower" when the CI excludes 1 and the effect exceeds ``min_effect``;
    "within +-2%" (the min effect) when the CI excludes 1 but the effect is smaller; else
    "no significant difference". No CI: "n/a (n too small)"."""
    if est is None:
        return "n/a"
    nan = float("nan")
    v = verdicts(
        np.array(est), np.array(nan if lo is None else lo), np.array(nan if hi is None else hi),
        min_effect,
    )  # fmt: skip
    return str(v[()])


def compare_log_ratios(metric: str, d: Sequence[float], min_effect: float) -> Comparison:
    """The comparison from one log speedup per paired repeat (non-finite values dropped)."""
    xs = np.array([x for x in d if x is not None and math.isfinite(x)], dtype=float)
    if xs.size == 0:
        return Comparison(metric, None, None, None, 0, METHOD, "n/a")
    est, lo, hi = (float(x) for x in log_ratio_ci(xs))
    if xs.size < MIN_REPEATS:
        return Comparison(metric, est, None, None, int(xs.size), METHOD, TOO_FEW)
    return Comparison(metric, est, lo, hi, int(xs.size), METHOD, verdict(est, lo, hi, min_effect))


def half_width(c: Mapping[str, Any]) -> float | None:
    """A comparison's CI half-width on the log scale (0.05 ~ +-5%); None without a CI."""
    if c.get("lo") is None or c.get("hi") is None:
        return None
    return (math.log(c["hi"]) - math.log(c["lo"])) / 2


def median(values: Sequence[float]) -> float | None:
    """The true median (the mean of the middle two for an even count); None when empty."""
    return float(np.median(np.asarray(values, dtype=float))) if len(values) else None


def instability(values: Sequence[float]) -> float | None:
    """Spread (stdev / median) of repeated measurements; pyperf warns above 10%."""
    xs = np.array(values, dtype=float)
    if xs.size < 2 or np.median(xs) == 0:
        return None
    return float(xs.std(ddof=1) / np.median(xs))
