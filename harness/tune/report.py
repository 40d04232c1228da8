"""`harness tune`'s markdown and JSON: what was emitted, why per load, and the verification."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.analysis.comparisons.stats import Comparison
from harness.tune.schedule import Pick, Schedule, describe
from harness.tune.search import LoadResult
from harness.tune.verify import Verification


def fmt(c: Comparison | None) -> str:
    """ "1.23x [1.10, 1.37] (n=4)", or what stands instead."""
    if c is None or c.estimate is None:
        return "n/a"
    if c.lo is None or c.hi is None:
        return f"{c.estimate:.2f}x (n={c.n}, no CI)"
    return f"{c.estimate:.2f}x [{c.lo:.2f}, {c.hi:.2f}] (n={c.n})"


def markdown(
    results: Sequence[LoadResult],
    config: Mapping[str, Any] | None,
    schedule: Schedule,
    verification: Verification | None,
    notes: Sequence[str],
    elapsed_s: float,
    out: Path,
    picks: Sequence[Pick] = (),
) -> str:
    head = verification.headline() if verification else "tune: not verified (--no-verify)"
    lines = [head, "", "# Speculative configuration per load", ""]
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines.append(f"{now}, {elapsed_s / 60:.1f} min. Files in `{out}`.")
    lines.append("")
    if config is not None:
        lines += [
            f"## Emitted: `{out / 'speculative_config.json'}` ({describe(schedule)})",
            "",
            "```json",
            json.dumps(config),
            "```",
            "",
            f'Use: `vllm serve MODEL --speculative-config "$(cat {out / "speculative_config.json"})"`'
            f" or `python -m harness --spec-config @{out / 'speculative_config.json'}`.",
            "",
        ]
    lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    lines += [
        "## Why, per load",
        "",
        "Speedup = output tokens/s over the baseline's in the same rounds (closed loop at that "
        "concurrency), t-interval on per-round log ratios; predicted = Leviathan E(K) / (1 + K c) "
        "from the acceptance per position measured at the largest K, c fitted to its speedup.",
        "",
        "Candidates not raced are listed under the table with their prediction.",
        "",
        "| load | candidate | predicted | speedup [95% CI] | vs leader | status |",
        "|---|---|---|---|---|---|",
    ]
    off = {p.load: p.off for p in picks if p.off}
    for r in results:
        raced = sorted((c for c in r.candidates if c.status != "pruned"), key=lambda c: c.arm.cost)
        for c in raced:
            pred = f"{c.predicted:.2f}x" if c.predicted is not None else "-"
            speed = "1 (reference)" if c.arm.method is None else fmt(c.vs_baseline)
            lead = fmt(c.vs_leader) if c.vs_leader is not None else "-"
            status = f"**{c.status}**" if c.status == "chosen" else c.status
            if c.status == "chosen" and c.arm.method is not None and off.get(r.load):
                status = ("undecided: " if not r.decided else "") + off[r.load]
            elif c.status == "chosen" and not r.decided and c.arm.method is not None:
                status = "**chosen** (undecided; significantly faster than the baseline)"
            lines.append(f"| {r.load} | {c.arm.label} | {pred} | {speed} | {lead} | {status} |")
    lines.append("")
    for r in results:
        c_fit = ", ".join(f"{m} {c:.3f}" for m, c in r.c_fit.items())
        pruned = [c for c in r.candidates if c.status == "pruned"]
        lines.append(
            f"- load {r.load}: **{r.chosen.label}**: {r.verdict} ({r.rounds} rounds"
            + (f"; fitted c: {c_fit}" if c_fit else "")
            + ")"
            + (
                "; not raced (predicted): "
                + ", ".join(f"{c.arm.label} {c.predicted:.2f}x" for c in pruned if c.predicted)
                if pruned
                else ""
            )
            + "."
        )
    lines.append("")
    if verification is not None:
        lines += [
            f"## Verification: schedule vs fixed {verification.fixed.label} vs baseline",
            "",
            f"{verification.rounds} rounds per load, the three interleaved in a rotated order.",
            "",
            "| load | schedule vs fixed K | verdict | schedule vs baseline | verdict | fixed K vs baseline |",
            "|---|---|---|---|---|---|",
        ]
        for row in verification.rows:
            sf, sb, fb = (
                row["schedule_vs_fixed"],
                row["schedule_vs_baseline"],
                row["fixed_vs_baseline"],
            )
            load = f"{row['load']} (corrected)" if row.get("corrected") else row["load"]
            lines.append(
                f"| {load} | {fmt(sf)} | {sf.verdict} | {fmt(sb)} | {sb.verdict} | {fmt(fb)} |"
            )
        lines.append("")
        if verification.fallback:
            instead = (
                f"the fixed K's config (fixed {verification.fixed.label}: its rows above are its "
                "own, from the same rounds)"
                if verification.fallback == "fixed K"
                else "no speculative_config (speculation off everywhere)"
            )
            lines += [
                f"Emitted in place of the schedule: {instead}. No change of K could correct the "
                "schedule at (its first rows are `first_rows` in tune.json):",
                "",
                *(f"- {c.stuck_line()}" for c in verification.stuck),
                "",
            ]
        if verification.corrections:
            lines += [
                "Corrected by the verification (each such load verified again against the "
                "baseline; its first rows are `first_rows` in tune.json):",
                "",
                *(f"- {c.line()}" for c in verification.corrections),
                "",
            ]
    return "\n".join(lines)


def to_json(results: Sequence[LoadResult], picks: Sequence[Pick] = ()) -> list[dict[str, Any]]:
    """What tune.json keeps of a search: every candidate's numbers and status, and per load
    what was emitted (the rule: harness/tune/schedule.py RULE)."""
    emitted = {p.load: p for p in picks}
    return [
        {
            "load": r.load,
            "chosen": r.chosen.label,
            "decided": r.decided,
            "emitted": (
                {
                    "method": emitted[r.load].method,
                    "k": emitted[r.load].k,
                    "off": emitted[r.load].off,
                }
                if r.load in emitted
                else None
            ),
            "verdict": r.verdict,
            "rounds": r.rounds,
            "c_fit": r.c_fit,
            "candidates": [
                {
                    "arm": c.arm.label,
                    "method": c.arm.method,
                    "k": c.arm.k,
                    "status": c.status,
                    "predicted": c.predicted,
                    "vs_baseline": c.vs_baseline.to_json() if c.vs_baseline else None,
                    "vs_leader": c.vs_leader.to_json() if c.vs_leader else None,
                    "rounds": c.rounds,
                }
                for c in r.candidates
            ],
        }
        for r in results
    ]
