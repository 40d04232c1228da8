"""The paired comparisons' statistics: t-intervals on per-repeat log ratios, verdicts, and the
median and spread of repeated measurements (the summaries they compare:
:mod:`harness.analysis.summary`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

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
