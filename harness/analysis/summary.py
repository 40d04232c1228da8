"""Summaries of records: a run's counts, throughput and latency distributions, the peak in
flight, and the goodput rule (which latency --goodput and --slo judge). Every metric has one
definition here; markdown, plots, compare and the paired comparisons all call these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
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
