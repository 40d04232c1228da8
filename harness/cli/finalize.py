"""The end of a run: every number derived once (``harness.analysis.derived``), written to results.json
(atomically), then summary.csv, summary.md, the plots and report.html from it alone."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.core.records_file import RECORDS_FILE, write_records
from harness.core.results import SCHEMA_VERSION, Run, environment
from harness.run.journal import atomic_write, new_session_id
from harness.run.plan import RunPlan


def _speed_of_light(plan: RunPlan, runs: list[Run]) -> dict[str, Any] | None:
    """Batch-1 decode bound of a local target (weights read once per token), or None. The
    bandwidth is measured where the weights are: an in-process engine's device (HF ``device``,
    vLLM ``platform``); host memory otherwise."""
    from harness.analysis.theory.sol import (
        bound_for,
        count_params,
        measure_bandwidth,
        weights_device,
    )

    if not any(r.cell.mode == "latency" for r in runs) or count_params(plan.model) is None:
        return None
    infos = [r.engine_info for r in runs if r.engine_info]
    dtype = next((str(i.get("dtype", "")) for i in infos), "")
    device = weights_device(infos)
    memory = (
        "host (assumed: no engine said where its weights are)"
        if device is None
        else (device if device.startswith("cuda") else "host")
    )
    try:  # a full or broken GPU (or a journal's device this machine lacks) loses no results
        bandwidth = measure_bandwidth(mib=256, reps=5, device=device or "cpu")["best"]
    except Exception:  # noqa: BLE001 - the bound is a side figure: none rather than no file
        return None
    return bound_for(plan.model, dtype.removeprefix("torch."), bandwidth, memory)


def workload_analysis(plan: RunPlan, workload: Any, runs: list[Run]) -> dict[str, Any]:
    """A trace replay's checks (``replay``) and a conversation run's per-turn table (``turns``),
    each empty when the run was neither."""
    from harness.analysis.workload.replay import replay_tables
    from harness.analysis.workload.turns import turn_tables

    params = getattr(workload, "params", None) or {}
    shared = params.get("shared_prefix_by_request") or {}
    return {
        "replay": replay_tables(runs, plan.trace_schedule, _asked(workload), shared)
        if plan.trace_schedule
        else [],
        "turns": turn_tables(runs, min_effect=plan.min_effect) if plan.conversations else [],
    }


def _asked(workload: Any) -> dict[str, tuple[int, int]]:
    """Each request's prompt and output length, by id (a trace's)."""
    return {r.id: (len(r.prompt_token_ids or ()), r.max_new_tokens or 0) for r in workload.requests}


def finalize(
    out: Path,
    plan: RunPlan,
    workload: Any,
    runs: list[Run],
    status: str,
    design: dict[str, Any] | None = None,
    session: str | None = None,
    extra: dict[str, Any] | None = None,
    skipped: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Derive every number once (:func:`harness.analysis.derived.analyze`), write results.json
    (atomically), then the views from it alone (:func:`harness.report.views.write_views`).
    Every run is marked with ``session`` (a new one if None): all ran in one interleaved
    schedule, which ``compare`` pairs within.
    ``extra``: keys recorded as they are (the plan said before loading); ``skipped``: variants
    that never ran, appended to ``not_run`` (harness.sizing.preview.not_run_records)."""
    from harness.analysis.derived import analyze, run_summaries
    from harness.report.views import write_views

    session = session or new_session_id()
    runs = [replace(r, session=session) for r in runs]

    goodput = None if plan.goodput is None else dict(plan.goodput)
    summaries = run_summaries(runs, goodput, plan.metric_percentiles)
    results = {
        "schema_version": SCHEMA_VERSION,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "status": status,
        "environment": environment(),
        "config": plan.to_json(),  # every setting of the run
        "metadata": dict(plan.metadata),
        "workload": {
            "name": workload.name,
            "path": str(workload.path),
            "format": workload.fmt,
            "num_requests": len(workload.requests),
            "fingerprint": workload.fingerprint,
            "params": None if workload.params is None else dict(workload.params),
            "categories": {r.id: r.category for r in workload.requests if r.category},
        },
        "design": design,  # harness.core.design: which variant ran when, and the cache policy
        **(extra or {}),
        "records_file": RECORDS_FILE,  # the per-request records (harness.core.records_file)
        "runs": [r.to_json(s, records=False) for r, s in zip(runs, summaries)],
    }
    results |= analyze(
        runs,
        min_effect=plan.min_effect,
        seed=plan.seed,
        temperature=plan.temperature,
        goodput=goodput,
        bound=_speed_of_light(plan, runs),
        percentiles=plan.metric_percentiles,
        summaries=summaries,
        categories=results["workload"]["categories"],
        stopping=(design or {}).get("stopping"),
        prices=plan.price_per_hour,
    )
    results |= workload_analysis(plan, workload, runs)
    if plan.slo:  # the capacity search's answer (harness.analysis.capacity.slo)
        from harness.analysis.capacity.slo import capacity_analysis

        results["capacity"] = capacity_analysis(runs, plan.slo, plan.slo_quantile, plan.min_effect)
    results["not_run"] = [*results.get("not_run", []), *(skipped or [])]
    write_records(out / RECORDS_FILE, runs)  # first: results.json names it
    atomic_write(out / "results.json", json.dumps(results, indent=1))
    write_views(results, out, plots=plan.plots, write=atomic_write)
    return results
