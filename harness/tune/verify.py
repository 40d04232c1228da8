"""`harness tune`'s answer and its check: the search's results made into one speculative_config
(harness/tune/schedule.py), then the emitted schedule against the best fixed K and the baseline, fresh
interleaved rounds at every load (never the data that chose it), as many as the budget allows."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness.analysis.comparisons.stats import Comparison
from harness.tune.schedule import (
    Pick,
    Schedule,
    best_fixed_k,
    best_fixed_score,
    build_config,
    fixed_config,
    picks,
)
from harness.tune.search import BASELINE, Arm, LoadResult, Measure, Race, Settings, fmt_ratio


@dataclass
class Verification:
    """The emitted schedule against the best fixed K and the baseline, interleaved per load."""

    schedule: Arm
    fixed: Arm
    rounds: int
    rows: list[dict[str, Any]]  # load, schedule_vs_fixed, schedule_vs_baseline, fixed_vs_baseline

    @property
    def what(self) -> str:
        return "the schedule" if self.schedule.method else "speculation off"

    @property
    def failures(self) -> list[str]:
        out = []
        for row in self.rows:
            if row["schedule_vs_fixed"].lo is None or row["schedule_vs_baseline"].lo is None:
                n = min(row["schedule_vs_fixed"].n, row["schedule_vs_baseline"].n)
                out.append(
                    f"load {row['load']}: {self.what} was not measured ({n} paired rounds; "
                    "see stderr)"
                )
                continue
            for key, what in (("schedule_vs_fixed", f"fixed {self.fixed.label}"), ("schedule_vs_baseline",
                              "the baseline")):  # fmt: skip
                if row[key].verdict == "slower":
                    out.append(
                        f"load {row['load']}: {self.what} is slower than {what} "
                        f"({fmt_ratio(row[key])})"
                    )
        return out

    @property
    def passed(self) -> bool:
        return not self.failures

    def headline(self) -> str:
        if not self.passed:
            return "tune: verification FAILED: " + "; ".join(self.failures)
        wins = [r["load"] for r in self.rows if r["schedule_vs_fixed"].verdict == "faster"]
        gain = (
            f"beats fixed {self.fixed.label} at load {', '.join(map(str, wins))}"
            if wins
            else f"beats fixed {self.fixed.label} at none of the loads tuned"
        )
        return (
            f"tune: verified: {self.what} {gain} and is never significantly slower than it "
            f"or the baseline ({self.rounds} interleaved rounds per load)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule.label,
            "fixed": self.fixed.label,
            "rounds": self.rounds,
            "passed": self.passed,
            "headline": self.headline(),
            "rows": [
                {k: (v.to_json() if isinstance(v, Comparison) else v) for k, v in row.items()}
                for row in self.rows
            ],
        }


async def verify(loads: Sequence[int], arms: Sequence[Arm], measure: Measure, rounds: int,
                 s: Settings | None = None) -> Verification:  # fmt: skip
    """``arms`` = (baseline, schedule, fixed K): ``rounds`` rotated rounds at every load."""
    s = s or Settings()
    base, sched, fixed = arms  # sched == base: speculation off everywhere, checked against fixed K
    arms = list(dict.fromkeys(arms))
    rows = []
    for load in loads:
        race = Race(load, measure, s)
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
    return Verification(sched, fixed, rounds, rows)


class VerifyBudget(Protocol):
    def verify_plan(self, loads: Sequence[int], arms_at: Callable[[int], Sequence[Arm]],
                    new_engines: int) -> int: ...  # fmt: skip


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
    return out
