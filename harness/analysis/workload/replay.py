"""A trace replay's own checks, per run: how late each request went against its scheduled time
(a replay is only valid when the client keeps up), whether each got the input and output length
the trace asked for, and the prefix-cache hits the engine reported against the prefix the trace
shares (requests with equal leading hash ids).

The send lag of request i is its client queue (send minus its scheduled arrival, both on the
runner's clock: harness.analysis.schedule); in a file written before records kept the schedule,
``(t_send_i - t_send_first) - schedule_i`` (schedule_0 = 0): the runner sends the first request
at its start instant, so the first send is the schedule's origin to within one clock read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.analysis.pooled import point_key
from harness.analysis.summary import distribution
from harness.core.replay import TRACE
from harness.core.results import Run

LATE_MS = 10.0  # a send this late (or later) counts as late in the table


def replay_tables(
    runs: Sequence[Run],
    schedule: Sequence[float],
    asked: Mapping[str, tuple[int, int]],
    shared: Mapping[str, int],
) -> list[dict[str, Any]]:
    """One entry per replayed run. ``schedule[i]``: request ``str(i)``'s send offset (s);
    ``asked[id]``: its (input, output) tokens; ``shared[id]``: tokens it shares with the
    requests before it (workloads.trace.shared_prefix_tokens)."""
    out = []
    for run in runs:
        c = run.cell
        if c.load.get("arrivals") != TRACE:
            continue
        recs = [r for r in run.records if not r.warmup]
        entry: dict[str, Any] = {
            "name": f"{c.engine}/{c.label}",
            "point": point_key(c.mode, c.load, c.max_new_tokens, c.workload),
            "repeat": c.repeat,
            "scheduled": len(schedule),
            "sent": len(recs),
            "send_lag_ms": distribution([]),
            "late": 0,
        }
        lags: dict[str, float] = {}
        if recs:
            first = min(r.t_send for r in recs)
            for r in recs:
                if r.client_queue is not None:
                    lags[r.request_id] = r.client_queue * 1000.0
                elif r.request_id.isdigit() and int(r.request_id) < len(schedule):
                    due = schedule[int(r.request_id)]
                    lags[r.request_id] = (r.t_send - first - due) * 1000.0
        entry["send_lag_ms"] = distribution(lags.values())
        entry["late"] = sum(v >= LATE_MS for v in lags.values())
        entry["send_lag_ms_by_request"] = lags
        ok = [r for r in recs if r.ok and r.request_id in asked]
        entry["input_as_asked"] = sum(r.prompt_tokens == asked[r.request_id][0] for r in ok)
        entry["output_as_asked"] = sum(r.output_tokens == asked[r.request_id][1] for r in ok)
        entry["ok"] = len(ok)
        entry["prefix_cache"] = _cache(run, recs, shared)
        out.append(entry)
    return out


def _cache(run: Run, recs: Sequence[Any], shared: Mapping[str, int]) -> dict[str, Any] | None:
    """The run's prefix-cache hits against the trace's shared prefix; with the engine's KV block
    size (``engine_info.kv_block_size``) also the hits a cache that evicts nothing would give:
    each request's shared tokens rounded down to whole blocks, at most its prompt less one
    token (vLLM computes at least the last one), and whether the hits lie within one block
    per request of the shared prefix."""
    cache = run.extra.get("prefix_cache") if run.extra else None
    if not isinstance(cache, Mapping) or "hits" not in cache:
        return None
    block = (run.engine_info or {}).get("kv_block_size")
    expect = sum(shared.get(r.request_id, 0) for r in recs)
    out: dict[str, Any] = {
        "hits": cache["hits"],
        "queries": cache.get("queries"),
        "trace_shared_tokens": expect,
        "hits_minus_shared": cache["hits"] - expect,
        "kv_block_size": block,
        "expected_hits": None,
        "within_block_size": None,
        "policy": run.schedule.cache if run.schedule is not None else None,
    }
    if isinstance(block, int) and block > 0:
        whole = 0
        for r in recs:
            n = r.prompt_tokens or 0
            whole += (min(shared.get(r.request_id, 0), max(n - 1, 0)) // block) * block
        out["expected_hits"] = whole
        out["within_block_size"] = expect - len(recs) * block <= cache["hits"] <= expect
    return out
