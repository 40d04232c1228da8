"""Watches a rate point or a ramp while it runs and says when to stop it as saturated
(the test is :func:`harness.analysis.capacity.saturation.saturation_check`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.analysis.capacity.saturation import ALPHA, EVERY, MIN_REQUESTS, saturation_check
from harness.core.records import NOT_SENT, RequestRecord

SATURATED = "saturated"
DENSE = 200  # requests up to which a point looks every EVERY (look_after)


@dataclass
class SaturationMonitor:
    """Fed every finished record; ``verdict`` is set (and stays) once the point saturated.
    ``offsets`` is the point's schedule (send offsets); ``start(t0)`` pins it to the clock."""

    offsets: np.ndarray
    clock: Callable[[], float] | None = None  # None: never watches (a closed loop, not asked)
    rates: np.ndarray | None = None  # a ramp's asked rate per request: the one it stopped at
    every: int = EVERY
    min_requests: int = MIN_REQUESTS
    alpha: float = ALPHA
    t0: float = math.nan
    verdict: dict[str, Any] | None = None
    asked: int = 0  # should_stop calls: one per send
    done: int = 0  # finished records seen
    streamed: int = 0  # ... of which streamed a token
    # per finished record, filled in place (the point's size is known): no copy per look
    _cols: np.ndarray = field(default_factory=lambda: np.zeros((4, 0)), repr=False)
    _next_ask: int = 0  # the send count of the next look (look_after)
    _next_done: int = 0  # the completion count of the next look
    _looks: int = 0  # planned_looks(), once

    def __post_init__(self) -> None:
        self._cols = np.zeros((4, self.offsets.size))  # ends; ttft sends, ttfts, e2es
        self._next_ask = self._next_done = self.min_requests
        self._looks = self.planned_looks()

    def look_after(self, n: int) -> int:
        """The count of the look after the one at ``n``: every ``every`` up to ``DENSE``, then
        every ``n / DENSE * every`` (a look's cost grows with n: spaced so, the looks cost a
        constant per request, and a point of up to ``DENSE`` requests looks as often as ever)."""
        return n + max(self.every, n * self.every // DENSE)

    def planned_looks(self) -> int:
        """Looks at most over the point (both schedules, sends and completions): the Bonferroni
        split of ``alpha``."""
        n, k, size = self.min_requests, 1, self.offsets.size
        while n < size:
            n, k = self.look_after(n), k + 1
        return 2 * k

    def start(self, t0: float) -> None:
        self.t0 = t0

    def should_stop(self) -> bool:
        """The runner's question before each send; its first call pins the schedule's start
        (the runner reads its start instant just before)."""
        if self.clock is None:
            return False
        if math.isnan(self.t0):
            self.t0 = self.clock()
        self.asked += 1
        if self.verdict is None and self.asked >= self._next_ask:
            self._next_ask = self.look_after(self.asked)
            self._look(self.clock())  # a look per few sends too: an overload may finish nothing
        return self.verdict is not None

    def outcome(self, status: str, extra: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The run's status and extra: "saturated: ..." with the evidence, when it was."""
        if self.verdict is None or status != "ok":
            return status, extra
        return self.status(), {**extra, "saturation": self.verdict}

    def watching(
        self, on_record: Callable[[RequestRecord], None]
    ) -> Callable[[RequestRecord], None]:
        """``on_record``, then :meth:`add`: the runner's one callback per finished record."""

        def both(rec: RequestRecord) -> None:
            on_record(rec)
            self.add(rec)

        return both

    @property
    def saturated(self) -> bool:
        return self.verdict is not None

    def add(self, rec: RequestRecord) -> None:
        if rec.warmup:  # the warm-up ran through the same runner: the measured run starts anew
            self.t0 = math.nan
            return
        if self.clock is None or self.verdict is not None or math.isnan(self.t0):
            return
        if rec.error == NOT_SENT:  # never sent: no completion of the server's to count
            return
        if self.done >= self._cols.shape[1]:  # more records than sends planned: grow
            self._cols = np.concatenate([self._cols, np.zeros((4, max(1, self.done)))], axis=1)
        self._cols[0, self.done] = rec.t_end
        self.done += 1
        if rec.ttft is not None:
            self._cols[1:, self.streamed] = (rec.t_send, rec.ttft, rec.e2e)
            self.streamed += 1
        if self.done < self._next_done:
            return
        self._next_done = self.look_after(self.done)
        self._look(rec.t_end)

    def _look(self, now: float) -> None:
        n, k = self.done, self.streamed
        sent = int(np.searchsorted(self.offsets, now - self.t0, side="right"))
        _, ttft_sends, ttfts, e2es = self._cols[:, :k]
        found = saturation_check(
            self.t0 + self.offsets[:sent], self._cols[0, :n], ttft_sends, ttfts, e2es, now,
            self._looks, self.alpha,
        )  # fmt: skip
        if found is not None:
            self.verdict = {**found, "completed": n, "sent": sent}
            if self.rates is not None and sent:
                self.verdict["request_rate_at_stop"] = float(self.rates[sent - 1])

    def status(self) -> str:
        v = self.verdict or {}
        return (
            f"{SATURATED}: stopped after {v.get('sent')} sent, {v.get('completed')} done "
            f"(in flight +{v.get('in_flight_slope_per_s', 0):.2f}/s, "
            f"TTFT +{v.get('ttft_slope_s_per_s', 0):.2f} s/s, "
            f"E2E +{v.get('e2e_slope_s_per_s', 0):.2f} s/s)"
        )


def monitor_for(
    plan: Any, strategy: Any, n: int, clock: Callable[[], float] | None
) -> SaturationMonitor:
    """A monitor for an open-loop point (a rate or a ramp) when the plan asks for one
    (``--detect-saturation``, a ramp, or a capacity search); else one that never watches."""
    asked = plan.detect_saturation or plan.slo or plan.ramp_up_strategy
    open_loop = hasattr(strategy, "rates") or getattr(strategy, "rate", math.inf) != math.inf
    if not (asked and open_loop):
        return SaturationMonitor(np.zeros(0))
    rates = np.asarray(strategy.rates(n), dtype=float) if hasattr(strategy, "rates") else None
    return SaturationMonitor(np.asarray(strategy.offsets(n), dtype=float), clock, rates)
