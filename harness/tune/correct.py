"""What `harness tune` does where its verification finds the emitted schedule slower: that
load's range is set to the fixed K (where the fixed K was shown faster than the baseline in the
same rounds, by the emit rule's standard over the loads verified), else to K = 0, and the corrected schedule is verified there again
(harness/tune/verify.py ``answer``). The emit rule (harness/tune/schedule.py ``RULE``) makes this
rare; this is what keeps a tune from handing over a schedule its own check found slower. A load
no change of K can correct (it runs that K already) is ``stuck``: the fixed K's own config, or
none, is emitted in the schedule's place (harness/tune/verify.py ``_fall_back``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, replace
from typing import Any

from harness.analysis.comparisons.stats import METHOD, Comparison
from harness.tune.race import Arm, fmt_ratio
from harness.tune.schedule import Pick, Schedule, pays, raced, shown_slower
from harness.tune.search import LoadResult

NOT_REMEASURED = Comparison("output_tok_s", None, None, None, 0, METHOD, "not re-measured")
IDENTICAL = Comparison("output_tok_s", 1.0, 1.0, 1.0, 0, METHOD, "identical: speculation off")
ITSELF = Comparison("output_tok_s", 1.0, 1.0, 1.0, 0, METHOD, "identical: the fixed K itself")


def inverse(c: Comparison) -> Comparison:
    """``c`` the other way round (b over a): the same paired rounds, the verdict flipped."""
    if c.estimate is None:
        return c
    flip = {"faster": "slower", "slower": "faster"}
    return replace(c, estimate=1 / c.estimate, lo=None if c.hi is None else 1 / c.hi,
                   hi=None if c.lo is None else 1 / c.lo, verdict=flip.get(c.verdict, c.verdict))  # fmt: skip


def k_at(schedule: Schedule, load: int) -> int:
    """The K a schedule runs at batch size ``load`` (above the last range: the last range's K)."""
    for a, b, k in schedule:
        if a <= load <= b:
            return k
    return schedule[-1][2] if schedule and load > schedule[-1][1] else 0


def fixed_pays(row: Mapping[str, Any], tol: float, loads: int, searched: Set[int]) -> bool:
    """The fixed K shown faster than the baseline at this load twice: in the search (its load in
    ``searched``: it passed the emit rule there, ``searched_loads``) and in the verification by
    the same standard, the family being the ``loads`` verified. Only then may it replace the
    schedule's K there, or count against a schedule slower than it: one lucky verification of 3
    rounds (a fixed K 0.95x of the baseline measured 1.14x [1.09, 1.20] in tests/test_tune_emit.py)
    is not enough."""
    return row["load"] in searched and pays(row["fixed_vs_baseline"], tol, loads)


def searched_loads(results: Sequence[LoadResult], fixed: Arm, tol: float) -> frozenset[int]:
    """The loads where the fixed K passed the emit rule in the search (``schedule.pays`` over the
    arms raced there)."""
    out = set()
    for r in results:
        c = r.candidate(fixed)
        if c is not None and c.status != "pruned" and pays(c.vs_baseline, tol, raced(r)):
            out.add(r.load)
    return frozenset(out)


def problem(row: Mapping[str, Any], what: str, fixed: Arm, proven: bool, tol: float,
            loads: int) -> str | None:  # fmt: skip
    """Why a verified load fails, or None: the schedule significantly slower than the baseline,
    or than a fixed K that was shown faster than the baseline in those rounds (``proven``:
    ``fixed_pays``; a fixed K not shown faster is no better answer than speculation off).
    Significantly: ``shown_slower`` over the ``loads`` verified."""
    sb, sf, fb = row["schedule_vs_baseline"], row["schedule_vs_fixed"], row["fixed_vs_baseline"]
    if shown_slower(sb, tol, loads):
        return f"{what} was slower than the baseline ({fmt_ratio(sb)})"
    if proven and shown_slower(sf, tol, loads):
        return (
            f"{what} was slower than fixed {fixed.label} ({fmt_ratio(sf)}), which was faster "
            f"than the baseline ({fmt_ratio(fb)})"
        )
    return None


def fixed_holds(rows: Sequence[Mapping[str, Any]], tol: float, searched: Set[int]) -> bool:
    """The fixed K, as a config of its own, meets the schedule's bar at every load verified: it
    passed the emit rule there in the search (``searched``), the verification's fresh rounds put
    it more than ``tol`` ahead of the baseline (the confirmation) and never significantly behind.
    Then it can be emitted in place of a schedule that cannot be corrected, on the rounds
    already run (it ran in every one)."""
    return bool(rows) and all(
        row["load"] in searched
        and (fb := row["fixed_vs_baseline"]).estimate is not None
        and fb.estimate > 1 + tol
        and not shown_slower(fb, tol, len(rows))
        for row in rows
    )


def unconfirmed(row: Mapping[str, Any], what: str, k: int, tol: float) -> str | None:
    """The confirmation on fresh prompts: where the schedule drafts (K > 0), the verification's
    rounds must put it ahead of the baseline by more than ``tol`` (--min-effect) by their point
    estimate (no CI of 3 rounds on a noisy machine could be asked to show it). A search whose
    baseline runs were all slowed by another job on the machine made every arm look 1.3x faster
    with a tight CI where it was 0.9x (tests/test_tune_emit.py): no level of the search's own CI
    guards against that; fresh rounds do."""
    sb = row["schedule_vs_baseline"]
    if k > 0 and sb.estimate is not None and sb.estimate <= 1 + tol:
        return (
            f"{what} was not confirmed more than {tol:.0%} faster than the baseline on fresh "
            f"prompts ({fmt_ratio(sb)})"
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

    def stuck_line(self) -> str:
        """A load no change of K fixes (``corrections``' stuck)."""
        return f"load {self.load}: K = {self.k_from} there already: {self.why}"

    def to_json(self) -> dict[str, Any]:
        return {"load": self.load, "k_from": self.k_from, "k_to": self.k_to, "why": self.why}


def corrections(rows: Sequence[Mapping[str, Any]], schedule: Schedule, what: str, fixed: Arm,
                tol: float, searched: Set[int]) -> tuple[list[Correction], list[Correction]]:  # fmt: skip
    """Per failing load (``problem``, ``unconfirmed``): the fixed K where it was shown faster than
    the baseline there (``fixed_pays``), else K = 0. (corrections, stuck): a stuck load is one
    where that is the K the schedule already runs (a K = 0 range of a drafter that costs its
    steps; the fixed K's own K run slower by the schedule's engine): no change of its K can fix
    it, and the verify step emits the fixed K's config or none instead (verify.py ``_correct``)."""
    out: tuple[list[Correction], list[Correction]] = ([], [])
    for row in rows:
        proven = fixed_pays(row, tol, len(rows), searched)
        here = k_at(schedule, row["load"])
        why = problem(row, what, fixed, proven, tol, len(rows)) or unconfirmed(row, what, here, tol)
        if why is None:
            continue
        to = fixed.k if proven else 0
        out[to == here].append(Correction(row["load"], here, to, why))
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
