"""Capacity under an SLO: the highest request rate at which a variant still meets
``--slo ttft:MS tpot:MS [e2e:MS]`` at ``--slo-quantile`` (each metric's quantile under its
bound), the search that finds it with few probed rates, and the paired ratio of two variants'
capacities with a CI.

A probe is one run: one variant at one rate, one repeat. Its *margin* is
``max over metrics of log(quantile / bound)``: <= 0 where the SLO holds; it grows with the rate,
so a variant's capacity is where its margin crosses 0. The search brackets that crossing by
doubling (x4 while far inside the SLO; or halving) the rate, then narrows the widest bracket at
the rate where the line between its margins crosses 0 (regula falsi in log rate, kept at least
``CLAMP`` of the bracket from its ends); every variant runs at every probed rate, interleaved,
so drift falls on all alike. Per repeat ``b`` (the unit, as in :mod:`harness.analysis.comparisons.stats`),
the capacity is where the line through that repeat's margins at the bracket's two rates crosses
0; the CI is a t-interval over repeats of the log capacity, and the ratio candidate / baseline
pairs the repeats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.analysis.comparisons.stats import compare_log_ratios, log_ratio_ci
from harness.analysis.summary import FROM_SEND, GOODPUT_METRICS
from harness.core.records import NOT_SENT
from harness.core.results import Run

SATURATED_MARGIN = math.log(2.0)  # a saturated probe fails: its margin is at least this
TOLERANCE = 0.05  # bisect until every bracket's hi / lo <= 1 + this
RATE_LIMITS = (1e-3, 1e5)  # the search stops expanding beyond these (req/s)
METHOD = "t on per-repeat log capacities"
FAR_MARGIN = math.log(0.5)  # every variant's quantiles under half their bound: far from it
FAR_FACTOR = 4  # ... then the rate grows this much per probe instead of doubling
CLAMP = 0.3  # the next rate inside a bracket: at least this share of its log width from an end


def margin_of(quantiles: Mapping[str, float | None], slo_ms: Mapping[str, float]) -> float:
    """max over the SLO's metrics of log(quantile / bound); +inf where a metric is missing."""
    out = -math.inf
    for name, ms in slo_ms.items():
        v = quantiles.get(name)
        if v is None or v <= 0:
            return math.inf if v is None else out
        out = max(out, math.log(v * 1000.0 / ms))
    return out


def _quantile(rs: Sequence[Any], metric: Any, q: float) -> float | None:
    xs = np.array([v for r in rs if (v := metric(r)) is not None], dtype=float)
    return float(np.quantile(xs, q)) if xs.size else None


def probe_entry(run: Run, slo_ms: Mapping[str, float], q: float) -> dict[str, Any] | None:
    """One run as a probe: its rate, margin, SLO attainment (the smallest share of requests
    meeting one metric's bound), quantiles (s), and whether it saturated. None: not a rate.
    The margin judges latency as the user waits it (from the schedule: GOODPUT_METRICS);
    ``margin_from_send`` is the one a client that fell behind would have claimed, and
    ``client_queue_s`` the schedule-to-send wait at the quantile (harness.analysis.schedule).
    A request due that the client never sent (``not_sent``) misses every bound from the
    schedule (an infinite latency); from the send it is left out, as such a client would."""
    rate = run.cell.load.get("request_rate")
    if rate is None or not (run.status == "ok" or run.status.startswith("saturated")):
        return None
    rs = run.counted
    # due but never sent (harness.core.records.NOT_SENT): a miss of every bound from the schedule
    missed = sum(r.error == NOT_SENT for r in run.records if not r.warmup)
    quant: dict[str, float | None] = {}
    shares = []
    for name in ("ttft", "tpot", "e2e"):
        xs = [v for r in rs if (v := GOODPUT_METRICS[name](r)) is not None]
        xs = np.array(xs + [math.inf] * missed, dtype=float)
        with np.errstate(invalid="ignore"):  # inf - inf between two unsent: nan
            v = float(np.quantile(xs, q)) if xs.size else math.nan
        quant[name] = v if math.isfinite(v) else None  # None: among the unsent (margin inf)
        if name in slo_ms:
            shares.append(float(np.mean(xs * 1000.0 <= slo_ms[name])) if xs.size else 0.0)
    saturated = run.status.startswith("saturated")
    m = margin_of(quant, slo_ms)
    sent = margin_of({k: _quantile(rs, f, q) for k, f in FROM_SEND.items()}, slo_ms)
    return {
        "variant": f"{run.cell.engine}/{run.cell.label}",
        "rate": float(rate),
        "repeat": run.cell.repeat,
        "margin": max(m, SATURATED_MARGIN) if saturated else m,
        "margin_from_send": max(sent, SATURATED_MARGIN) if saturated else sent,
        "client_queue_s": _quantile(rs, lambda r: r.client_queue, q),
        "attainment": min(shares) if shares else None,
        "quantiles_s": quant,
        "saturated": saturated,
        "n": len(rs),
        "not_sent": missed,
    }


def _means(probes: Sequence[Mapping[str, Any]], variant: str) -> dict[float, float]:
    """Per rate: the mean margin over repeats; at least SATURATED_MARGIN where half or more of
    the repeats saturated (the rate is not sustained, whatever the other repeats measured)."""
    by: dict[float, list[Mapping[str, Any]]] = {}
    for p in probes:
        if p["variant"] == variant:
            by.setdefault(p["rate"], []).append(p)
    out = {}
    for r, ps in sorted(by.items()):
        m = float(np.mean([min(p["margin"], 50.0) for p in ps]))
        out[r] = max(m, SATURATED_MARGIN) if 2 * sum(p["saturated"] for p in ps) >= len(ps) else m
    return out


def bracket(probes: Sequence[Mapping[str, Any]], variant: str) -> tuple[float | None, float | None]:
    """(lo, hi): the lowest rate whose mean margin fails (>= 0) and the highest below it that
    holds; None where no probed rate fails (hi) or none below the failing one holds (lo)."""
    means = _means(probes, variant)
    hi = next((r for r, m in means.items() if m >= 0), None)
    held = [r for r, m in means.items() if m < 0 and (hi is None or r < hi)]
    return (max(held) if held else None), hi


def next_rate(
    probes: Sequence[Mapping[str, Any]],
    variants: Sequence[str],
    start: float,
    max_probes: int,
    tol: float = TOLERANCE,
) -> float | None:
    """The next rate to probe (every variant), or None when every capacity is bracketed to
    ``tol`` or ``max_probes`` rates were probed."""
    rates = sorted({p["rate"] for p in probes})
    if not rates:
        return start
    if len(rates) >= max_probes:
        return None
    spans = []
    for v in variants:
        lo, hi = bracket(probes, v)
        if hi is None:  # x4 while every variant is far inside the SLO at the top rate
            top = max(_means(probes, w).get(rates[-1], 0.0) for w in variants)
            r = rates[-1] * (FAR_FACTOR if top < FAR_MARGIN else 2)
            return r if r <= RATE_LIMITS[1] else None
        if lo is None:
            r = rates[0] / 2
            return r if r >= RATE_LIMITS[0] else None
        spans.append((hi / lo, lo, hi, v))
    ratio, lo, hi, v = max(spans)
    if ratio <= 1 + tol:
        return None
    means = _means(probes, v)  # where the line between the bracket's margins crosses 0 ...
    share = -means[lo] / (min(means[hi], 50.0) - means[lo])
    share = min(max(share, CLAMP), 1 - CLAMP)  # ... kept off its ends: it shrinks every time
    return math.exp(math.log(lo) + share * math.log(hi / lo))


def _per_repeat(
    probes: Sequence[Mapping[str, Any]], variant: str, lo: float, hi: float
) -> dict[int, float]:
    """Per repeat: the log rate where the line through that repeat's margins at ``lo`` and
    ``hi`` crosses 0 (its own slope, so that the slope's noise is in the spread over repeats;
    the pooled one where a repeat's is not positive), kept within one bracket width of it: at
    a cliff (saturation) a repeat that held at both rates has a slope near 0 and would put its
    crossing anywhere."""
    means = _means(probes, variant)
    x0, x1 = math.log(lo), math.log(hi)
    slope = (means[hi] - means[lo]) / (x1 - x0)
    at: dict[int, dict[float, float]] = {}
    for p in probes:
        if p["variant"] == variant and p["rate"] in (lo, hi):
            at.setdefault(p["repeat"], {})[p["rate"]] = min(p["margin"], 50.0)
    out = {}
    for b, m in at.items():
        m_lo, m_hi = m.get(lo, means[lo]), m.get(hi, means[hi])  # a side not run: pooled
        own = (m_hi - m_lo) / (x1 - x0)
        x = x0 - m_lo / (own if own > 0 else slope)
        width = x1 - x0  # a repeat that held (or failed) at both ends: one bracket beyond at most
        out[b] = min(max(x, x0 - width), x1 + width)
    return out


def capacities(
    probes: Sequence[Mapping[str, Any]], variants: Sequence[str], min_effect: float
) -> dict[str, Any]:
    """Each variant's capacity with its CI, and every variant's ratio over the first (the
    baseline) with a CI and verdict, paired by repeat."""
    per: dict[str, dict[int, float]] = {}
    rows = []
    for v in variants:
        lo, hi = bracket(probes, v)
        row: dict[str, Any] = {"variant": v, "bracket": [lo, hi], "method": METHOD}
        if lo is None or hi is None:
            rates = sorted(p["rate"] for p in probes if p["variant"] == v)
            row.update(
                capacity=None, lo=None, hi=None, n=0,
                status="holds at every probed rate" if hi is None else "fails at every probed rate",
                bound=(rates[-1] if hi is None else rates[0]) if rates else None,
            )  # fmt: skip
        else:
            per[v] = _per_repeat(probes, v, lo, hi)
            logs = np.array(list(per[v].values()), dtype=float)
            est, clo, chi = (float(x) for x in log_ratio_ci(logs))
            row.update(
                capacity=est, lo=None if math.isnan(clo) else clo,
                hi=None if math.isnan(chi) else chi, n=int(logs.size), status="bracketed",
            )  # fmt: skip
        rows.append(row)
    ratios = []
    base = variants[0] if variants else None
    for v in variants[1:]:
        if base not in per or v not in per:
            continue
        common = sorted(per[base].keys() & per[v].keys())
        d = [per[v][b] - per[base][b] for b in common]
        comp = compare_log_ratios("capacity", d, min_effect).to_json()
        comp["method"] = "t on per-repeat log capacity ratios"
        ratios.append({"baseline": base, "candidate": v, **comp})
    return {"variants": rows, "ratios": ratios}


def capacity_analysis(
    runs: Sequence[Run], slo_ms: Mapping[str, float], q: float, min_effect: float
) -> dict[str, Any]:
    """results.json's ``capacity``: the SLO, every probe, each variant's capacity and the
    ratios (:func:`capacities`), and the crossover by rate."""
    from harness.analysis.capacity.crossover import rate_crossover

    probes = [e for r in runs if (e := probe_entry(r, slo_ms, q)) is not None]
    variants = list(dict.fromkeys(p["variant"] for p in probes))
    caps = capacities(probes, variants, min_effect)
    return {
        "slo_ms": dict(slo_ms),
        "quantile": q,
        "probes": probes,
        "curves": [_curve(probes, v) for v in variants],
        **caps,
        "crossover": rate_crossover(probes, variants),
        "from_send": from_send(probes, caps["variants"], min_effect),
    }


def _higher(send: Mapping[str, Any], sched: Mapping[str, Any]) -> bool:
    """Whether the capacity from the send is above the one from the schedule (beyond the
    search's TOLERANCE, or held where the schedule's failed)."""
    if send["status"] == "holds at every probed rate":
        return sched["status"] != "holds at every probed rate"
    if send["capacity"] is None:  # fails at every probed rate
        return False
    if sched["capacity"] is None:
        return sched["status"] == "fails at every probed rate"
    return send["capacity"] > sched["capacity"] * (1 + TOLERANCE)


def from_send(
    probes: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]], min_effect: float
) -> dict[str, Any]:
    """The capacities judged on the latencies from the send (``margin_from_send``) over the same
    probes: what a client that fell behind its schedule would have claimed. ``behind``: each
    variant whose capacity from the send is higher than from the schedule (``rows``), with the
    reason: its client queue at the SLO's quantile at the lowest rate that the schedule failed
    and the send held."""
    variants = [r["variant"] for r in rows]
    sent = [{**p, "margin": p["margin_from_send"]} for p in probes if "margin_from_send" in p]
    send_rows = capacities(sent, variants, min_effect)["variants"]
    behind = []
    for sched, send in zip(rows, send_rows):
        v = sched["variant"]
        if not _higher(send, sched):
            continue
        split = [p for p in probes if p["variant"] == v]
        rates = sorted(
            r for r in {p["rate"] for p in split}
            if np.mean([p["margin"] for p in split if p["rate"] == r]) >= 0
            and np.mean([p["margin_from_send"] for p in split if p["rate"] == r]) < 0
        )  # fmt: skip
        at = rates[0] if rates else None
        queue = [p["client_queue_s"] for p in split if p["rate"] == at and p["client_queue_s"]]
        behind.append(
            {
                "variant": v,
                "capacity_from_schedule": sched["capacity"],
                "capacity_from_send": send["capacity"],
                "status_from_send": send["status"],
                "bound_from_send": send.get("bound"),
                "rate": at,
                "client_queue_s": float(np.mean(queue)) if queue else None,
            }
        )
    return {"variants": send_rows, "behind": behind}


def _curve(probes: Sequence[Mapping[str, Any]], variant: str) -> dict[str, Any]:
    """Per probed rate: the mean SLO attainment over repeats, the margin the search used
    (:func:`_means`), and how many saturated (what the attainment-vs-rate plot draws)."""
    by: dict[float, list[Mapping[str, Any]]] = {}
    for p in probes:
        if p["variant"] == variant:
            by.setdefault(p["rate"], []).append(p)
    points, means = [], _means(probes, variant)
    for rate, ps in sorted(by.items()):
        att = [p["attainment"] for p in ps if p["attainment"] is not None]
        points.append(
            {
                "rate": rate,
                "attainment": float(np.mean(att)) if att else None,
                "margin": means[rate],
                "runs": len(ps),
                "saturated": sum(bool(p["saturated"]) for p in ps),
            }
        )
    return {"variant": variant, "points": points}
