"""Over-saturation: whether the system under test no longer keeps up with the offered load
(GuideLLM's over-saturation idea: requests in flight and TTFT both trending up).

Below its service rate a server's queue is stationary: the requests in flight and the TTFT
fluctuate around a level. Above it arrivals outpace completions, so both grow linearly with
time and a latency measured there only measures how long the point ran. The test is
sequential (a look every few completions), so its false-alarm rate is bounded by spending
``alpha`` over the looks (Bonferroni) and by asking for an effect, not only a significant
slope: over the recent half of the point, completions must fall short of arrivals by
``DEFICIT`` of them (and 4 requests) and the TTFT must grow by ``GROWTH`` of the median E2E. A stationary
queue's autocorrelation inflates a slope's t; the effect floor is what keeps the alarms rare.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

GROWTH = 0.5  # TTFT growth over the window, relative to the median E2E, that counts
DEFICIT = 0.2  # arrivals in the window that completions did not match, as a share of them
STARVED = 0.3  # the in-flight growth alone counts with this share of the arrivals unmatched
MIN_DEFICIT = 10  # ... and at least this many requests
MIN_REQUESTS = 40  # requests (finished, or sent) before the first look
EVERY = 5  # completions between looks
FIRST = 10  # the first requests sent: their E2E is the service time before any queue
SPAN_E2E = 1.5  # the window must be this many median E2Es long (past the queue's filling)
ALPHA = 0.01  # the false-alarm budget of one point, spent over its looks


def slope_t(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """OLS slope of ``y`` on ``x`` and its t statistic (0, 0 when undefined)."""
    n = x.size
    if n < 4:
        return 0.0, 0.0
    xc = x - x.mean()
    sxx = float(xc @ xc)
    if sxx <= 0:
        return 0.0, 0.0
    b = float(xc @ (y - y.mean())) / sxx
    resid = y - y.mean() - b * xc
    s2 = float(resid @ resid) / (n - 2)
    if s2 <= 0:
        return b, math.inf if b > 0 else -math.inf if b < 0 else 0.0
    return b, b / math.sqrt(s2 / sxx)


def critical_t(looks: int, alpha: float = ALPHA) -> float:
    """The one-sided bound each look must pass: the (1 - alpha/looks) normal quantile."""
    return NormalDist().inv_cdf(1.0 - alpha / max(looks, 1))


def saturation_check(
    sends: Sequence[float],
    ends: Sequence[float],
    ttft_sends: Sequence[float],
    ttfts: Sequence[float],
    e2es: Sequence[float],
    now: float,
    looks: int,
    alpha: float = ALPHA,
) -> dict[str, Any] | None:
    """One look: ``sends`` the send times so far, ``ends`` the end times of the requests done
    by ``now``; ``ttft_sends``, ``ttfts``, ``e2es`` the send time, TTFT and E2E of each of those
    that streamed a token. Returns the evidence when saturated, else None.

    A look needs a window of ``SPAN_E2E`` times the median E2E of the first ``FIRST`` requests
    sent (half of them finished): the service time before any queue. A queue filling from empty
    grows like an overloaded one for about one service time (Little's law); the shortest E2Es
    (early EOS) would understate it.

    In flight: over the recent half of the point's time (past the queue's fill from empty), its
    slope significant and rising third by third, and the arrivals there outpacing the
    completions by >= max(MIN_DEFICIT, DEFICIT x the arrivals): a stationary queue's in flight
    wanders by a bounded count, an overloaded one's grows with the window. Latency: over the
    recent half of the finished requests (in send order), TTFT's or E2E's slope significant and
    its growth >= GROWTH x the median E2E there (a stationary queue's wanders by less). E2E
    counts because a batching server under overload admits every request (TTFT stays low) and
    slows them all down instead, and the few that finish then are the short ones (no trend): so
    the in-flight evidence alone also decides where ``STARVED`` of the window's arrivals are
    unmatched (and where too few finished to fit a trend)."""
    s = np.sort(np.asarray(sends, dtype=float))
    s = s[s <= now]
    if s.size < 8:
        return None
    done = np.sort(np.asarray(ends, dtype=float))
    in_flight = np.arange(1, s.size + 1) - np.searchsorted(done, s, side="right")
    start = s[0] + (now - s[0]) / 2
    w = s >= start
    span = now - start
    x, q = s[w], in_flight[w].astype(float)
    order = np.argsort(np.asarray(ttft_sends, dtype=float), kind="stable")
    tx = np.asarray(ttft_sends, dtype=float)[order]
    ty = np.asarray(ttfts, dtype=float)[order]
    te = np.asarray(e2es, dtype=float)[order]
    half = tx.size // 2
    tx, ty, te = tx[half:], ty[half:], te[half:]
    sent_first = np.asarray(ttft_sends, dtype=float) <= s[min(FIRST, s.size) - 1]
    first = np.asarray(e2es, dtype=float)[sent_first]  # the first sent that finished
    if x.size < 6 or first.size < FIRST // 2 or span < SPAN_E2E * float(np.median(first)):
        return None  # the queue may still be filling: a window of a few service times, or wait
    arrived = int(w.sum())
    deficit = arrived - int(np.count_nonzero(done >= start))  # arrivals not matched by completions
    crit = critical_t(looks, alpha)
    if tx.size < 6 or tx[-1] <= tx[0]:  # (almost) nothing finishes: the in flight alone
        bq, tq = slope_t(x, in_flight[w].astype(float))
        if tq > crit and deficit >= max(2 * MIN_DEFICIT, STARVED * arrived):
            return {"in_flight_slope_per_s": bq, "arrivals_unmatched": deficit,
                    "arrivals": arrived, "in_flight_t": tq, "critical_t": crit,
                    "window_s": float(span)}  # fmt: skip
        return None
    bq, tq = slope_t(x, q)
    bt, tt = slope_t(tx, ty)
    be, t_e = slope_t(tx, te)
    crit2 = critical_t(2 * looks, alpha)  # TTFT or E2E: two tests at each look
    thirds = [float(part.mean()) for part in np.array_split(q, 3)]
    rising = thirds[0] < thirds[1] < thirds[2]
    grows_q = tq > crit and rising and deficit >= max(MIN_DEFICIT, DEFICIT * arrived)
    scale, span_t = GROWTH * float(np.median(te)), tx[-1] - tx[0]
    grows_t = tt > crit2 and bt * span_t >= scale
    grows_e = t_e > crit2 and be * span_t >= scale
    starved = deficit >= max(2 * MIN_DEFICIT, STARVED * arrived)  # the growth alone
    if not (grows_q and (grows_t or grows_e or starved)):
        return None
    return {
        "in_flight_slope_per_s": bq,
        "arrivals_unmatched": deficit,
        "arrivals": arrived,
        "in_flight_t": tq,
        "ttft_slope_s_per_s": bt,
        "ttft_t": tt,
        "e2e_slope_s_per_s": be,
        "e2e_t": t_e,
        "critical_t": crit,
        "window_s": float(span),
    }
