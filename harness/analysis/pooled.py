"""One configuration at one point of the plan, its repeats pooled: the numbers a table row shows
(median over repeats, pooled latency distributions, speculative counters summed, tokens per
target pass). Computed once by :mod:`harness.analysis.derived` and stored in results.json."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.analysis.comparisons.stats import instability, median
from harness.analysis.sanity import sanity
from harness.analysis.schedule import schedule_latencies
from harness.analysis.summary import PERCENTILES, summarize
from harness.core.columns import RecordColumns, seq_sum
from harness.core.results import Run

UNSTABLE = 0.10  # pyperf warns when repeats spread over 10% (stdev / median)


def point_key(mode: str, load: Mapping[str, Any], max_new_tokens: int, workload: str) -> str:
    """A point of the plan as one string (the same for every configuration run there)."""
    load_s = ",".join(f"{k}={v}" for k, v in sorted(load.items()) if v is not None)
    return f"{mode}/{load_s}/{max_new_tokens}/{workload}"


def spec_totals(runs: Sequence[Run]) -> dict[str, Any] | None:
    """Speculative counters summed over repeats, rates recomputed from the sums, and the target
    passes: counted by the engine, else the larger of two lower bounds, the streamed chunks
    (one per engine step, unless a stream merges steps) and output tokens - accepted tokens
    (each pass yields its accepted tokens plus one; vLLM also counts accepted tokens that
    max_tokens then cuts off)."""
    ms = [r.spec_metrics for r in runs if r.spec_metrics]
    if not ms:
        return None
    drafts = sum(m["num_drafts"] for m in ms)
    dt = sum(m["num_draft_tokens"] for m in ms)
    acc = sum(m["num_accepted_tokens"] for m in ms)
    n = max(len(m.get("accepted_per_pos") or []) for m in ms)
    pos = [sum(_at(m.get("accepted_per_pos") or [], i) for m in ms) for i in range(n)]
    # the counters' window: every request of the run after the warm-ups (failed ones too)
    window = RecordColumns.join(run.records for run in runs if run.spec_metrics)
    measured = ~window.warmup()
    out_tokens = int(window.output_tokens()[measured].sum())
    chunks = int(window.n_chunks()[measured].sum())
    counted = [m.get("target_passes") for m in ms]
    if all(p is not None for p in counted):
        passes, source = sum(counted), "counted by the engine"
    else:  # two lower bounds of the passes that produced tokens; the larger is the closer
        by_counters = out_tokens - acc  # accepted tokens cut off by max_tokens are counted too
        passes = max(chunks, by_counters)  # a stream may merge two steps' tokens into a chunk
        source = "stream chunks" if chunks >= by_counters else "output - accepted tokens"
    return {
        "num_drafts": drafts,
        "num_draft_tokens": dt,
        "num_accepted_tokens": acc,
        "acceptance_rate": acc / dt if dt else None,
        "mean_acceptance_length": 1 + acc / drafts if drafts else None,
        "alpha": pos[0] / drafts if drafts and pos else None,
        "acceptance_per_pos": [x / drafts for x in pos] if drafts else [],
        "output_tokens": out_tokens,
        "target_passes": passes,
        "target_passes_source": source,
        "tokens_per_target_pass": out_tokens / passes if passes else None,
        "stream_chunks": chunks,
        "tokens_per_chunk": out_tokens / chunks if chunks else None,
    }


def _at(xs: Sequence[int], i: int) -> int:
    return xs[i] if i < len(xs) else 0


def decode_time(runs: Sequence[Run]) -> dict[str, float] | None:
    """Time after the first token and tokens after the first, summed over counted requests:
    the basis of the time per target pass that the theory's cost ratio c comes from."""
    cols = RecordColumns.join(run.records for run in runs)
    ttft = cols.ttft()
    has = cols.counted() & ~np.isnan(ttft)
    if not has.any():
        return None
    return {
        "requests": float(has.sum()),
        "seconds": seq_sum(cols.e2e()[has] - ttft[has]),
        "tokens": float((cols.output_tokens()[has] - 1).sum()),
    }


def pooled(
    runs: list[Run],
    per_run: Sequence[Mapping[str, Any]],
    goodput: Mapping[str, float] | None = None,
    percentiles: Sequence[float] = PERCENTILES,
) -> dict[str, Any]:
    """The row of one configuration at one point: ``summary`` (repeats pooled; ``per_run``: each
    run's own summary, for the medians over repeats), ``spec``, ``sanity``, the repeats used."""
    c = runs[0].cell
    records = RecordColumns.join(run.records for run in runs)
    s = summarize(records, goodput, percentiles) | schedule_latencies(records, percentiles)
    per_rep = [x for x in (p.get("output_tok_s") for p in per_run) if x is not None]
    s["output_tok_s_runs"] = per_rep
    s["output_tok_s"] = median(per_rep)
    s["instability"] = instability(per_rep)
    s["unstable"] = s["instability"] is not None and s["instability"] > UNSTABLE
    for key in ("achieved_rate", "peak_in_flight", "mean_in_flight"):  # median over repeats
        xs = [v for p in per_run if (v := p.get(key)) is not None]
        s[key] = median(xs)
    return {
        "name": f"{c.engine}/{c.label}",
        "engine": c.engine,
        "label": c.label,
        "mode": c.mode,
        "load": dict(c.load),
        "max_new_tokens": c.max_new_tokens,
        "workload": c.workload,
        "point": point_key(c.mode, c.load, c.max_new_tokens, c.workload),
        "spec_config": None if runs[0].spec_config is None else dict(runs[0].spec_config),
        "repeats": len(runs),
        "summary": s,
        "spec": spec_totals(runs),
        "sanity": sanity(records),
        "decode": decode_time(runs),
        "step_costs": (runs[0].engine_info or {}).get("step_costs"),
    }
