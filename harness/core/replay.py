"""Trace replay as a load strategy: each request goes at its own time from the trace file.

Open loop, like a request rate, but the gaps are the trace's (bursts included), the same
schedule for every variant of a comparison. The schedule is the workload's (each request's
``send_s``, already scaled by the trace's time scale: :mod:`workloads.trace`); the runner does
the waiting, and the analysis measures how late each send was (harness.analysis.workload.replay).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

TRACE = "trace"  # the ``arrivals`` value of a replay's load


@dataclass(frozen=True)
class TraceReplay:
    """Send request ``i`` at ``schedule[i]`` seconds after the start; optionally capped in
    flight (``max_concurrency``: a request that finds the cap full goes late, and says so in
    its send lag)."""

    open_loop: ClassVar[bool] = True
    schedule: tuple[float, ...]
    time_scale: float = 1.0
    max_concurrency: int | None = None

    def offsets(self, n: int) -> list[float]:
        """The first ``n`` times; beyond the trace (a warm-up never asks for more), the last."""
        if not self.schedule:
            return [0.0] * n
        last = self.schedule[-1]
        return [self.schedule[i] if i < len(self.schedule) else last for i in range(n)]

    def to_json(self) -> dict[str, Any]:
        """The load as recorded in every cell (the schedule itself is the plan's)."""
        return {
            "arrivals": TRACE,
            "time_scale": self.time_scale,
            "requests": len(self.schedule),
            "concurrency": self.max_concurrency,
        }

    @property
    def label(self) -> str:
        cap = f", cap {self.max_concurrency}" if self.max_concurrency else ""
        span = self.schedule[-1] if self.schedule else 0.0
        return f"trace replay ({len(self.schedule)} requests over {span:.1f} s{cap})"
