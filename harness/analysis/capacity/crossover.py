"""The crossover in capacity terms: the request rate at which a speculative variant's latency
(E2E at the SLO's quantile, from each request's scheduled arrival: the deciding latency at a
rate on the clock the paired comparisons use, :data:`harness.analysis.comparisons.paired.LATENCIES`,
:func:`harness.analysis.comparisons.paired.deciding_metric`) stops being better than the baseline's, with a
CI, from the capacity search's probed points (saturated probes left out: their latency only
measured the queue)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.analysis.comparisons.stats import log_ratio_ci

METRIC = "e2e"
NEAR = 2  # probed rates each side of the sign change that the per-repeat line is fitted to


def _logs(
    probes: Sequence[Mapping[str, Any]], base: str, cand: str
) -> dict[float, dict[int, float]]:
    """rate -> repeat -> log(base / cand) of the quantile, where both ran unsaturated."""
    at: dict[tuple[str, float, int], float] = {}
    for p in probes:
        v = (p.get("quantiles_s") or {}).get(METRIC)
        if not p.get("saturated") and v is not None and v > 0:
            at[(p["variant"], p["rate"], p["repeat"])] = math.log(v)
    out: dict[float, dict[int, float]] = {}
    for (v, rate, b), x in at.items():
        if v == base and (cand, rate, b) in at:
            out.setdefault(rate, {})[b] = x - at[(cand, rate, b)]
    return dict(sorted(out.items()))


def rate_crossover(
    probes: Sequence[Mapping[str, Any]], variants: Sequence[str]
) -> list[dict[str, Any]]:
    """Per candidate (vs the first variant): "pays at every probed rate", "never pays", or
    "stops paying" between two probed rates (``pays_up_to`` and ``not_faster_from``), at a rate
    with a 95% CI (t over repeats of the log rate where that repeat's line of log speedup on log
    rate, fitted over the probed rates it has among the ``NEAR`` each side of the sign change,
    crosses 0: two points alone make a repeat's slope too noisy). Where no rate can be estimated
    (no repeat with two rates there, the line does not fall, or it crosses outside the probed
    rates) ``at`` is None and ``no_estimate`` says why: never a nan."""
    out = []
    base = variants[0] if variants else None
    for cand in variants[1:]:
        logs = _logs(probes, base, cand)
        if len(logs) < 1:
            continue
        rates = list(logs)
        means = [float(np.mean(list(logs[r].values()))) for r in rates]
        entry: dict[str, Any] = {
            "baseline": base, "candidate": cand, "metric": METRIC,
            "points": [{"rate": r, "log_speedup": m} for r, m in zip(rates, means)],
        }  # fmt: skip
        stop = next((k for k, m in enumerate(means) if m <= 0), None)
        if stop is None:
            entry.update(kind="pays at every probed rate", at=rates[-1])
        elif stop == 0:
            entry.update(kind="never pays", at=rates[0])
        else:
            entry.update(kind="stops paying", pays_up_to=rates[stop - 1],
                         not_faster_from=rates[stop])  # fmt: skip
            entry.update(_estimate(logs, rates, means, stop))
        out.append(entry)
    return out


def _estimate(
    logs: Mapping[float, Mapping[int, float]], rates: list[float], means: list[float], stop: int
) -> dict[str, Any]:
    """``at`` with ``lo``/``hi`` and ``n`` (the repeats fitted), or ``at`` None and why."""
    near = rates[max(stop - NEAR, 0) : stop + NEAR]  # NEAR rates each side of it
    xs = np.log(near)
    pooled = float(np.polyfit(xs, [means[rates.index(r)] for r in near], 1)[0])
    if pooled >= 0:  # the means beside the sign change do not fall: no line crosses downwards
        return _none("the mean speedup near the change does not fall with the rate", 0)
    cross = []
    for b in sorted(set().union(*(set(logs[r]) for r in near))):
        have = [(x, logs[r][b]) for x, r in zip(xs, near) if b in logs[r]]
        if len(have) < 2:  # a line needs two rates: this repeat ran unsaturated at one
            continue
        x, y = np.array(have).T
        slope, icpt = np.polyfit(x, y, 1)
        if slope >= 0:  # this repeat's line does not fall: the pooled slope through it
            slope, icpt = pooled, float(np.mean(y) - pooled * x.mean())
        cross.append(-icpt / slope)
    if not cross:
        return _none("no repeat ran both variants unsaturated at two of the rates near it", 0)
    est, clo, chi = (float(v) for v in log_ratio_ci(np.array(cross, dtype=float)))
    if not rates[0] <= est <= rates[-1]:
        return _none(f"the fitted crossing ({est:.3g} req/s) lies outside the probed rates",
                     len(cross))  # fmt: skip
    return {"at": est, "lo": None if math.isnan(clo) else clo,
            "hi": None if math.isnan(chi) else chi, "n": len(cross)}  # fmt: skip


def _none(why: str, n: int) -> dict[str, Any]:
    return {"at": None, "lo": None, "hi": None, "n": n, "no_estimate": why}
