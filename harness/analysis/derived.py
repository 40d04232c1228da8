"""The one analysis step: every derived number of a run, computed once and stored in
results.json beside the raw runs. summary.md, plots, `report` and `compare` only format what this
returns (:mod:`harness.report.markdown`, :mod:`harness.report.plots`).

Layout (each list in a stable order that the markdown follows):

* ``rows``: one per configuration at one point, repeats pooled (:func:`harness.analysis.pooled.pooled`),
  with the index of its deciding comparison and of its lossless check;
* ``comparisons``: paired comparisons (:func:`harness.analysis.comparisons.paired.comparisons`), each with its ``id``;
* ``lossless``: the output check of each compared pair at each point;
* ``theory``, ``crossover``, ``speed_of_light``, ``not_run``;
* ``lane_differences``: each pair of one engine's lanes, diffed (:mod:`harness.analysis.lanes`);
* ``answer``: the answer block read first (:mod:`harness.analysis.answer`);
* ``distributions``: latency quantiles per configuration and point, for the plots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.analysis.answer import reading
from harness.analysis.comparisons.paired import comparisons, deciding_metric
from harness.analysis.comparisons.sequential import rule_of
from harness.analysis.cost_energy import add_cost_energy
from harness.analysis.lanes import lane_differences
from harness.analysis.pooled import point_key, pooled
from harness.analysis.sanity import lossless
from harness.analysis.schedule import schedule_latencies
from harness.analysis.summary import PERCENTILES, summarize
from harness.analysis.theory.crossover import crossover
from harness.analysis.theory.speedup import theory
from harness.analysis.workload.categories import category_tables
from harness.core.load import open_loop
from harness.core.results import Run, group_runs

KEYS = (
    "rows",
    "comparisons",
    "lossless",
    "theory",
    "crossover",
    "speed_of_light",
    "not_run",
    "categories",
    "answer",
    "distributions",
    "lane_differences",
)


def run_summaries(
    runs: Sequence[Run],
    goodput: Mapping[str, float] | None = None,
    percentiles: Sequence[float] = PERCENTILES,
) -> list[dict[str, Any]]:
    """Each run's summary (results.json ``runs[i].summary``), computed once for the record and
    the pooled rows alike."""
    return [
        summarize(run.records, goodput, percentiles) | schedule_latencies(run.records, percentiles)
        for run in runs
    ]


def _point_of(c: Mapping[str, Any]) -> str:
    return point_key(c["mode"], c["load"], c["max_new_tokens"], c["workload"])


def analyze(
    runs: Sequence[Run],
    *,
    min_effect: float,
    seed: int = 0,
    temperature: float | None = 0.0,
    goodput: Mapping[str, float] | None = None,
    bound: Mapping[str, Any] | None = None,
    percentiles: Sequence[float] = PERCENTILES,
    summaries: Sequence[Mapping[str, Any]] | None = None,
    categories: Mapping[str, str] | None = None,
    stopping: Mapping[str, Any] | None = None,
    prices: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Every derived number of ``runs``; ``bound``: the batch-1 speed of light, if measured;
    ``percentiles``: those kept beside 50, 90, 99 (``--metric-percentiles``); ``summaries``:
    each run's own summary (:func:`run_summaries`), when the caller has them already;
    ``stopping``: the sequential design's record (results.json ``design.stopping``), whose
    rule then makes every interleaved comparison's interval (harness.analysis.comparisons.sequential)."""
    if summaries is None:
        summaries = run_summaries(runs, goodput, percentiles)
    of = {id(run): s for run, s in zip(runs, summaries)}
    groups = group_runs(runs)
    rows = [pooled(rs, [of[id(r)] for r in rs], goodput, percentiles) for rs in groups.values()]
    by_name = {(r["name"], r["point"]): (r, rs) for r, rs in zip(rows, groups.values())}
    rule, stopped = rule_of(stopping)  # prices: --price-per-hour per engine (cost_energy)
    comps = comparisons(runs, min_effect=min_effect, seed=seed, rule=rule, stopped=stopped)
    checks: list[dict[str, Any]] = []
    check_of: dict[tuple[str, str, str], int] = {}
    for i, c in enumerate(comps):
        c["id"] = i
        key = (c["baseline"], c["candidate"], _point_of(c))
        if key not in check_of and (key[0], key[2]) in by_name and (key[1], key[2]) in by_name:
            base, cand = by_name[(key[0], key[2])][1], by_name[(key[1], key[2])][1]
            check_of[key] = len(checks)
            checks.append({"baseline": key[0], "candidate": key[1], "point": key[2]})
            checks[-1].update(lossless(base, cand, temperature))
        c["lossless"] = check_of.get(key) if c["decides"] else None
    for row in rows:
        row["deciding_metric"] = deciding_metric(row["mode"], row["load"])
        row["open_loop"] = open_loop(row["load"])  # the views say "no schedule" from this
        head = _deciding(comps, row)
        row["comparison"] = None if head is None else head["id"]
        row["lossless"] = None if head is None else head["lossless"]
    add_cost_energy(rows, comps, runs, prices, min_effect, rule)  # rows[].cost/energy, comps too
    out = {
        "rows": rows,
        "comparisons": comps,
        "lossless": checks,
        "theory": _theory(rows, comps),
        "crossover": crossover(comps),
        "speed_of_light": _speed_of_light(rows, bound),
        "not_run": _not_run(runs),
        # request id -> category (the workload's): Spec-Bench's per-category table
        "categories": category_tables(runs, categories or {}, min_effect=min_effect, rule=rule),
        "lane_differences": lane_differences(runs),
    }
    return out | reading(out, runs, sequential=rule is not None)


def _deciding(comps: Sequence[dict[str, Any]], row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The row's deciding comparison: against its own engine's baseline first, else against the
    first engine (engine vs engine)."""
    matches = [
        c
        for c in comps
        if c["candidate"] == row["name"] and _point_of(c) == row["point"] and c["decides"]
    ]
    same_engine = [c for c in matches if c["baseline"].split("/")[0] == row["engine"]]
    return (same_engine or matches or [None])[0]


def _theory(rows: Sequence[dict[str, Any]], comps: Sequence[dict[str, Any]]) -> list[dict]:
    out = []
    index = {(r["name"], r["point"]): r for r in rows}
    for row in rows:
        if row["mode"] != "latency" or row["spec_config"] is None:
            continue
        base = index.get((f"{row['engine']}/baseline", row["point"]))
        th = theory(row, base)
        if th is None:
            continue
        th["comparison"] = row["comparison"]  # latency mode: decided by tokens/s
        out.append(th)
    return out


def _speed_of_light(
    rows: Sequence[Mapping[str, Any]], bound: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The batch-1 bound and the share of it each latency-mode configuration reached."""
    if not bound:
        return None
    reached = []
    for r in rows:
        tok_s = r["summary"].get("output_tok_s")
        if r["mode"] == "latency":
            share = tok_s / bound["tok_s"] if tok_s is not None and bound["tok_s"] else None
            reached.append({"name": r["name"], "point": r["point"], "share": share})
    return {**bound, "reached": reached}


def _not_run(runs: Sequence[Run]) -> list[dict]:
    """Cells that did not run (unsupported, failed, stopped) and repeats cut short, once each."""
    out: list[dict[str, Any]] = []
    seen = set()
    for r in runs:
        c = r.cell
        if r.status == "ok":
            continue
        key = (c.engine, c.label, point_key(c.mode, c.load, c.max_new_tokens, c.workload))
        entry = {
            "name": f"{c.engine}/{c.label}",
            "point": key[2],
            "mode": c.mode,
            "load": dict(c.load),
            "repeat": c.repeat if r.status == "interrupted" else None,
            "status": r.status,
        }
        if (key, entry["repeat"], r.status) not in seen:
            seen.add((key, entry["repeat"], r.status))
            out.append(entry)
    return out
