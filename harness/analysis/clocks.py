"""Whether the client workers' clocks were known well enough for the latencies they stamped.

Ray workers on other hosts stamp with their own monotonic clocks; the coordinator converts those
stamps with an offset estimated by round trips (harness.run.clients.ray_actors), known to within
``uncertainty_s``. TTFT and E2E are differences of one worker's own stamps, so an offset error
moves a request's send time on the common time line, not its latency; but the schedule (who sent
when, send lag, load over time) is only as good as the offset. A run whose worst uncertainty is
more than ``SHARE`` of its median TTFT says so.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from harness.core.results import Run

SHARE = 0.1  # of the run's median TTFT


def clock_warnings(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """One warning (the answer block's shape, kind ``clock``) per run whose client workers'
    clock uncertainty exceeds SHARE of its median TTFT."""
    out = []
    for run in runs:
        info = run.extra.get("client_workers") or run.engine_info.get("client_workers") or {}
        worst = info.get("max_uncertainty_s")
        if worst is None:
            continue
        ttfts = [r.ttft for r in run.records if r.counted and r.ttft is not None]
        if not ttfts:
            continue
        ttft = statistics.median(ttfts)
        if worst > SHARE * ttft:
            out.append(
                {
                    "kind": "clock",
                    "name": run.cell.name,
                    "uncertainty_s": worst,
                    "ttft_s": ttft,
                    "share": SHARE,
                }  # fmt: skip
            )
    return out
