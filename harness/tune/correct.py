"""What `harness tune` does where its verification finds the emitted schedule slower: that
load's range is set to the fixed K (where the fixed K was significantly faster than the baseline
in the same rounds), else to K = 0, and the corrected schedule is verified there again
(harness/tune/verify.py ``answer``). The emit rule (harness/tune/schedule.py ``RULE``) makes this
rare; this is what keeps a tune from handing over a schedule its own check found slower."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from harness.analysis.stats import METHOD, Comparison
from harness.tune.race import Arm, fmt_ratio
from harness.tune.schedule import Pick, Schedule

NOT_REMEASURED = Comparison("output_tok_s", None, None, None, 0, METHOD, "not re-measured")
IDENTICAL = Comparison("output_tok_s", 1.0, 1.0, 1.0, 0, METHOD, "identical: speculation off")


def k_at(schedule: Schedule, load: int) -> int:
    """The K a schedule runs at batch size ``load`` (above the last range: the last range's K)."""
    for a, b, k in schedule:
        if a <= load <= b:
            return k
    return schedule[-1][2] if schedule and load > schedule[-1][1] else 0


def problem(row: Mapping[str, Any], what: str, fixed: Arm) -> str | None:
    """Why a verified load fails, or None: the schedule significantly slower than the baseline,
    or than a fixed K that was itself significantly faster than the baseline in those rounds (a
    fixed K not shown faster than the baseline is no better answer than speculation off)."""
    sb, sf, fb = row["schedule_vs_baseline"], row["schedule_vs_fixed"], row["fixed_vs_baseline"]
    if sb.verdict == "slower":
        return f"{what} was slower than the baseline ({fmt_ratio(sb)})"
    if sf.verdict == "slower" and fb.verdict == "faster":
        return (
            f"{what} was slower than fixed {fixed.label} ({fmt_ratio(sf)}), which was faster "
            f"than the baseline ({fmt_ratio(fb)})"
        )
    return None


@dataclass(frozen=True)
class Correction:
    """One load's range changed by the verification: from K to K, and what was found."""

    load: int
    k_from: int
    k_to: int
    why: str

    def line(self) -> str:
        to = f"K = {self.k_to} (the fixed K)" if self.k_to else "K = 0 (off)"
        return f"load {self.load}: K = {self.k_from} -> {to}: {self.why}"

    def to_json(self) -> dict[str, Any]:
        return {"load": self.load, "k_from": self.k_from, "k_to": self.k_to, "why": self.why}


def corrections(rows: Sequence[Mapping[str, Any]], schedule: Schedule, what: str,
                fixed: Arm) -> list[Correction]:  # fmt: skip
    """Per failing load (``problem``): the fixed K where it was significantly faster than the
    baseline there, else K = 0; none where that is the K the schedule already runs there."""
    out = []
    for row in rows:
        why = problem(row, what, fixed)
        if why is None:
            continue
        here = k_at(schedule, row["load"])
        to = fixed.k if row["fixed_vs_baseline"].verdict == "faster" else 0
        if to != here:
            out.append(Correction(row["load"], here, to, why))
    return out


def corrected_picks(picks: Sequence[Pick], fixes: Sequence[Correction], fixed: Arm) -> list[Pick]:
    """The picks with each corrected load set to the fixed K's method and K, or off."""
    by = {c.load: c for c in fixes}
    out = []
    for p in picks:
        c = by.get(p.load)
        if c is None:
            out.append(p)
        elif c.k_to:
            out.append(replace(p, method=fixed.method, k=c.k_to, speedup=None, off=""))
        else:
            out.append(replace(p, method=None, k=0, speedup=1.0, by_method={},
                               off=f"off: corrected by the verification ({c.why})"))  # fmt: skip
    return out
