"""A sequential design per comparison: look after every block, stop when the verdict is settled.

The data are the blocks' log speedups d_1, d_2, ... (one per block, as for the fixed-n
t-interval of :mod:`harness.analysis.comparisons.stats`). At look n (n = ``first`` .. ``cap``) the interval
is the *repeated confidence interval* exp(mean_n +- c_n * sd_n / sqrt(n)): c_n is a
group-sequential boundary on the t-statistic, chosen so that under normal log ratios the
probability that ANY look's interval misses the truth is ``alpha``. The intervals then cover
the truth at once at every look, so whatever rule stops (a verdict settled, the cap, the
budget, another comparison of the same point) the interval reported at the stop covers with
probability >= 1 - alpha, and "faster"/"slower" is false at most ``alpha`` of the time.

Why this and not the alternatives (at 3-12 blocks, where this harness lives):

* Group-sequential with an alpha-spending function (Lan-DeMets) spends all of alpha by the cap,
  which is known in advance here (``--max-repeats``); an anytime-valid confidence sequence
  guards against infinitely many looks and pays for it at every n. With the variance known,
  the Pocock-type boundary for looks at 3-8 blocks is 2.24-2.45 standard errors, the best
  normal-mixture confidence sequence (Robbins; mixing variance = one block) 3.04-3.14: ~30%
  wider, ~1.7x the blocks for the same power; with the variance estimated from 2-7 degrees of
  freedom both widen.
* Of the spending functions, the Pocock-type alpha * log(1 + (e - 1) * t) is the most powerful
  at 3-5 blocks, where the main job's budget ends most comparisons: at a cap of 8 its
  boundaries are 6.3, 5.4, 4.5 at 3, 4, 5 blocks against O'Brien-Fleming-type 26, 7.7, 4.7; it
  stops a clear 30% effect at 3 blocks 71% of the time (O'Brien-Fleming: 8%, median 4 blocks)
  and still finds a 10% effect at 3% run noise with 82% power by the cap (O'Brien-Fleming,
  narrower from 6 blocks on: 92%; docs/statistics-sequential.md).
* The t-statistic with few degrees of freedom is not a Gaussian process: converting the
  Gaussian (z) boundaries to t quantiles at the same nominal level (the "significance level
  approach") spent 5.5-6.0% instead of 5% at caps 6-12. So c_n is computed for the
  t-statistic itself: its null distribution is free of the unknown sd, and the boundary of each
  look is the quantile of |T_n| among simulated null paths that crossed no earlier boundary,
  with the spending function's increment as the tail (400,000 paths, fixed seed, cached: the
  alpha actually spent is within ~0.001 of the nominal).

Verdicts: an interval above or below 1 decides (:func:`harness.analysis.comparisons.stats.verdicts`
names it: "faster", "slower", or "within +-2%" when the effect is under ``--min-effect``); an
interval inside [1 - min_effect, 1 + min_effect] decides "within +-2%" (equivalence); else the
comparison is undecided at that look. A comparison reports its first deciding look (that look
is a stopping time: the interval there covers as every look's does), or its last look.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.analysis.comparisons.stats import MIN_REPEATS, Comparison, verdicts

ALPHA = 0.05
SPENDING = ("pocock", "obrien-fleming")
DEFAULT_CAP = 8  # blocks: power >= 80% for 10% at 3% run noise (tests/test_sequential.py)
PATHS = 400_000  # simulated null paths per boundary set
UNDECIDED = "undecided"  # verdict prefix: "undecided at N blocks"


@dataclass(frozen=True)
class Rule:
    """The sequential rule of a run: looks at blocks ``first`` .. ``cap`` (the planned maximum,
    which sets the information fraction n / cap of the spending function)."""

    cap: int = DEFAULT_CAP
    alpha: float = ALPHA
    spending: str = "pocock"
    first: int = MIN_REPEATS

    @property
    def method(self) -> str:
        return (
            f"group-sequential t on per-repeat log ratios ({self.spending} alpha-spending, "
            f"looks at {self.first}-{self.cap} blocks)"
        )

    def to_json(self) -> dict[str, Any]:
        return {"cap": self.cap, "alpha": self.alpha, "spending": self.spending,
                "first": self.first}  # fmt: skip


def rule_of(stopping: Mapping[str, Any] | None) -> tuple[Rule | None, dict[str, str]]:
    """The Rule and each point's stop (point key -> "cap", "budget", ...) from a stored
    ``design.stopping`` record; (None, {}) for a fixed-n run."""
    if not stopping or stopping.get("rule") != "sequential":
        return None, {}
    rule = Rule(stopping["cap"], stopping["alpha"], stopping["spending"], stopping["first"])
    points = stopping.get("points") or {}
    return rule, {k: v.get("stopped", "stopped") for k, v in points.items()}


def spent(spending: str, t: np.ndarray, alpha: float) -> np.ndarray:
    """The Lan-DeMets spending function: alpha spent by information fraction ``t``."""
    t = np.minimum(np.asarray(t, dtype=float), 1.0)
    if spending == "pocock":
        return alpha * np.log1p((math.e - 1.0) * t)
    if spending == "obrien-fleming":
        from scipy import stats

        return 2.0 - 2.0 * stats.norm.cdf(stats.norm.isf(alpha / 2) / np.sqrt(t))
    raise ValueError(f"unknown spending function {spending!r}")


@functools.cache
def _boundaries(cap: int, alpha: float, spending: str, first: int) -> tuple[float, ...]:
    rng = np.random.default_rng(20261201)
    ns = np.arange(first, cap + 1)
    cum = spent(spending, ns / cap, alpha)
    out: list[float] = []
    alive = np.ones(PATHS, dtype=bool)
    s = np.zeros(PATHS)
    ss = np.zeros(PATHS)
    for n in range(1, cap + 1):
        x = rng.standard_normal(PATHS)
        s += x
        ss += x * x
        if n < first:
            continue
        mean = s / n
        t = np.abs(mean) / np.sqrt(np.maximum(ss - n * mean * mean, 1e-300) / (n - 1) / n)
        k = n - first
        tail = int(round((cum[k] - (cum[k - 1] if k else 0.0)) * PATHS))
        live = np.sort(t[alive])[::-1]
        c = float(live[tail - 1]) if 0 < tail <= live.size else float("inf")
        out.append(c)
        alive &= t <= c
    return tuple(out)


def boundaries(rule: Rule) -> np.ndarray:
    """c_n for n = rule.first .. rule.cap: |T_n| > c_n at any look has probability rule.alpha
    under no difference (normal log ratios, any sd)."""
    return np.array(_boundaries(rule.cap, rule.alpha, rule.spending, rule.first))


def looks(d: np.ndarray, rule: Rule) -> dict[str, np.ndarray]:
    """The interval at every look over the leading axes of ``d[..., n]`` (n blocks so far):
    ``n``, ``estimate``, ``lo``, ``hi``, ``boundary``, each of shape (..., looks), looks at
    first .. min(n, cap)."""
    d = np.asarray(d, dtype=float)
    last = min(d.shape[-1], rule.cap)
    ns = np.arange(rule.first, last + 1)
    if ns.size == 0:
        empty = np.zeros((*d.shape[:-1], 0))
        return {"n": ns, "estimate": empty, "lo": empty, "hi": empty, "boundary": ns * 1.0}
    c = boundaries(rule)[: ns.size]
    s = np.cumsum(d, axis=-1)[..., ns - 1]
    ss = np.cumsum(d * d, axis=-1)[..., ns - 1]
    mean = s / ns
    sd = np.sqrt(np.maximum(ss - ns * mean * mean, 0.0) / (ns - 1))
    h = c * sd / np.sqrt(ns)
    return {"n": ns, "estimate": np.exp(mean), "lo": np.exp(mean - h),
            "hi": np.exp(mean + h), "boundary": c}  # fmt: skip


def decisions(
    est: np.ndarray, lo: np.ndarray, hi: np.ndarray, min_effect: float
) -> tuple[np.ndarray, np.ndarray]:
    """(decided, verdict) per interval: decided when it excludes 1 or lies inside +-min_effect."""
    v = verdicts(est, lo, hi, min_effect)
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    inside = (lo >= 1.0 - min_effect) & (hi <= 1.0 + min_effect)
    v = np.where(inside & ~((lo > 1.0) | (hi < 1.0)), f"within +-{min_effect:.0%}", v)
    return ((lo > 1.0) | (hi < 1.0) | inside), v


def stopped_at(d: np.ndarray, rule: Rule, min_effect: float) -> dict[str, np.ndarray]:
    """What each comparison reports from its blocks ``d[..., n]``: the first deciding look, else
    the last; ``index`` (into the looks), ``n``, ``estimate``, ``lo``, ``hi``, ``verdict``,
    ``decided``. Vectorised: the simulations run it on thousands of experiments at once."""
    lk = looks(d, rule)
    shape = d.shape[:-1]
    if lk["n"].size == 0:
        nan = np.full(shape, np.nan)
        return {"index": np.full(shape, -1), "n": np.full(shape, d.shape[-1]), "estimate":
                np.exp(np.mean(d, axis=-1)) if d.shape[-1] else nan, "lo": nan, "hi": nan,
                "verdict": np.full(shape, "n/a (n too small)", dtype=object),
                "decided": np.zeros(shape, dtype=bool)}  # fmt: skip
    ok, v = decisions(lk["estimate"], lk["lo"], lk["hi"], min_effect)
    any_ok = ok.any(axis=-1)
    index = np.where(any_ok, ok.argmax(axis=-1), lk["n"].size - 1)

    def at(a: np.ndarray) -> np.ndarray:
        return np.take_along_axis(a, index[..., None], axis=-1)[..., 0]

    n = lk["n"][index]
    verdict = np.where(any_ok, at(v), np.char.add(f"{UNDECIDED} at ", n.astype(str)))
    verdict = np.where(any_ok, verdict, np.char.add(verdict.astype(str), " blocks"))
    return {"index": index, "n": n, "estimate": at(lk["estimate"]), "lo": at(lk["lo"]),
            "hi": at(lk["hi"]), "verdict": verdict.astype(object), "decided": any_ok}  # fmt: skip


def run_to_stop(d: np.ndarray, rule: Rule, min_effect: float) -> dict[str, np.ndarray]:
    """The simulation of a whole sequential experiment with one comparison: blocks are added
    while :func:`stopped_at` on the blocks so far says undecided (what the session asks after
    every block, harness.run.stopping), up to the cap. ``d[..., cap]`` holds every block the
    experiment could run; returns :func:`stopped_at` at the stop, plus ``blocks`` (run)."""
    d = np.asarray(d, dtype=float)
    full = stopped_at(d[..., : rule.cap], rule, min_effect)
    # the first deciding look of the whole path is where the session stops: at each earlier
    # look stopped_at on the blocks so far was undecided (the looks of a prefix are the same)
    blocks = np.where(full["decided"], full["n"], min(rule.cap, d.shape[-1]))
    return {**full, "blocks": blocks}


def comparison_looks(d: np.ndarray, rule: Rule, min_effect: float) -> list[dict[str, Any]]:
    """Every look of one comparison as results.json stores it (``looks``): n, estimate, lo,
    hi, boundary, and whether that look decided."""
    lk = looks(np.asarray(d, dtype=float), rule)
    if lk["n"].size == 0:
        return []
    ok, v = decisions(lk["estimate"], lk["lo"], lk["hi"], min_effect)
    return [
        {
            "n": int(n),
            "estimate": float(e),
            "lo": float(lo),
            "hi": float(hi),
            "boundary": float(c),
            "decided": bool(k),
            "verdict": str(vv),
        }  # fmt: skip
        for n, e, lo, hi, c, k, vv in zip(
            lk["n"], lk["estimate"], lk["lo"], lk["hi"], lk["boundary"], ok, v
        )
    ]


def sequential_comparison(
    metric: str, d: Sequence[float], rule: Rule, min_effect: float
) -> tuple[Comparison, dict[str, Any]]:
    """One comparison of a sequential run from its per-block log speedups (non-finite values
    dropped): the Comparison at its reported look, and ``looks``, ``blocks``, ``decided``."""
    xs = np.array([x for x in d if x is not None and math.isfinite(x)], dtype=float)
    if xs.size == 0:
        return Comparison(metric, None, None, None, 0, rule.method, "n/a"), {
            "looks": [], "blocks": 0, "decided": False}  # fmt: skip
    at = stopped_at(xs, rule, min_effect)
    n = int(at["n"])
    lo, hi = (None if not math.isfinite(float(at[k])) else float(at[k]) for k in ("lo", "hi"))
    comp = Comparison(metric, float(at["estimate"]), lo, hi, n, rule.method, str(at["verdict"][()]))
    extra = {"looks": comparison_looks(xs, rule, min_effect), "blocks": n,
             "decided": bool(at["decided"])}  # fmt: skip
    if extra["decided"]:
        extra["stopped"] = "decided"
    return comp, extra
