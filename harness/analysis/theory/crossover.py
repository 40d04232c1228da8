"""The crossover: up to which load a speculative configuration pays, and where it stops, judged
by each point's deciding comparison (tokens/s in closed loop, E2E at a request rate, see
:func:`harness.analysis.comparisons.paired.deciding_metric`). Latency mode counts as concurrency 1."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _x(c: Mapping[str, Any]) -> tuple[str, float] | None:
    if c["mode"] == "latency":
        return None
    load = c["load"]
    if "request_rate" in load:
        return "request rate", float(load["request_rate"])
    n = load.get("concurrency")
    return ("concurrency", float(n)) if n is not None else None


def crossover(comparisons: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per speculative configuration and length: where it pays (verdict "faster"), with the
    index of the comparison each statement rests on."""
    series: dict[tuple[str, int, str], list[tuple[float, int]]] = {}
    latency: dict[tuple[str, int, str], int] = {}
    for i, c in enumerate(comparisons):
        same_engine = c["baseline"].split("/")[0] == c["candidate"].split("/")[0]
        if not same_engine:
            continue
        if not c["decides"] or c.get("estimate") is None:
            continue
        if c["mode"] == "latency":  # one in flight: the first point of a concurrency series
            latency[(c["candidate"], c["max_new_tokens"], "concurrency")] = i
            continue
        x = _x(c)
        if x is None:  # on no axis (a ramp, a trace): not a point of a series
            continue
        unit, value = x
        series.setdefault((c["candidate"], c["max_new_tokens"], unit), []).append((value, i))
    out = []
    for key, pts in sorted(series.items()):
        if key in latency:
            pts.append((1.0, latency[key]))
        pts.sort()
        if len(pts) < 2:
            continue
        cand, mnt, unit = key
        faster = [comparisons[i]["verdict"] == "faster" for _, i in pts]
        entry: dict[str, Any] = {
            "candidate": cand,
            "max_new_tokens": mnt,
            "unit": unit,
            "metric": comparisons[pts[-1][1]]["metric"],
            "points": [{"x": x, "comparison": i} for x, i in pts],
        }
        stop = next((k for k, ok in enumerate(faster) if not ok), None)
        if stop is None:
            entry.update(kind="pays everywhere", at=pts[-1][0], comparison=pts[-1][1])
        elif stop == 0:
            entry.update(kind="never pays", at=pts[0][0], comparison=pts[0][1])
        else:
            entry.update(
                kind="stops paying",
                pays_up_to=pts[stop - 1][0],
                at=pts[stop][0],
                comparison=pts[stop][1],
            )
        out.append(entry)
    return out
