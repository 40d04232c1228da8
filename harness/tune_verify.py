"""`harness tune`'s check of its answer: the emitted schedule against the best fixed K and the
baseline, fresh interleaved rounds at every load (never the data that chose it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.stats import Comparison
from harness.tune import Arm, Measure, Race, Settings, fmt_ratio


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
            else f"beats fixed {self.fixed.label} at no load"
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
