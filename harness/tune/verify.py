"""`harness tune`'s answer and its check: the search's results made into one speculative_config
(harness/tune/schedule.py), then the emitted schedule against the best fixed K and the baseline, fresh
interleaved rounds at every load (never the data that chose it), as many as the budget allows."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from harness.analysis.comparisons.stats import MIN_REPEATS, Comparison
from harness.tune.correct import (
    IDENTICAL,
    ITSELF,
    NOT_REMEASURED,
    Correction,
    corrected_picks,
    corrections,
    fixed_holds,
    fixed_pays,
    inverse,
    problem,
    searched_loads,
)
from harness.tune.schedule import (
    Pick,
    Schedule,
    best_fixed_k,
    best_fixed_score,
    build_config,
    fixed_config,
    picks,
    ranges,
    shown_slower,
)
from harness.tune.search import BASELINE, Arm, LoadResult, Measure, Race, Settings, fmt_ratio


@dataclass
class Verification:
    """The emitted schedule against the best fixed K and the baseline, interleaved per load;
    where it was corrected (harness/tune/correct.py), those loads' rows are the corrected
    schedule's second verification and ``first`` keeps the rows that found the problem."""

    schedule: Arm
    fixed: Arm
    rounds: int
    rows: list[dict[str, Any]]  # load, schedule_vs_fixed, schedule_vs_baseline, fixed_vs_baseline
    corrections: list[Correction] = field(default_factory=list)
    first: list[dict[str, Any]] = field(default_factory=list)
    why_not: str = ""  # why a corrected load was not verified again (the budget), if it was not
    tolerance: float = 0.02  # --min-effect: the emit rule's, for a fixed K shown faster
    searched: frozenset[int] = frozenset()  # loads where the fixed K passed the emit rule
    stuck: list[Correction] = field(default_factory=list)  # loads no change of K could fix
    fallback: str = ""  # what was emitted in place of the schedule there: "fixed K" or "off"

    @property
    def what(self) -> str:
        if self.fallback == "fixed K":
            return f"fixed {self.fixed.label}"
        return "the schedule" if self.schedule.method else "speculation off"

    @property
    def failures(self) -> list[str]:
        out = []
        for row in self.rows:
            sb = row["schedule_vs_baseline"]
            if row.get("corrected"):
                again = sum(1 for r in self.rows if r.get("corrected"))
                if sb.lo is None:
                    out.append(
                        f"load {row['load']}: {self.what}, corrected there, was not verified again "
                        f"({self.why_not or 'see stderr'})"
                    )
                elif shown_slower(sb, self.tolerance, again):
                    out.append(f"load {row['load']}: {self.what}, corrected there, is slower than "
                               f"the baseline ({fmt_ratio(sb)})")  # fmt: skip
                continue
            if row["schedule_vs_fixed"].lo is None or sb.lo is None:
                n = min(row["schedule_vs_fixed"].n, sb.n)
                out.append(
                    f"load {row['load']}: {self.what} was not measured ({n} paired rounds; "
                    "see stderr)"
                )
                continue
            if self.fallback:  # emitted in place of the schedule on these rows: never slower
                continue
            loads = len(self.first or self.rows)
            proven = fixed_pays(row, self.tolerance, loads, self.searched)
            why = problem(row, self.what, self.fixed, proven, self.tolerance, loads)
            if why is not None:
                out.append(f"load {row['load']}: {why.replace(' was ', ' is ', 1)}")
        return out

    @property
    def passed(self) -> bool:
        return not self.failures

    def headline(self) -> str:
        if not self.passed:
            return "tune: verification FAILED: " + "; ".join(self.failures)
        if self.fallback:
            instead = (
                f"fixed {self.fixed.label} is emitted in place of the schedule and is never "
                "significantly slower than the baseline"
                if self.fallback == "fixed K"
                else "speculation off everywhere (no file) in place of the schedule"
            )
            return (
                f"tune: verified: {instead} ({self.rounds} interleaved rounds per load); the "
                "schedule could not be corrected at "
                + "; ".join(c.stuck_line() for c in self.stuck)
            )
        wins = [r["load"] for r in self.rows if r["schedule_vs_fixed"].verdict == "faster"]
        gain = (
            f"beats fixed {self.fixed.label} at load {', '.join(map(str, wins))}"
            if wins
            else f"beats fixed {self.fixed.label} at none of the loads tuned"
        )
        fixed = "".join(
            f"; corrected at load {r['load']}: {r['corrected']}, "
            + (
                "leaving speculation off everywhere (no file)"
                if r["schedule_vs_baseline"] is IDENTICAL
                else f"verified again ({fmt_ratio(r['schedule_vs_baseline'])} of the baseline)"
            )
            for r in self.rows
            if r.get("corrected")
        )
        # slower than the fixed K where that K was not shown to pay is no failure (the emit
        # rule's), but the headline says it rather than "never slower than it"
        behind = [
            f"load {r['load']} (where it is {fmt_ratio(r['fixed_vs_baseline'])} of the "
            "baseline, not shown to pay)"
            for r in self.rows
            if r["schedule_vs_fixed"].verdict == "slower"
        ]
        than = f"; slower than it at {', '.join(behind)}" if behind else " or than it"
        return (
            f"tune: verified: {self.what} {gain}, is never significantly slower than the "
            f"baseline{than} ({self.rounds} interleaved rounds per load){fixed}"
        )

    def to_json(self) -> dict[str, Any]:
        def rows(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [
                {k: (v.to_json() if isinstance(v, Comparison) else v) for k, v in row.items()}
                for row in rs
            ]

        return {
            "schedule": self.schedule.label,
            "fixed": self.fixed.label,
            "rounds": self.rounds,
            "passed": self.passed,
            "headline": self.headline(),
            "rows": rows(self.rows),
            "corrections": [c.to_json() for c in self.corrections],
            "first_rows": rows(self.first) if self.corrections or self.fallback else None,
            "fallback": (
                {"emitted": self.fallback, "stuck": [c.to_json() for c in self.stuck]}
                if self.fallback
                else None
            ),
        }


async def verify(loads: Sequence[int], arms: Sequence[Arm], measure: Measure, rounds: int,
                 s: Settings | None = None, first_round: int = 0) -> Verification:  # fmt: skip
    """``arms`` = (baseline, schedule, fixed K): ``rounds`` rotated rounds at every load.
    ``first_round``: where the round numbers (and so the prompts' slices) start: a second
    verification runs on fresh prompts and its runs keep distinct cells."""
    s = s or Settings()
    base, sched, fixed = arms  # sched == base: speculation off everywhere, checked against fixed K
    arms = list(dict.fromkeys(arms))
    rows = []
    for load in loads:
        race = Race(load, measure, s)
        race.rounds = first_round
        for _ in range(rounds):
            await race.run(list(arms))
        rows.append(
            {
                "load": load,
                "schedule_vs_fixed": race.vs(sched, fixed),
                "schedule_vs_baseline": race.vs(sched, base),
                "fixed_vs_baseline": race.vs(fixed, base),
            }
        )
    return Verification(sched, fixed, rounds, rows, tolerance=s.tolerance)


class VerifyBudget(Protocol):
    def verify_plan(self, loads: Sequence[int], arms_at: Callable[[int], Sequence[Arm]],
                    new_engines: int) -> int: ...  # fmt: skip

    def correction_plan(self, loads: Sequence[int], arms_at: Callable[[int], Sequence[Arm]],
                        new_engines: int) -> int:  # fmt: skip
        """The corrected schedule's rounds; 0 where even the fewest that give a CI do not fit."""
        ...


@dataclass
class Answer:
    """What a tune emits (config None: run without one) and, unless skipped, its check."""

    picks: list[Pick]
    config: dict[str, Any] | None
    schedule: Schedule
    notes: list[str] = field(default_factory=list)
    verification: Verification | None = None


async def answer(results: Sequence[LoadResult], methods: Sequence[str],
                 method_cfgs: Mapping[str, Mapping[str, Any]], measure: Measure, s: Settings,
                 verify_rounds: int, budget: VerifyBudget | None = None,
                 register: Callable[[Arm, Mapping[str, Any] | None], None] = lambda a, c: None,
                 warm: Callable[[Arm], bool] = lambda a: True, check: bool = True) -> Answer:  # fmt: skip
    """The picks (harness/tune/schedule.py ``RULE``), the config, then the verification: its rounds
    from ``budget`` where given (``verify_plan``), else ``verify_rounds``. ``register``: the
    engine config of an arm the search did not have (the schedule, the fixed K); ``warm``: whether
    an arm's engine is running (the fixed K's usually is: it raced)."""
    chosen = picks(results, s.tolerance)
    notes = []
    for r, p in zip(results, chosen):
        if p.off:
            c = r.candidate(r.chosen)
            v = c.vs_baseline if c else None
            notes.append(
                f"load {r.load}: {r.chosen.label} led ({fmt_ratio(v)} vs the baseline, "
                f"n={v.n if v else 0}) after {r.rounds} rounds: {p.off}; K = 0 there"
            )
    config, schedule, more = build_config(chosen, method_cfgs)
    out = Answer(chosen, config, schedule, notes + more)
    tried = [m for m in methods if any(c.rounds for r in results for c in r.candidates
                                       if c.arm.method == m)]  # fmt: skip
    if not check or (config is None and not tried):
        return out
    if config is not None:
        m = config["method"]
        sched = Arm(m, config["num_speculative_tokens"], schedule)
        register(sched, config)
    else:  # off everywhere: checked against the best fixed K of the best method
        m = max(tried, key=lambda m: best_fixed_score(results, m))
        sched = BASELINE
    k = best_fixed_k(results, m)
    fixed = Arm(m, k)
    register(fixed, fixed_config(method_cfgs.get(m, {}), k))
    loads = [r.load for r in results]
    rounds = verify_rounds
    if budget is not None:

        def arms_at(load: int) -> list[Arm]:  # what a round there runs, for its time
            here = [k for a, b, k in schedule if a <= load <= b] or [0]
            return [BASELINE, Arm(m, here[0]) if sched.method else BASELINE, fixed]

        new = int(sched.method is not None) + int(not warm(fixed))
        rounds = budget.verify_plan(loads, arms_at, new)
    out.verification = await verify(loads, [BASELINE, sched, fixed], measure, rounds, s)
    out.verification.searched = searched_loads(results, fixed, s.tolerance)
    await _correct(out, method_cfgs, m, fixed, measure, s, verify_rounds, budget, register)
    return out


async def _correct(out: Answer, method_cfgs: Mapping[str, Mapping[str, Any]], m: str, fixed: Arm,
                   measure: Measure, s: Settings, verify_rounds: int, budget: VerifyBudget | None,
                   register: Callable[[Arm, Mapping[str, Any] | None], None]) -> None:  # fmt: skip
    """Where the verification failed at a load (or did not confirm it): that load's range set to
    the fixed K where it was shown faster than the baseline there, else to K = 0
    (harness/tune/correct.py), the corrected schedule against the baseline at those loads again
    (nothing to run where it is off everywhere), ``out`` updated to it."""
    v = out.verification
    assert v is not None
    fixes, stuck = corrections(v.rows, out.schedule, v.what, fixed, s.tolerance, v.searched)
    if stuck and _fall_back(out, stuck, method_cfgs.get(m, {}), fixed, s):
        return
    fixes = sorted([*fixes, *(replace(c, k_to=0) for c in stuck)], key=lambda c: c.load)
    if not fixes:
        return
    chosen = corrected_picks(out.picks, fixes, fixed)
    config, schedule, more = build_config(chosen, method_cfgs, m)
    sched = Arm(m, config["num_speculative_tokens"], schedule, "corrected") if config else BASELINE
    loads = [c.load for c in fixes]
    again: dict[int, Comparison] = {lo: IDENTICAL for lo in loads}  # off: the baseline itself
    why_not = ""
    if config is not None:
        register(sched, config)
        rounds = verify_rounds
        if budget is not None:
            rounds = budget.correction_plan(loads, lambda lo: [BASELINE, sched], 1)
        if rounds >= MIN_REPEATS:
            second = await verify(loads, [BASELINE, sched, sched], measure, rounds, s, v.rounds)
            again = {r["load"]: r["schedule_vs_baseline"] for r in second.rows}
        else:
            again = {lo: NOT_REMEASURED for lo in loads}
            why_not = "the time budget left no room for it"
    by = {c.load: c for c in fixes}
    rows = []
    for row in v.rows:
        c = by.get(row["load"])
        if c is None:
            rows.append(row)
            continue
        rows.append({**row, "schedule_vs_fixed": NOT_REMEASURED,
                     "schedule_vs_baseline": again[c.load],
                     "corrected": c.line().split(": ", 1)[1]})  # fmt: skip
    out.picks, out.config, out.schedule = chosen, config, schedule
    out.notes += [f"corrected by the verification: {c.line()}" for c in fixes]
    out.notes += [n for n in more if n not in out.notes]
    out.verification = Verification(sched, fixed, v.rounds, rows, fixes, v.rows, why_not,
                                    s.tolerance, v.searched)  # fmt: skip


def _fall_back(out: Answer, stuck: Sequence[Correction], method_cfg: Mapping[str, Any],
               fixed: Arm, s: Settings) -> bool:  # fmt: skip
    """Where a load's failure is ``stuck`` (no change of its K can fix it: harness/tune/correct.py
    ``corrections``): the fixed K's config in place of the schedule where it meets the schedule's
    bar at every load (``fixed_holds``: it ran in the same rounds, nothing to run again), else,
    where a stuck load already runs K = 0, no config (speculation off: the baseline itself).
    False where neither applies (a stuck load drafting the fixed K: set to K = 0 and verified
    again, as a correction)."""
    v = out.verification
    assert v is not None
    if fixed.k and fixed_holds(v.rows, s.tolerance, v.searched):
        how = "fixed K"
        config: dict[str, Any] | None = fixed_config(method_cfg, fixed.k)
        schedule = ranges([(r["load"], fixed.k) for r in v.rows])
        chosen = [replace(p, method=fixed.method, k=fixed.k, speedup=None, off="")
                  for p in out.picks]  # fmt: skip
        rows = [{**r, "schedule_vs_fixed": ITSELF, "schedule_vs_baseline": r["fixed_vs_baseline"]}
                for r in v.rows]  # fmt: skip
        sched = fixed
    elif any(c.k_from == 0 for c in stuck):
        how, config, schedule, sched = "off", None, (), BASELINE
        chosen = [replace(p, method=None, k=0, speedup=1.0, by_method={},
                          off="off: the schedule could not be corrected (verification)")
                  for p in out.picks]  # fmt: skip
        rows = [{**r, "schedule_vs_fixed": inverse(r["fixed_vs_baseline"]),
                 "schedule_vs_baseline": IDENTICAL} for r in v.rows]  # fmt: skip
    else:
        return False
    said = (
        f"fixed {fixed.label}'s config, never significantly slower than the baseline in the "
        "verification's rounds and more than the tolerance ahead of it at every load"
        if config
        else "no speculative_config (speculation off: the baseline itself)"
    )
    out.notes += [
        f"emitted in place of the schedule: {said}; the schedule could not be corrected at "
        f"{c.stuck_line()}"
        for c in stuck
    ]
    out.picks, out.config, out.schedule = chosen, config, schedule
    out.verification = Verification(sched, fixed, v.rounds, rows, [], v.rows, "", s.tolerance,
                                    v.searched, list(stuck), how)  # fmt: skip
    return True
