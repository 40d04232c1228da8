"""Per-category comparisons in Spec-Bench's shape: for a workload whose requests carry a
``category``, each speculative variant's speedup over its baseline within each category and over
all of them, with the same interval and verdict as every other comparison (repeats paired,
:func:`harness.analysis.comparisons.paired.compare_groups`), and the category's acceptance from each request's own
counts (vLLM's per-request spec decode metrics) where the engine reported them.

Why: one speedup over a mixed workload hides that n-gram lookup pays where the answer copies
from the prompt (summarization, RAG) and not where it does not (translation). Latency mode only
(one request at a time, as Spec-Bench): under load a request's speed depends on its neighbours.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from harness.analysis.comparisons.paired import (
    UNPAIRED,
    UNPAIRED_DESIGNS,
    compare_groups,
    pair_design,
)
from harness.analysis.comparisons.sequential import Rule
from harness.core.records import RequestRecord
from harness.core.results import Run, group_runs
from workloads.conversations import split_turn

OVERALL = "overall"
METRIC = "output_tok_s"  # latency mode's deciding metric


def base_id(request_id: str) -> str:
    """The workload id of a request (a cycled copy ``ID~K`` is prompt ``ID``; a conversation's
    turn ``ID@tK`` is conversation ``ID``)."""
    head = request_id.split("~", 1)[0]
    turn = split_turn(head)
    return head if turn is None else turn[0]


def _only(runs: Sequence[Run], ids: set[str]) -> list[Run]:
    return [
        replace(run, records=tuple(r for r in run.records if base_id(r.request_id) in ids))
        for run in runs
    ]


def acceptance(records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """Acceptance summed over requests that carry their own counts (``info.spec_decode``)."""
    per = [r.info.get("spec_decode") for r in records if r.counted]
    per = [p for p in per if isinstance(p, Mapping)]
    if not per:
        return None
    drafted = sum(int(p.get("num_draft_tokens", 0)) for p in per)
    accepted = sum(int(p.get("num_accepted_draft_tokens", 0)) for p in per)
    steps = sum(int(p.get("num_spec_steps", 0)) for p in per)
    return {
        "requests": len(per),
        "num_draft_tokens": drafted,
        "num_accepted_tokens": accepted,
        "num_drafts": steps,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_acceptance_length": 1 + accepted / steps if steps else None,
    }


def category_tables(
    runs: Sequence[Run],
    categories: Mapping[str, str],
    *,
    min_effect: float,
    rule: Rule | None = None,
) -> list[dict[str, Any]]:
    """One entry per (speculative variant, latency point): ``cells[category]`` (and
    ``cells["overall"]``) = the tokens/s comparison against the same engine's baseline on that
    category's prompts, plus ``acceptance``; empty when no request has a category. ``rule``:
    the run's sequential design (its intervals hold at whatever block the point stopped)."""
    if not categories:
        return []
    cats = sorted(set(categories.values()))
    groups = group_runs(runs)
    out = []
    for (engine, label, *point), cand in groups.items():
        base = groups.get((engine, "baseline", *point))
        if label == "baseline" or base is None or cand[0].cell.mode != "latency":
            continue
        design = pair_design((*base, *cand))
        cells: dict[str, Any] = {}
        for cat in [*cats, OVERALL]:
            ids = (
                set(categories)
                if cat == OVERALL
                else {i for i, c in categories.items() if c == cat}
            )
            b, c = _only(base, ids), _only(cand, ids)
            if not any(r.counted for run in c for r in run.records):
                continue
            comp = compare_groups(b, c, min_effect=min_effect, rule=rule)[METRIC]
            if design in UNPAIRED_DESIGNS:
                comp = replace(comp, lo=None, hi=None, verdict=UNPAIRED)
            recs = [r for run in c for r in run.counted]
            cells[cat] = {
                **comp.to_json(),
                "prompts": len({base_id(r.request_id) for r in recs}),
                "acceptance": acceptance(recs),
            }
        cell = cand[0].cell
        out.append(
            {
                "baseline": f"{engine}/baseline",
                "candidate": f"{engine}/{label}",
                "mode": cell.mode,
                "load": dict(cell.load),
                "max_new_tokens": cell.max_new_tokens,
                "workload": cell.workload,
                "metric": METRIC,
                "categories": cats,
                "cells": cells,
            }
        )
    return out
