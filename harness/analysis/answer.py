"""The answer block: what a user decides on, computed once from the stored analysis and stored
in results.json ``answer`` (summary.md, stdout and report.html begin with it).

It reads the comparisons, rows, lossless checks and crossover through their stored keys
(``verdict``, ``estimate``, ``lo``, ``hi``, ``n``, ``decides``), so fields other steps add to a
comparison pass through untouched. Layout::

    variants      every engine/variant in display order: per engine (first seen), its
                  baseline first, then the labels in the order the run built them; every table
                  and plot uses this order and one colour per entry
    speculation   per candidate and point: its deciding comparison against the same engine's
                  baseline, with ``answer`` "pays" | "does not pay" | "not significant" |
                  "no verdict"
    stops         per candidate and length across loads (the crossover): where it stops paying,
                  with the ``answer`` of the comparison at ``at`` (undecided there is not "does
                  not pay")
    engines       each engine's baseline against the first engine's ("is vLLM faster than HF?")
    warnings      what changes the reading: degenerate outputs, outputs not identical to the
                  baseline, unstable points, concurrency not reached, cells not run, a
                  client that fell behind its schedule (harness.analysis.schedule), lanes
                  of one engine that differ in more than what is compared (harness.analysis.lanes)
    cost, energy  per speculative candidate and point: its cost (``--price-per-hour``) and
                  energy per output token against its own engine's baseline, candidate over
                  baseline with the CI (harness.analysis.cost_energy); empty when unpriced or
                  unmeasured
    blocks        what ran: the fewest and most blocks (repeats) a row pooled, and the design
                  ("sequential": looks after every block; "fixed": n set before the run), for
                  every view's title (a sequential run's ``config.repeats`` is its first look)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.analysis.clocks import clock_warnings
from harness.analysis.comparisons.sequential import rule_of
from harness.analysis.cost_energy import answer_entries
from harness.analysis.distributions import distributions
from harness.analysis.lanes import lane_warnings
from harness.analysis.schedule import behind_warnings
from harness.core.results import Run

PAYS, DOES_NOT, NOT_SIGNIFICANT, NO_VERDICT = (
    "pays",
    "does not pay",
    "not significant",
    "no verdict",
)
# the stored comparison verdicts whose reading is not the verdict's own word
NOT_SIGNIFICANT_VERDICTS = ("no significant difference",)


def answer_word(verdict: str | None) -> str:
    """A verdict as a decision: "faster" pays; "slower" and "within +-x%" (the CI excludes 1 but
    the effect is below --min-effect) do not; "no significant difference" is not significant;
    any "n/a (...)" gives no verdict."""
    v = str(verdict or "")
    if v == "faster":
        return PAYS
    if v == "slower" or v.startswith("within"):
        return DOES_NOT
    if v in NOT_SIGNIFICANT_VERDICTS:
        return NOT_SIGNIFICANT
    return NO_VERDICT


def variant_order(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Engines in the order first seen, each with its baseline first, then every label in the
    order the run first built it (the same label order for every engine)."""
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    labels.sort(key=lambda lb: lb != "baseline")  # stable: the rest keep their order
    names = {r["name"] for r in rows}
    return [f"{e}/{lb}" for e in engines for lb in labels if f"{e}/{lb}" in names]


def _entry(c: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "candidate": c["candidate"],
        "baseline": c["baseline"],
        "mode": c["mode"],
        "load": dict(c["load"]),
        "max_new_tokens": c["max_new_tokens"],
        "workload": c["workload"],
        "metric": c["metric"],
        "estimate": c.get("estimate"),
        "lo": c.get("lo"),
        "hi": c.get("hi"),
        "n": c.get("n"),
        "method": c.get("method"),
        "verdict": c.get("verdict"),
        "answer": answer_word(c.get("verdict")),
        "comparison": c.get("id"),
    }


def _same_engine(c: Mapping[str, Any]) -> bool:
    return c["baseline"].split("/")[0] == c["candidate"].split("/")[0]


def _ordered(entries: list[dict[str, Any]], order: Sequence[str]) -> list[dict[str, Any]]:
    rank = {name: i for i, name in enumerate(order)}
    return sorted(entries, key=lambda e: rank.get(e["candidate"], len(rank)))  # stable


def _row_warnings(
    rows: Sequence[Mapping[str, Any]], where: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Degenerate outputs (one warning per distinct worst share, naming the variants), unstable
    points (one per variant) and concurrency not reached (one per row)."""
    worst: dict[str, dict[str, float]] = {}
    unstable: dict[str, dict[str, Any]] = {}
    short: list[dict[str, Any]] = []
    for r in rows:
        at = {"name": r["name"], "point": r["point"], **where[r["point"]]}
        s, sane = r["summary"], r.get("sanity") or {}
        for k in ("whitespace", "repetition"):
            if sane.get(k):  # the variant's worst share over the points
                mine = worst.setdefault(r["name"], {})
                mine[k] = max(mine.get(k, 0.0), sane[k])
        if s.get("unstable"):
            w = unstable.setdefault(r["name"], {"kind": "unstable", "name": r["name"]})
            w.setdefault("points", []).append({**at, "instability": s.get("instability")})
        asked, peak = r["load"].get("concurrency"), s.get("peak_in_flight")
        if asked and asked > 1 and peak is not None and peak < asked:
            short.append({"kind": "concurrency not reached", **at, "asked": asked, "peak": peak})
    degenerate: dict[tuple[float, float], dict[str, Any]] = {}
    for name, shares in worst.items():
        key = (shares.get("whitespace", 0.0), shares.get("repetition", 0.0))
        w = degenerate.setdefault(key, {"kind": "degenerate", **shares, "names": []})
        w["names"].append(name)
    return [*degenerate.values(), *unstable.values(), *short]


def _lossless_warnings(
    checks: Sequence[Mapping[str, Any]], where: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Each checked pair whose outputs were not all identical to the baseline's."""
    return [
        {
            "kind": "not identical",
            "name": c["candidate"],
            "baseline": c["baseline"],
            "point": c["point"],
            **where.get(c["point"], {}),
            "identical": c["identical"],
            "compared": c["compared"],
            "first_divergence_min": c.get("first_divergence_min"),
        }
        for c in checks
        if c.get("status", "checked") == "checked" and c.get("identical", 0) < c.get("compared", 0)
    ]


def _not_run_warnings(
    not_run: Sequence[Mapping[str, Any]], where: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Cells that did not run: one warning per point and reason, naming the cells."""
    skipped: dict[tuple[str, str], dict[str, Any]] = {}
    for n in not_run:
        if n.get("repeat") is None:  # a repeat cut short is not a cell that never ran
            w = skipped.setdefault(
                (n["point"], n["status"]),
                {
                    "kind": "not run",
                    "point": n["point"],
                    "mode": n["mode"],
                    "load": dict(n["load"]),
                    "max_new_tokens": where.get(n["point"], {}).get("max_new_tokens"),
                    "status": n["status"],
                    "names": [],
                },
            )
            w["names"].append(n["name"])
    return list(skipped.values())


def _warnings(
    rows: Sequence[Mapping[str, Any]],
    checks: Sequence[Mapping[str, Any]],
    not_run: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    where = {
        r["point"]: {
            "mode": r["mode"],
            "load": dict(r["load"]),
            "max_new_tokens": r["max_new_tokens"],
        }
        for r in rows
    }
    return [
        *_row_warnings(rows, where),
        *_lossless_warnings(checks, where),
        *_not_run_warnings(not_run, where),
        *behind_warnings(rows, where),
    ]


def blocks_run(rows: Sequence[Mapping[str, Any]], sequential: bool) -> dict[str, Any] | None:
    """The blocks the rows pooled (``rows[].repeats``: one run per block), fewest and most, and
    the design that chose them; None when no row ran."""
    ns = [int(r["repeats"]) for r in rows if r.get("repeats")]
    if not ns:
        return None
    return {"design": "sequential" if sequential else "fixed", "min": min(ns), "max": max(ns)}


def answer(
    rows: Sequence[Mapping[str, Any]],
    comps: Sequence[Mapping[str, Any]],
    checks: Sequence[Mapping[str, Any]],
    crossover: Sequence[Mapping[str, Any]],
    not_run: Sequence[Mapping[str, Any]],
    sequential: bool = False,
    lanes: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The stored answer block (see the module docstring); ``sequential``: the comparisons'
    intervals are the sequential design's (harness.analysis.comparisons.sequential); ``lanes``:
    the stored ``lane_differences`` (harness.analysis.lanes)."""
    order = variant_order(rows)
    deciding = [c for c in comps if c.get("decides")]
    spec = [_entry(c) for c in deciding if _same_engine(c) and c["baseline"] != c["candidate"]]
    engines = [
        _entry(c)
        for c in deciding
        if not _same_engine(c) and c["candidate"].split("/")[-1] == "baseline"
    ]
    stops = []
    for x in crossover:
        c = comps[x["comparison"]]
        stops.append(
            {
                "candidate": x["candidate"],
                "max_new_tokens": x["max_new_tokens"],
                "unit": x["unit"],
                "kind": x["kind"],
                "pays_up_to": x.get("pays_up_to"),
                "at": x["at"],
                **{
                    k: c.get(k)
                    for k in ("metric", "estimate", "lo", "hi", "n", "method", "verdict")
                },
                "answer": answer_word(c.get("verdict")),  # at ``at``: undecided is no "not"
                "comparison": x["comparison"],
            }
        )
    return {
        "variants": order,
        "speculation": _ordered(spec, order),
        "stops": _ordered(stops, order),
        "engines": _ordered(engines, order),
        "cost": _ordered(answer_entries(rows, comps, "cost"), order),
        "energy": _ordered(answer_entries(rows, comps, "energy"), order),
        "warnings": [*_warnings(rows, checks, not_run), *lane_warnings(lanes)],
        "blocks": blocks_run(rows, sequential),
    }


def is_sequential(results: Mapping[str, Any]) -> bool:
    """Whether a results dict's comparisons are the sequential design's (its design.stopping)."""
    return rule_of((results.get("design") or {}).get("stopping"))[0] is not None


def answer_of(results: Mapping[str, Any], sequential: bool | None = None) -> dict[str, Any]:
    """The answer block of a results dict that holds the stored analysis (also for files
    written before the block existed); ``sequential`` None: read from its design."""
    return answer(
        results.get("rows") or [],
        results.get("comparisons") or [],
        results.get("lossless") or [],
        results.get("crossover") or [],
        results.get("not_run") or [],
        is_sequential(results) if sequential is None else sequential,
        results.get("lane_differences") or [],
    )


def answer_block(
    results: Mapping[str, Any], runs: Sequence[Run], sequential: bool | None = None
) -> dict[str, Any]:
    """The stored answer block: :func:`answer_of` and the client workers' clock warnings."""
    block = answer_of(results, sequential)
    block["warnings"] = [*block["warnings"], *clock_warnings(runs)]
    return block


def reading(
    results: Mapping[str, Any], runs: Sequence[Run], sequential: bool | None = None
) -> dict[str, Any]:
    """What the views read first, stored beside the analysis: the answer block and the latency
    distributions the plots draw (:mod:`harness.analysis.distributions`)."""
    return {"answer": answer_block(results, runs, sequential), "distributions": distributions(runs)}
