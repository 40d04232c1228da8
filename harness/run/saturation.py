"""Watches a rate point or a ramp while it runs and says when to stop it as saturated
(the test is :func:`harness.analysis.capacity.saturation.saturation_check`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.analysis.capacity.saturation import ALPHA, EVERY, MIN_REQUESTS, saturation_check
from harness.core.records import RequestRecord

SATURATED = "saturated"


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
    ends: list[float] = field(default_factory=list)
    ttft_sends: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    e2es: list[float] = field(default_factory=list)
    verdict: dict[str, Any] | None = None
    asked: int = 0  # should_stop calls: one per send

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
        if self.verdict is None and self.asked >= self.min_requests and not self.asked % self.every:
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
        self.ends.append(rec.t_end)
        if rec.ttft is not None:
            self.ttft_sends.append(rec.t_send)
            self.ttfts.append(rec.ttft)
            self.e2es.append(rec.e2e)
        n = len(self.ends)
        if n < self.min_requests or (n - self.min_requests) % self.every:
            return
        self._look(rec.t_end)

    def _look(self, now: float) -> None:
        n = len(self.ends)
        sent = int(np.searchsorted(self.offsets, now - self.t0, side="right"))
        looks = 2 * max(1, math.ceil((self.offsets.size - self.min_requests) / self.every) + 1)
        found = saturation_check(
            self.t0 + self.offsets[:sent], self.ends, self.ttft_sends, self.ttfts, self.e2es, now,
            looks, self.alpha,
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
