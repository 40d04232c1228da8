"""Per-turn numbers of a multi-turn run (:mod:`harness.run.conversations`): for each variant at
each point, turn by turn (and all later turns together), the requests' TTFT, TPOT, acceptance
(from each request's own counts) and the paired speedup over the same engine's baseline on that
turn's requests, with the same interval and verdict as every other comparison (repeats paired,
:func:`harness.analysis.comparisons.paired.compare_groups`).

Why by turn: turn 1 is a plain prompt; from turn 2 on the prompt holds the variant's own
earlier answers, which is where methods that copy from the context (n-gram, suffix) can win,
and where the prefix cache serves the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from harness.analysis.comparisons.paired import (
    UNPAIRED,
    UNPAIRED_DESIGNS,
    compare_groups,
    pair_design,
)
from harness.analysis.pooled import point_key
from harness.analysis.summary import distribution
from harness.analysis.workload.categories import acceptance
from harness.core.results import Run, group_runs
from workloads.conversations import split_turn

LATER = "later"  # turns 2.. together
METRICS = ("output_tok_s", "tpot", "ttft")


def _turn_of(request_id: str) -> int | None:
    parts = split_turn(request_id)
    return None if parts is None else parts[1]


def _only(runs: Sequence[Run], keep: Any) -> list[Run]:
    return [
        replace(run, records=tuple(r for r in run.records if keep(_turn_of(r.request_id))))
        for run in runs
    ]


def _cell(runs: Sequence[Run], base: Sequence[Run] | None, min_effect: float) -> dict[str, Any]:
    recs = [r for run in runs for r in run.counted]
    out: dict[str, Any] = {
        "requests": len(recs),
        "ttft_s": distribution(r.ttft for r in recs)["median"],
        "tpot_s": distribution(r.tpot for r in recs)["median"],
        "output_tokens": distribution(r.output_tokens for r in recs)["mean"],
        "prompt_tokens": distribution(r.prompt_tokens for r in recs)["median"],
        "acceptance": acceptance(recs),
        "speedup": None,
    }
    if base is not None and recs:
        design = pair_design((*base, *runs))
        comps = compare_groups(list(base), list(runs), min_effect=min_effect)
        speedup = {}
        for m in METRICS:
            c = comps[m]
            if design in UNPAIRED_DESIGNS:
                c = replace(c, lo=None, hi=None, verdict=UNPAIRED)
            speedup[m] = c.to_json()
        out["speedup"] = speedup
    return out


def turn_tables(runs: Sequence[Run], *, min_effect: float) -> list[dict[str, Any]]:
    """One entry per (engine/variant, point) whose records are conversation turns:
    ``turns[k]`` (``"1"``, ``"2"``, ..., and ``"later"`` = 2 and after, when there is a turn 3)
    with its requests, median TTFT and TPOT (s), mean output tokens, median prompt tokens,
    acceptance, and ``speedup[metric]`` over the same engine's baseline (None for the
    baseline itself)."""
    groups = group_runs(runs)
    out = []
    for (engine, label, *point), group in groups.items():
        counted = [r for run in group for r in run.counted]
        found = sorted({t for r in counted if (t := _turn_of(r.request_id)) is not None})
        if not found:
            continue
        base = groups.get((engine, "baseline", *point)) if label != "baseline" else None
        cells: dict[str, Any] = {}
        for key, keep in [
            *((str(k), (lambda t, k=k: t == k)) for k in found),
            *([(LATER, lambda t: t is not None and t >= 2)] if len(found) > 2 else []),
        ]:
            b = None if base is None else _only(base, keep)
            cells[key] = _cell(_only(group, keep), b, min_effect)
        c = group[0].cell
        out.append(
            {
                "name": f"{engine}/{label}",
                "baseline": None if base is None else f"{engine}/baseline",
                "point": point_key(c.mode, c.load, c.max_new_tokens, c.workload),
                "mode": c.mode,
                "load": dict(c.load),
                "max_new_tokens": c.max_new_tokens,
                "workload": c.workload,
                "conversations": len(
                    {split_turn(r.request_id)[0] for r in counted if split_turn(r.request_id)}
                ),
                "turns": cells,
            }
        )
    return out
