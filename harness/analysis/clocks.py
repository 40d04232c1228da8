"""Whether the client workers' clocks were known well enough for the latencies they stamped.

Ray workers on other hosts stamp with their own monotonic clocks; the coordinator converts those
stamps with an offset estimated by round trips (harness.run.ray_clients), known to within
``uncertainty_s``. TTFT and E2E are differences of one worker's own stamps, so an offset error
moves a request's send time on the common time line, not its latency; but the schedule (who sent
when, send lag, load over time) is only as good as the offset. A run whose worst uncertainty is
more than ``SHARE`` of its median TTFT says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.core.results import Run

SHARE = 0.1  # of the run's median TTFT


def clock_warnings(runs: Sequence[Run], summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per run whose client workers' clock uncertainty exceeds SHARE of its TTFT."""
    out = []
    for run, summary in zip(runs, summaries):
        info = run.extra.get("client_workers") or run.engine_info.get("client_workers") or {}
        worst = info.get("max_uncertainty_s")
        ttft = (summary.get("ttft_s") or {}).get("median")
        if worst is None or not ttft or worst <= SHARE * ttft:
            continue
        out.append(
            f"{run.cell.name}: client workers' clock uncertainty {worst * 1e3:.1f} ms is more "
            f"than {SHARE:.0%} of the median TTFT ({ttft * 1e3:.1f} ms): send times across "
            "hosts are only that precise"
        )
    return out
