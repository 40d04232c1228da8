"""Each configuration's latency distributions at one point as quantiles (results.json
``distributions``): what the report's TTFT/TPOT/ITL/E2E plots draw, of bounded size however many
requests ran, so `harness report` redraws them from the stored file alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.analysis.pooled import point_key
from harness.core.columns import RecordColumns
from harness.core.results import Run, group_runs

LEVELS = tuple(i / 100 for i in range(101))  # 0 (min), 0.01, ..., 1 (max)
METRICS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")


def _values(runs: Sequence[Run]) -> dict[str, np.ndarray]:
    cols = RecordColumns.join(run.records for run in runs)
    counted = cols.counted()
    ttft, tpot = cols.ttft()[counted], cols.tpot()[counted]
    return {
        "ttft_s": ttft[~np.isnan(ttft)],
        "tpot_s": tpot[~np.isnan(tpot)],
        "itl_s": cols.itl(counted),  # per chunk, as vLLM's ITL
        "e2e_s": cols.e2e()[counted],
    }


def distributions(runs: Sequence[Run]) -> dict[str, Any]:
    """``levels`` (shared) and, per configuration and point, each metric's quantiles at those
    levels in seconds (None when it has no value) with its ``n``, in the rows' order."""
    series = []
    for (engine, label, *_), rs in group_runs(runs).items():
        c = rs[0].cell
        entry: dict[str, Any] = {
            "name": f"{engine}/{label}",
            "point": point_key(c.mode, c.load, c.max_new_tokens, c.workload),
            "n": {},
        }
        for metric, xs in _values(rs).items():
            entry["n"][metric] = int(xs.size)
            entry[metric] = (
                [float(f"{q:.6g}") for q in np.quantile(xs, LEVELS)] if xs.size else None
            )
        series.append(entry)
    return {"levels": list(LEVELS), "metrics": list(METRICS), "series": series}
