"""How long `harness tune` takes: said before it starts, and kept to while it runs.

A tune's cost is engine starts (one per arm: the baseline, each method's probe at its largest
K, the K that race, the schedule; the verification's fixed K is one of the search's) plus runs.
The counts have a worst case that follows from the settings alone (``worst_case``); the minutes
follow from measured times only, so ``TimeBudget`` records every start and run and, before each
round, says whether that round still leaves time for the minimum of the loads after it and for
the verification. Where it does not, the load stops undecided (said), or the sweep stops.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from harness.tune import BASELINE, Arm, Settings

DEFAULT_START_S = 30.0  # an in-process vLLM engine on 2 CPU cores, compile cache warm
DEFAULT_RUN_S = 15.0  # one run at load 1 before anything was measured


@dataclass(frozen=True)
class WorstCase:
    engines: int
    runs: int

    def line(self, loads: Sequence[int], methods: Mapping[str, Sequence[int]], budget_s: float,
             verify_rounds: int) -> str:  # fmt: skip
        ks = sorted({k for v in methods.values() for k in v})
        return (
            f"plan: loads {list(loads)} (fewer where the baseline saturates), "
            f"{', '.join(methods)} x K {' '.join(map(str, ks))}, {verify_rounds} verification "
            f"rounds: at most {self.engines} engines and {self.runs} runs; the budget is "
            f"{budget_s / 60:.0f} min (races stop undecided, or loads are left out, to keep it)"
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


@dataclass
class TimeBudget:
    """Wall-clock budget from measured times (see the module docstring)."""

    budget_s: float
    settings: Settings
    verify_rounds: int
    requests_per_run: Callable[[int], int]
    now: Callable[[], float] = time.monotonic
    t0: float = field(default=0.0)
    starts: list[float] = field(default_factory=list)
    runs: dict[tuple[Arm, int], list[float]] = field(default_factory=dict)
    started: set[Arm] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.t0 = self.now()

    def engine_started(self, arm: Arm, seconds: float) -> None:
        self.started.add(arm)
        self.starts.append(seconds)

    def ran(self, arm: Arm, load: int, seconds: float, once: float = 0.0) -> None:
        """A run's seconds; ``once``: what its engine's first use added (the warm-up)."""
        self.runs.setdefault((arm, load), []).append(seconds)
        if once and self.starts:
            self.starts[-1] += once

    @property
    def elapsed(self) -> float:
        return self.now() - self.t0

    def start_s(self) -> float:
        return sum(self.starts) / len(self.starts) if self.starts else DEFAULT_START_S

    def run_s(self, arm: Arm, load: int) -> float:
        """Measured at this load; else scaled from the nearest load it ran at by the number of
        requests over sqrt(load) (tokens/s assumed to grow as the square root of the load, less
        than a memory-bound decode gains from batching); else as its method's probe, else as
        the baseline, else ``DEFAULT_RUN_S``."""
        for a in (arm, *(b for b, _ in self.runs if b.method == arm.method), BASELINE):
            got = {lo: t for (b, lo), t in self.runs.items() if b == a and t}
            if got:
                near = min(got, key=lambda lo: (abs(lo - load), lo))
                return sum(got[near]) / len(got[near]) * self._scale(near, load)
        return DEFAULT_RUN_S * self._scale(1, load)

    def _scale(self, a: int, b: int) -> float:
        return self.requests_per_run(b) / self.requests_per_run(a) * (a / b) ** 0.5

    def need_s(self, load: int, arms: Sequence[Arm], rounds: int, later: Sequence[int]) -> float:
        """Seconds for ``rounds`` rounds of ``arms`` here, the minimum of every later load
        (``min_rounds`` of the baseline and the fastest speculative arm: a decision) and the
        verification (the baseline and twice that arm per round, one more engine)."""
        s = self.settings
        here = rounds * sum(self.run_s(a, load) for a in arms)
        here += self.start_s() * len([a for a in arms if a not in self.started])
        spec = [a for a in arms if a.method is not None]
        fast = min(spec, key=lambda a: self.run_s(a, load)) if spec else BASELINE
        per_round = {lo: self.run_s(BASELINE, lo) + self.run_s(fast, lo) for lo in later}
        rest = s.min_rounds * sum(per_round.values())
        verify = self.start_s() + sum(
            self.verify_rounds * (self.run_s(BASELINE, lo) + 2 * self.run_s(fast, lo))
            for lo in [load, *later]
        )
        return here + rest + verify

    def fits(self, load: int, arms: Sequence[Arm], rounds: int, later: Sequence[int]) -> bool:
        return self.elapsed + self.need_s(load, arms, rounds, later) <= self.budget_s

    def line(self, load: int, live: Sequence[Arm], later: Sequence[int]) -> str:
        """After a load: what was measured and what the rest is estimated to cost."""
        times = ", ".join(f"{a.label} {self.run_s(a, load):.0f} s" for a in live)
        left = self.need_s(load, live, 0, later) if later else self.need_s(load, [], 0, [])
        return (
            f"plan: after load {load}: {len(self.started)} engines started "
            f"(mean start {self.start_s():.0f} s), runs at load {load}: {times}; "
            f"{self.elapsed / 60:.1f} min spent, about {left / 60:.1f} min left at least "
            f"(budget {self.budget_s / 60:.0f} min)"
        )
