"""How long `harness tune` takes: said before it starts, and kept to while it runs.

A tune's cost is engine starts (one per arm: the baseline, each method's probe at its largest
K, the K that race, the schedule; the verification's fixed K is one of the search's) plus runs.
The counts have a worst case that follows from the settings alone (``worst_case``). The minutes
follow from times measured in this tune only: ``TimeBudget`` records every engine start and
every run, and before each load and each race round checks that what it is about to do still
leaves the reserve: the verification of every load tuned or still to tune (per load, the
measured runs of the baseline and of the slowest arm that raced, for the schedule and the fixed
K, times the verification rounds, plus the schedule's engine start) and the minimum of the
later loads that still fit. The budget is the tune's wall time from the tune command's start
(a clock taken once there: engine starts, search, verification), less ``FILES_MARGIN_S`` for
closing engines and writing files; the interpreter's start-up before it (a few seconds) falls in
that margin. Not the process's age: a tune called from a notebook or a test run that started
long before would find its budget spent before it began. What gives, in order: rounds past a load's minimum (a CI), later loads (left
out, the sweep stops), then the verification's rounds (down to 3, the fewest that give a CI);
past that it says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from harness.analysis.comparisons.stats import MIN_REPEATS
from harness.tune.search import BASELINE, Arm, Settings

DEFAULT_START_S = 30.0  # an in-process vLLM engine on 2 CPU cores: only before one was measured
DEFAULT_RUN_S = 15.0  # one run at load 1 before anything was measured
FILES_MARGIN_S = 30.0  # closing engines and writing files, with room (docs/measurements.md)


@dataclass(frozen=True)
class WorstCase:
    engines: int
    runs: int

    def line(self, loads: Sequence[int], methods: Mapping[str, Sequence[int]], budget_s: float,
             verify_rounds: int, margin_s: float = FILES_MARGIN_S) -> str:  # fmt: skip
        ks = sorted({k for v in methods.values() for k in v})
        return (
            f"plan: the budget is {budget_s / 60:.1f} min of wall time for the whole tune, from "
            f"the tune's start (engine starts, search and verification; its last "
            f"{margin_s:.0f} s kept for closing engines and writing files), kept from times "
            f"measured as it runs: rounds stop undecided, loads are left out, then verification "
            f"rounds go down to {MIN_REPEATS}; loads {list(loads)} (fewer where the baseline "
            f"saturates), {', '.join(methods)} x K {' '.join(map(str, ks))}, {verify_rounds} "
            f"verification rounds: at most {self.engines} engines and {self.runs} runs"
        )


def worst_case(loads: Sequence[int], methods: Mapping[str, Sequence[int]], s: Settings,
               verify_rounds: int) -> WorstCase:  # fmt: skip
    """Engines: the baseline, every (method, K) up to ``max_engines``, the schedule. Runs per
    load: the pilot (baseline + a probe per method) then every race round with each method's
    ``keep_per_method`` K; the verification: 3 arms x ``verify_rounds`` per load."""
    m = len(methods)
    arms = 1 + sum(len(ks) for ks in methods.values())
    engines = min(arms, max(s.max_engines, 1 + m)) + 1
    per_load = s.pilot_rounds * (1 + m) + (s.max_rounds - s.pilot_rounds) * (
        1 + sum(min(s.keep_per_method, len(ks)) for ks in methods.values())
    )
    return WorstCase(engines, len(loads) * (per_load + 3 * verify_rounds))


def _mins(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


@dataclass
class TimeBudget:
    """Wall-clock budget from measured times (see the module docstring). ``t0``: the tune's
    start on ``now``'s scale (None: when this is made); ``say``: where its decisions are said."""

    budget_s: float
    settings: Settings
    verify_rounds: int
    requests_per_run: Callable[[int], int]
    now: Callable[[], float] = time.monotonic
    t0: float | None = None
    margin_s: float = FILES_MARGIN_S
    say: Callable[[str], None] | None = None
    starts: list[float] = field(default_factory=list)
    runs: dict[tuple[Arm, int], list[float]] = field(default_factory=dict)
    started: set[Arm] = field(default_factory=set)
    tuned: list[int] = field(default_factory=list)  # loads started: the verification runs there
    pilot: list[Arm] = field(default_factory=list)  # the last load's pilot: a later one's
    contenders: dict[int, set[Arm]] = field(default_factory=dict)  # load -> arms that raced
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.t0 is None:
            self.t0 = self.now()

    # ---- what was measured ------------------------------------------------------------------
    def engine_started(self, arm: Arm, seconds: float) -> None:
        self.started.add(arm)
        self.starts.append(seconds)

    def ran(self, arm: Arm, load: int, seconds: float, once: float = 0.0) -> None:
        """A run's wall seconds; ``once``: what its engine's first use added (the warm-up)."""
        self.runs.setdefault((arm, load), []).append(seconds)
        if once and self.starts:
            self.starts[-1] += once

    @property
    def elapsed(self) -> float:
        return self.now() - float(self.t0 or 0.0)

    @property
    def limit_s(self) -> float:
        """Where the verification must have ended: the budget less the margin for the files."""
        return self.budget_s - self.margin_s

    def left_s(self) -> float:
        return self.limit_s - self.elapsed

    # ---- estimates from it --------------------------------------------------------------------
    def start_s(self) -> float:
        """The mean engine start, its warm-up included."""
        return sum(self.starts) / len(self.starts) if self.starts else DEFAULT_START_S

    def run_s(self, arm: Arm, load: int) -> float:
        """Measured at this load (the mean of its runs); else scaled from the nearest load it
        ran at by the number of requests over sqrt(load) (tokens/s assumed to grow as the square
        root of the load: a memory-bound decode gains at least that); else as its method's probe, else as
        the baseline, else ``DEFAULT_RUN_S``."""
        for a in (arm, *(b for b, _ in self.runs if b.method == arm.method), BASELINE):
            got = {lo: t for (b, lo), t in self.runs.items() if b == a and t}
            if got:
                near = min(got, key=lambda lo: (abs(lo - load), lo))
                return sum(got[near]) / len(got[near]) * self._scale(near, load)
        return DEFAULT_RUN_S * self._scale(1, load)

    def _scale(self, a: int, b: int) -> float:
        return self.requests_per_run(b) / self.requests_per_run(a) * (a / b) ** 0.5

    def _spec_s(self, load: int) -> float:
        """A run of the schedule or the fixed K here: the slowest speculative arm that raced at
        this load (either may be it; at a load not raced yet, at the last one raced), else the
        slowest probe that ran, else the baseline."""
        last = self.contenders[max(self.contenders)] if self.contenders else set()
        arms = self.contenders.get(load) or last or {a for a, _ in self.runs if a.method}
        return max((self.run_s(a, load) for a in arms), default=self.run_s(BASELINE, load))

    def verify_load_s(self, load: int, rounds: int | None = None) -> float:
        """The verification at one load: its rounds of the baseline, the schedule, fixed K."""
        r = self.verify_rounds if rounds is None else rounds
        return r * (self.run_s(BASELINE, load) + 2 * self._spec_s(load))

    def verify_s(self, loads: Sequence[int], rounds: int | None = None) -> float:
        """The verification at ``loads`` and the schedule's engine start (the fixed K's is warm),
        and the reserve for one correction (``correction_s``)."""
        loads = sorted(set(loads))
        return sum(self.verify_load_s(lo, rounds) for lo in loads) + (
            self.start_s() + self.correction_s(loads) if loads else 0
        )

    def correction_s(self, loads: Sequence[int],
                     schedule_at: Callable[[int], Arm | None] | None = None) -> float:  # fmt: skip
        """Where the verification fails at a load, the corrected schedule is verified there again
        (harness/tune/correct.py): its engine start and the fewest rounds that give a CI of it
        and the baseline, at the costliest of ``loads`` (``correction_round_s``)."""
        return self.start_s() + MIN_REPEATS * max(
            (self.correction_round_s(lo, schedule_at) for lo in loads), default=0.0
        )

    def correction_round_s(self, load: int,
                           schedule_at: Callable[[int], Arm | None] | None = None) -> float:  # fmt: skip
        """One round of a correction at ``load``: the baseline and the corrected schedule, whose
        K there is one shown faster than the baseline (the fixed K) or 0, so its run is taken as
        the emitted arm's (``schedule_at``: the schedule's arm at that load, None where it does
        not draft; in the search, the fastest speculative arm measured there: the one that would
        be emitted), floored at the baseline's run (K = 0 runs the target's steps too). Not the
        slowest arm raced: a draft model 1.7x the baseline's time is never what a correction
        reruns."""
        base = self.run_s(BASELINE, load)
        if schedule_at is not None:
            arm = schedule_at(load)
            spec = self.run_s(arm, load) if arm is not None else base
        else:
            here = [t for (a, lo), t in self.runs.items() if lo == load and a.method and t]
            spec = min((sum(t) / len(t) for t in here), default=base)
        return base + max(base, spec)

    def _starts_s(self, arms: Sequence[Arm]) -> float:
        return self.start_s() * len([a for a in set(arms) if a not in self.started])

    def minimum_s(self, load: int, pilot: Sequence[Arm] | None = None) -> float:
        """A load's minimum: its pilot, then a decision between the baseline and one arm (to
        ``min_rounds`` rounds), one new engine for it."""
        s, pilot = self.settings, self.pilot if pilot is None else pilot
        here = s.pilot_rounds * sum(self.run_s(a, load) for a in pilot) + self._starts_s(pilot)
        rest = max(0, s.min_rounds - s.pilot_rounds)
        return here + rest * (self.run_s(BASELINE, load) + self._spec_s(load)) + self.start_s()

    def later_fit(self, later: Sequence[int], used_s: float) -> tuple[list[int], float]:
        """The later loads, in order, whose minimum and verification fit after ``used_s`` more
        seconds (the first that does not fit ends the sweep), and what they need."""
        keep: list[int] = []
        need = 0.0
        for lo in sorted(later):
            cost = self.minimum_s(lo) + self.verify_load_s(lo)
            if self.elapsed + used_s + need + cost > self.limit_s:
                break
            keep.append(lo)
            need += cost
        return keep, need

    # ---- the decisions ------------------------------------------------------------------------
    def _said(self, line: str) -> None:
        if line in self.lines:
            return
        self.lines.append(line)
        if self.say is not None:
            self.say(line)

    def start_load(self, load: int, pilot: Sequence[Arm], later: Sequence[int]) -> bool:
        """Whether ``load`` can be tuned: its minimum and its verification fit beside the
        verification of the loads tuned before it. The first load runs even where it does not
        (there is no answer otherwise): then it says the tune will run over."""
        self.pilot = list(pilot)
        if not self.runs:  # nothing measured yet: the first load runs, its times decide the rest
            self.tuned.append(load)
            return True
        need = self.minimum_s(load, pilot) + self.verify_s([*self.tuned, load])
        ok = self.elapsed + need <= self.limit_s
        first = not self.tuned
        if ok or first:
            self.tuned.append(load)
        if not ok:
            what = f"load {load}" + (" and above" if later else "")
            self._said(
                f"plan: {what} {'over the budget' if first else 'left out'}: its "
                f"minimum (pilot and a decision, {_mins(self.minimum_s(load, pilot))}) and the "
                f"verification of loads {sorted({*self.tuned, load})} "
                f"({_mins(self.verify_s([*self.tuned, load]))}) need {_mins(need)}, "
                f"{_mins(self.left_s())} left"
                + (": the tune will run over its budget" if first else "")
            )
        return ok

    def next_round(self, load: int, arms: Sequence[Arm], short: int, later: Sequence[int]) -> bool:
        """One more race round of ``arms`` at ``load``: see tune.Budget."""
        self.contenders.setdefault(load, set()).update(a for a in arms if a.method is not None)
        one = sum(self.run_s(a, load) for a in arms)
        starts = self._starts_s(arms)
        verify = self.verify_s(self.tuned)
        if short > 0:  # the load's minimum comes before later loads
            need = starts + short * one + verify
            why = (
                f"the {short} rounds it still needs for a CI ({_mins(starts + short * one)}) and "
                f"the verification of loads {self.tuned} ({_mins(verify)})"
            )
        else:
            keep, reserve = self.later_fit(later, verify)  # kept before this round is run
            need = starts + one + verify + reserve
            why = f"one more round ({starts + one:.0f} s) and the reserve ({self._reserve(keep)})"
        ok = self.elapsed + need <= self.limit_s
        if not ok:
            self._said(
                f"plan: load {load}: the race stops: {why} need {_mins(need)}, "
                f"{_mins(self.left_s())} left"
            )
        return ok

    def verify_plan(self, loads: Sequence[int], arms_at: Callable[[int], Sequence[Arm]],
                    new_engines: int) -> int:  # fmt: skip
        """The verification's rounds: ``verify_rounds``, fewer where they do not fit (down to
        the fewest that give a CI); said, with what it is estimated to cost, and said again
        where even those do not fit."""
        per_round = sum(self.run_s(a, lo) for lo in loads for a in dict.fromkeys(arms_at(lo)))
        starts = new_engines * self.start_s()
        least = min(MIN_REPEATS, self.verify_rounds)

        def drafts(lo: int) -> Arm | None:  # the schedule's arm there; None: K = 0, off
            arm = list(arms_at(lo))[1]
            return arm if arm.method and arm.k else None

        fix = self.correction_s(loads, drafts)  # kept for a correction, where one is needed
        rounds = next(
            (r for r in range(self.verify_rounds, least - 1, -1)
             if starts + r * per_round + fix <= self.left_s()),
            least,
        )  # fmt: skip
        need = starts + rounds * per_round
        line = (
            f"plan: verification: {rounds} rounds at loads {list(loads)}, about {_mins(need)} "
            f"(measured runs x rounds + {new_engines} engine start), {_mins(self.left_s())} left"
        )
        if rounds < self.verify_rounds:
            line += f"; fewer than the {self.verify_rounds} asked, to keep the budget"
        if need > self.left_s():
            line += (
                f"; even {rounds} rounds (the fewest that give a CI) do not fit: the tune runs "
                f"about {_mins(need - self.left_s())} over its budget"
            )
        self._said(line)
        return rounds

    def correction_plan(self, loads: Sequence[int], arms_at: Callable[[int], Sequence[Arm]],
                        new_engines: int) -> int:  # fmt: skip
        """The corrected schedule's rounds at ``loads``: ``verify_rounds``, fewer where they do
        not fit, 0 where even the fewest that give a CI do not (then it is not verified: said)."""
        per_round = sum(self.run_s(a, lo) for lo in loads for a in dict.fromkeys(arms_at(lo)))
        starts = new_engines * self.start_s()
        least = min(MIN_REPEATS, self.verify_rounds)
        rounds = next(
            (r for r in range(self.verify_rounds, least - 1, -1)
             if starts + r * per_round <= self.left_s()),
            0,
        )  # fmt: skip
        self._said(
            f"plan: correction: {rounds} rounds at loads {list(loads)}, about "
            f"{_mins(starts + rounds * per_round)}, {_mins(self.left_s())} left"
            + ("" if rounds else f" (the fewest that give a CI, {least}, do not fit)")
        )
        return rounds

    def _reserve(self, keep: Sequence[int]) -> str:
        """What is held back: the verification of every load tuned or kept, the kept loads'
        minimum."""
        verify = self.verify_s([*self.tuned, *keep])
        mins = sum(self.minimum_s(lo) for lo in keep)
        return f"the verification of loads {sorted({*self.tuned, *keep})}: {_mins(verify)}" + (
            f"; loads {list(keep)} at their minimum: {_mins(mins)}" if keep else ""
        )

    def line(self, load: int, live: Sequence[Arm], later: Sequence[int]) -> str:
        """After a load: what was measured, and what is reserved for the rest."""
        times = ", ".join(f"{a.label} {self.run_s(a, load):.0f} s" for a in live)
        keep, _ = self.later_fit(later, self.verify_s(self.tuned))
        out = [lo for lo in later if lo not in keep]
        return (
            f"plan: after load {load}: {len(self.started)} engines started "
            f"(mean start {self.start_s():.0f} s), runs at load {load}: {times}; "
            f"{_mins(self.elapsed)} spent of {_mins(self.limit_s)}; reserved: "
            f"{self._reserve(keep)} (at {self.verify_rounds} verification rounds, from measured "
            f"times)" + (f"; loads {out} do not fit" if out else "")
        )
