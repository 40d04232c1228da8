"""Summaries of records: a run's counts, throughput and latency distributions, the peak in
flight, and the goodput rule (which latency --goodput and --slo judge). Every metric has one
definition here; markdown, plots, compare and the paired comparisons all call these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from harness.core.columns import RecordColumns, seq_sum
from harness.core.records import RequestRecord

PERCENTILES = (50, 90, 99)


def pkey(p: float) -> str:
    """The key of a percentile as vLLM bench serve writes it: p99, p99.9."""
    return f"p{int(p)}" if float(p).is_integer() else f"p{p:g}"


def distribution(
    values: Iterable[float | None] | np.ndarray, percentiles: Sequence[float] = PERCENTILES
) -> dict[str, float | None]:
    """mean, median, p90, p99 (and any other ``percentiles``: ``--metric-percentiles``), stdev
    of the non-missing values (None when there are none; NaN in an array is missing)."""
    ps = list(dict.fromkeys([*PERCENTILES, *percentiles]))
    if isinstance(values, np.ndarray):  # copied only where a value is missing
        xs = np.asarray(values, dtype=float)
        missing = np.isnan(xs)
        xs = xs[~missing] if missing.any() else xs
    else:
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
    """The most requests that were in flight at once, from send and end times (an end before
    a send at the same instant)."""
    cols = RecordColumns.of(records)
    return _peak(cols.t_send(), cols.t_end())


def _peak(sends: np.ndarray, ends: np.ndarray) -> int:
    """In flight just after each send (sorted): the sends so far less the ends by then (an end
    at the send's instant first); the count rises only at a send, so its peak is the peak."""
    sends, ends = np.sort(sends), np.sort(ends)
    after = np.arange(1, sends.size + 1) - np.searchsorted(ends, sends, side="right")
    return int(max(0, after.max(initial=0)))


def summarize(
    records: Sequence[RequestRecord],
    goodput: Mapping[str, float] | None = None,
    percentiles: Sequence[float] = PERCENTILES,
) -> dict[str, Any]:
    """The per-run summary: counts, throughput and latency distributions (warm-ups excluded),
    from the records' columns (:class:`RecordColumns`: a million requests in arrays)."""
    cols = RecordColumns.of(records)
    counted = ~cols.warmup()
    ok = counted & cols.ok()
    failed = counted & ~ok
    errors = cols.errors()
    out: dict[str, Any] = {
        "completed": int(ok.sum()),
        "failed": int(failed.sum()),
        "errors": _error_counts(errors.get(int(i)) for i in np.flatnonzero(failed)),
    }
    if not ok.any():
        return out
    t_send, t_end = cols.t_send(), cols.t_end()
    start = float(t_send[counted].min())
    end = float(t_end[counted].max())
    duration = end - start
    n_out = cols.output_tokens()
    out_tokens = int(n_out[ok].sum())
    in_tokens = int(np.maximum(cols.prompt_tokens()[ok], 0).sum())
    sends = t_send[counted & ~cols.not_sent()]  # what the client sent
    span = float(sends.max() - sends.min())
    n_ok = int(ok.sum())
    out.update(
        duration_s=duration,
        output_tokens=out_tokens,
        request_throughput=n_ok / duration if duration > 0 else None,
        output_tok_s=out_tokens / duration if duration > 0 else None,
        total_tok_s=(out_tokens + in_tokens) / duration if duration > 0 else None,
        achieved_rate=(sends.size - 1) / span if span > 0 else None,
        peak_in_flight=_peak(t_send[counted], t_end[counted]),
        mean_in_flight=seq_sum(t_end[counted] - t_send[counted]) / duration
        if duration > 0
        else None,
        ttft_s=distribution(cols.ttft()[ok], percentiles),
        tpot_s=distribution(cols.tpot()[ok], percentiles),
        itl_s=distribution(cols.itl(ok), percentiles),
        itl_per_token_s=distribution(cols.itl_per_token(ok), percentiles),
        e2e_s=distribution(cols.e2e()[ok], percentiles),
        mean_chunk_tokens=out_tokens / max(1, int(cols.n_chunks()[ok].sum())),
    )
    if goodput:
        good = ok & meets(cols, goodput)
        out["goodput"] = int(good.sum()) / duration if duration > 0 else None
    return out


def _error_counts(errors: Iterable[str | None]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for error in errors:
        kind = (error or "error").split(":")[0].strip()
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


# the same rule over columns (NaN: None)
_COLUMNS: dict[str, Callable[[RecordColumns], np.ndarray]] = {
    "ttft": RecordColumns.user_ttft,
    "tpot": RecordColumns.tpot,
    "e2e": RecordColumns.user_e2e,
}


def meets(cols: RecordColumns, slo_ms: Mapping[str, float]) -> np.ndarray:
    """Per record: every bound of ``slo_ms`` met (:data:`GOODPUT_METRICS`; a missing value
    meets its bound)."""
    good = np.ones(len(cols), dtype=bool)
    for name, ms in slo_ms.items():
        v = _COLUMNS[name](cols)
        good &= ~(v * 1000.0 > ms)  # NaN compares False: met
    return good
