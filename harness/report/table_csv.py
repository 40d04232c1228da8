"""The per-point table as CSV (summary.csv): one line per configuration and point, raw numbers
(seconds, tokens/s, fractions) read from the stored analysis, for spreadsheets and pandas."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from typing import Any

from harness.report.markdown import points_of

# from the send; then from the schedule and the client queue (empty: a closed loop, no schedule)
LATENCIES = (
    "ttft_s", "tpot_s", "itl_s", "e2e_s",
    "ttft_from_schedule_s", "e2e_from_schedule_s", "client_queue_s",
)  # fmt: skip
SPEC = ("acceptance_rate", "alpha", "mean_acceptance_length", "tokens_per_target_pass")


def _percentile_keys(rows: list[Mapping[str, Any]]) -> list[str]:
    keys: dict[str, None] = {}
    for r in rows:
        for m in LATENCIES:
            for k in r["summary"].get(m) or {}:
                if k.startswith("p") or k in ("mean", "median"):
                    keys[k] = None
    return list(keys)


def to_csv(results: Mapping[str, Any]) -> str:
    """summary.csv's text: every stored row, with its deciding comparison."""
    rows = [r for point in points_of(results).values() for r in point]  # the tables' order
    comps = results.get("comparisons") or []
    stats = _percentile_keys(rows)
    head = [
        "engine", "variant", "mode", "concurrency", "request_rate", "max_new_tokens", "workload",
        "repeats", "completed", "failed", "output_tok_s", "request_throughput", "peak_in_flight",
        *(f"{m}_{k}" for m in LATENCIES for k in stats), *SPEC,
        "metric", "speedup", "ci_low", "ci_high", "n", "verdict", "baseline",
    ]  # fmt: skip
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(head)
    for r in rows:
        s, spec = r["summary"], r.get("spec") or {}
        c = comps[r["comparison"]] if r.get("comparison") is not None else {}
        w.writerow(
            [
                r["engine"],
                r["label"],
                r["mode"],
                r["load"].get("concurrency"),
                r["load"].get("request_rate"),
                r["max_new_tokens"],
                r["workload"],
                r["repeats"],
                s.get("completed"),
                s.get("failed"),
                s.get("output_tok_s"),
                s.get("request_throughput"),
                s.get("peak_in_flight"),
                *((s.get(m) or {}).get(k) for m in LATENCIES for k in stats),
                *(spec.get(k) for k in SPEC),
                c.get("metric"),
                c.get("estimate"),
                c.get("lo"),
                c.get("hi"),
                c.get("n"),
                c.get("verdict"),
                c.get("baseline"),
            ]  # fmt: skip
        )
    return buf.getvalue()
