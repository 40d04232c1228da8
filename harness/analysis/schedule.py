"""Latency as the user waits it: under an open loop (a rate, a ramp, a trace) each request is due
at its scheduled instant, and a client that falls behind (a busy event loop, a full
``--max-concurrency``, a slow client worker) sends it later. Latencies from the send leave that
wait out (coordinated omission); the ones from the schedule keep it. Both are summarised, the
wait itself (the client queue: schedule to send) is its own distribution, and a row whose two
clocks differ by more than :func:`threshold` says the client fell behind (the answer block warns,
naming the point). A closed loop (``--concurrency`` alone) has no schedule: every key is None.

The same split as vLLM bench serve's ``client_queue_time`` / ``e2el_including_client_queue`` and
GuideLLM's ``request_dispatch_delay`` / ``request_scheduled_latency``, with the due instant being
the schedule itself (``t0 + offset``), not the instant the client got round to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.analysis.summary import PERCENTILES, distribution
from harness.core.columns import RecordColumns
from harness.core.records import RequestRecord

SHARE = 0.05  # of the from-send p99: a smaller gap is the schedule's own jitter
FLOOR_S = 0.010  # ... and never less than this
KEYS = ("client_queue_s", "ttft_from_schedule_s", "e2e_from_schedule_s", "behind", "not_sent")


def threshold(p99_from_send: float) -> float:
    """The gap between the from-schedule and from-send p99 above which the client fell behind:
    the larger of SHARE of the from-send p99 and FLOOR_S."""
    return max(SHARE * p99_from_send, FLOOR_S)


def schedule_latencies(
    records: Sequence[RequestRecord], percentiles: Sequence[float] = PERCENTILES
) -> dict[str, Any]:
    """The summary's schedule keys (:data:`KEYS`) over the counted requests: the client queue
    (p50/p90/p99 and max), TTFT and E2E from the schedule, ``not_sent`` (requests due before a
    ``--duration`` run's end that the client never sent: :data:`NOT_SENT`), and ``behind``
    (the metric whose two clocks differ most beyond :func:`threshold`, and ``not_sent``; None
    when neither). All None without a schedule."""
    cols = RecordColumns.of(records)
    sched = cols.t_scheduled()
    due = ~cols.warmup() & ~np.isnan(sched)
    if not due.any():
        return dict.fromkeys(KEYS)
    not_sent = int((due & cols.not_sent()).sum())
    ok = due & cols.ok()
    out: dict[str, Any] = dict.fromkeys(KEYS)
    out["not_sent"] = not_sent
    worst: dict[str, Any] | None = None
    if ok.any():
        worst = _from_send_gap(cols, ok, sched, out, percentiles)
    if not_sent and worst is None:
        worst = {"metric": None, "client_queue_p99_s": (out["client_queue_s"] or {}).get("p99"),
                 "client_queue_max_s": (out["client_queue_s"] or {}).get("max")}  # fmt: skip
    out["behind"] = None if worst is None else {**worst, "not_sent": not_sent}
    return out


def _from_send_gap(
    cols: RecordColumns, ok: np.ndarray, sched: np.ndarray, out: dict[str, Any],
    percentiles: Sequence[float],
) -> dict[str, Any] | None:  # fmt: skip
    """Fills ``out``'s distributions over the records in ``ok``; returns the metric whose
    from-schedule p99 is above its from-send p99 by the most beyond :func:`threshold` (None:
    none is)."""
    queue = (cols.t_send() - sched)[ok]
    out["client_queue_s"] = {**distribution(queue, percentiles), "max": float(queue.max())}
    out["ttft_from_schedule_s"] = distribution((cols.first_chunk_t() - sched)[ok], percentiles)
    out["e2e_from_schedule_s"] = distribution((cols.t_end() - sched)[ok], percentiles)
    send = {
        "ttft": distribution(cols.ttft()[ok], percentiles),
        "e2e": distribution(cols.e2e()[ok], percentiles),
    }
    worst = None
    for m in ("ttft", "e2e"):
        a, b = send[m]["p99"], out[f"{m}_from_schedule_s"]["p99"]
        if a is None or b is None or b - a <= threshold(a):
            continue
        if worst is None or b - a > worst["difference_s"]:
            worst = {
                "metric": m,
                "p99_from_send_s": a,
                "p99_from_schedule_s": b,
                "difference_s": b - a,
                "threshold_s": threshold(a),
                "client_queue_p99_s": out["client_queue_s"]["p99"],
                "client_queue_max_s": out["client_queue_s"]["max"],
            }
    return worst


def behind_warnings(
    rows: Sequence[Mapping[str, Any]], where: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One warning (the answer block's shape, kind ``client behind``) per row whose client fell
    behind its schedule, naming the variant and the point."""
    out = []
    for r in rows:
        b = (r.get("summary") or {}).get("behind")
        if b:
            out.append(
                {"kind": "client behind", "name": r["name"], "point": r["point"],
                 **where.get(r["point"], {}), **b}
            )  # fmt: skip
    return out
