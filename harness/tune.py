"""Which speculative configuration (method, K) pays at which load, decided with paired CIs.

Per load: a pilot (the baseline and each method at its largest K) measures acceptance per draft
position; Leviathan et al.'s E(K) = 1 + sum_{i<K} a_i with a cost per draft token c fitted to the
pilot's speedup predicts every other K, and K predicted to lose more than ``prune_margin`` to the
best prediction are not measured. The rest race by successive elimination: every round measures
each live arm once (order rotated, so drift falls on all alike), paired by round; an arm
significantly slower than the leader by more than ``tolerance`` is dropped; the search stops when
one arm is left, or every live arm is within +-``tolerance`` of the leader (then the cheapest
wins: speculation off < ngram < a model; smaller K), or when ``max_rounds`` is spent (then the
leader, called undecided). Measuring is a callback, so the search is tested without engines.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.stats import Comparison, compare_log_ratios

COST_RANK = {None: 0, "ngram": 1, "suffix": 2, "mtp": 3, "eagle3": 3, "eagle": 3, "draft_model": 4}


@dataclass(frozen=True)
class Arm:
    """One engine configuration: speculation off (method None), (method, K), or a schedule."""

    method: str | None = None
    k: int = 0
    schedule: tuple[tuple[int, int, int], ...] | None = None

    @property
    def label(self) -> str:
        if self.method is None:
            return "baseline"
        return "schedule" if self.schedule else f"{self.method}(k={self.k})"

    @property
    def cost(self) -> tuple[int, int]:
        return (COST_RANK.get(self.method, 5), self.k)


BASELINE = Arm()


@dataclass(frozen=True)
class Sample:
    """One arm's run in one round: output tokens over wall seconds, acceptance per position
    (vLLM's ``num_accepted_tokens_per_pos / num_drafts``: P(the first i+1 drafts accepted))."""

    tokens: float
    seconds: float
    acceptance_per_pos: tuple[float, ...] = ()


# (load, arms in the order to run them, round index) -> a sample per arm that ran
Measure = Callable[[int, Sequence[Arm], int], Awaitable[Mapping[Arm, Sample]]]


@dataclass(frozen=True)
class Settings:
    tolerance: float = 0.02  # +-: "within tolerance" = no difference worth a costlier arm
    prune_margin: float = 0.10  # not measured: predicted this far below the best prediction
    keep_per_method: int = 2  # at most this many K per method race after the pilot
    pilot_rounds: int = 2
    min_rounds: int = 3  # no decision before every live arm has this many paired rounds
    max_rounds: int = 8
    seed: int = 0


@dataclass
class Candidate:
    arm: Arm
    status: str = "racing"  # pruned | eliminated | chosen | within tolerance | undecided | off
    predicted: float | None = None
    vs_baseline: Comparison | None = None
    vs_leader: Comparison | None = None
    rounds: int = 0


@dataclass
class LoadResult:
    load: int
    chosen: Arm
    verdict: str  # one line: why this arm
    rounds: int
    candidates: list[Candidate]
    c_fit: dict[str, float] = field(default_factory=dict)  # method -> fitted cost per draft

    def candidate(self, arm: Arm) -> Candidate | None:
        return next((c for c in self.candidates if c.arm == arm), None)


def compare(a: Mapping[int, Sample], b: Mapping[int, Sample], tol: float) -> Comparison:
    """Tokens/s of ``a`` over ``b``, paired by round (both ran in it): the harness's comparison
    (harness/stats.py: a t-interval on per-round log ratios, the round being the unit)."""
    logs = [
        math.log((a[r].tokens / a[r].seconds) / (b[r].tokens / b[r].seconds))
        for r in sorted(set(a) & set(b))
        if a[r].seconds > 0 and b[r].seconds > 0 and a[r].tokens > 0 and b[r].tokens > 0
    ]
    return compare_log_ratios("output_tok_s", logs, tol)


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """Tokens per target pass with K drafts: 1 + the chance that each of the first K is kept."""
    return 1.0 + float(sum(acceptance[:k]))


def fit_cost(acceptance: Sequence[float], k: int, speedup: float) -> float:
    """c, the cost of one draft token relative to a target pass, that makes E(K)/(1 + K c)
    equal the measured speedup at this load (draft and verification overhead together)."""
    if speedup <= 0 or k <= 0:
        return math.inf
    return max(0.0, (expected_tokens(acceptance, k) / speedup - 1.0) / k)


def predict(acceptance: Sequence[float], k: int, c: float) -> float:
    return expected_tokens(acceptance, k) / (1.0 + k * c)


def _mean_acceptance(samples: Sequence[Sample]) -> list[float]:
    vecs = [s.acceptance_per_pos for s in samples if s.acceptance_per_pos]
    if not vecs:
        return []
    n = max(len(v) for v in vecs)
    return [float(np.mean([v[i] if i < len(v) else 0.0 for v in vecs])) for i in range(n)]


class _Race:
    """The state of one load's search: samples by arm and round, rounds run so far."""

    def __init__(self, load: int, measure: Measure, s: Settings):
        self.load, self.measure, self.s = load, measure, s
        self.samples: dict[Arm, dict[int, Sample]] = {}
        self.rounds = 0
        self.rng = random.Random(s.seed * 100003 + load)
        self._cache: dict[tuple[Arm, Arm, int], Comparison] = {}

    async def run(self, arms: Sequence[Arm]) -> None:
        shift = self.rng.randrange(len(arms))  # a new rotation every round
        order = list(arms[shift:]) + list(arms[:shift])
        got = await self.measure(self.load, order, self.rounds)
        for arm in order:
            if arm in got:
                self.samples.setdefault(arm, {})[self.rounds] = got[arm]
        self.rounds += 1

    def vs(self, a: Arm, b: Arm) -> Comparison:
        key = (a, b, self.rounds)
        if key not in self._cache:
            sa, sb = self.samples.get(a, {}), self.samples.get(b, {})
            self._cache[key] = compare(sa, sb, self.s.tolerance)
        return self._cache[key]


async def tune_load(load: int, methods: Mapping[str, Sequence[int]], measure: Measure,
                    s: Settings = Settings()) -> LoadResult:  # fmt: skip
    """The best arm at one load (see the module docstring)."""
    race = _Race(load, measure, s)
    cands: dict[Arm, Candidate] = {BASELINE: Candidate(BASELINE)}
    pilot = [BASELINE] + [Arm(m, max(ks)) for m, ks in methods.items() if ks]
    for _ in range(s.pilot_rounds):
        await race.run(pilot)
    c_fit: dict[str, float] = {}
    predicted: dict[Arm, float] = {}
    for m, ks in methods.items():
        top = Arm(m, max(ks))
        measured = race.vs(top, BASELINE).estimate
        acc = _mean_acceptance(list(race.samples.get(top, {}).values()))
        if measured is None or not acc:
            predicted[top] = measured if measured is not None else 0.0
            continue
        c_fit[m] = fit_cost(acc, top.k, measured)
        for k in ks:
            predicted[Arm(m, k)] = predict(acc, k, c_fit[m])
    best = max([1.0, *predicted.values()])
    live = [BASELINE]
    for m in methods:
        arms = sorted((a for a in predicted if a.method == m), key=lambda a: -predicted[a])
        for i, arm in enumerate(arms):
            cands[arm] = Candidate(arm, predicted=predicted[arm])
            if i < s.keep_per_method and predicted[arm] >= best * (1 - s.prune_margin):
                live.append(arm)
            else:
                cands[arm].status = "pruned"
    verdict_line = ""
    if live == [BASELINE]:  # nothing is predicted to come near: no race to run
        cands[BASELINE].status = "chosen"
        top = max(predicted, key=lambda a: predicted[a], default=None)
        verdict_line = "baseline: every candidate predicted more than " + (
            f"{s.prune_margin:.0%} below speculation off (best: {top.label} {predicted[top]:.2f}x)"
            if top
            else "the margin below speculation off"
        )
    while not verdict_line:
        ready = all(len(race.samples.get(a, {})) >= s.min_rounds for a in live)
        if ready:
            done, verdict_line = _decide(race, live, cands, s)
            if done:
                break
        if race.rounds >= s.max_rounds:
            break
        await race.run(sorted(set(live) | {BASELINE}, key=lambda a: a.label))
    for arm, cand in cands.items():
        cand.vs_baseline = race.vs(arm, BASELINE) if arm != BASELINE else None
        cand.rounds = len(race.samples.get(arm, {}))
    chosen = next((a for a, c in cands.items() if c.status == "chosen"), None)
    if chosen is None:  # the budget ran out first
        leader = _leader(race, live)
        for arm in live:
            cands[arm].status = "undecided"
            cands[arm].vs_leader = race.vs(arm, leader) if arm != leader else None
        cands[leader].status = "chosen"
        chosen = leader
        verdict_line = (
            f"undecided after {race.rounds} rounds: {leader.label} leads by its point estimate; "
            + ", ".join(a.label for a in live if a != leader)
            + " not separated from it"
        )
    return LoadResult(load, chosen, verdict_line, race.rounds, list(cands.values()), c_fit)


def _leader(race: _Race, live: Sequence[Arm]) -> Arm:
    def score(a: Arm) -> float:
        r = race.vs(a, BASELINE).estimate if a != BASELINE else 1.0
        return -math.inf if r is None else r

    return max(live, key=lambda a: (score(a), [-x for x in a.cost]))


def _decide(race: _Race, live: list[Arm], cands: dict[Arm, Candidate], s: Settings
            ) -> tuple[bool, str]:  # fmt: skip
    """One elimination step; (stop, why)."""
    leader = _leader(race, live)
    cands[leader].vs_leader = None
    tol = s.tolerance
    same: list[Arm] = []
    open_: list[Arm] = []
    for arm in list(live):
        if arm == leader:
            continue
        r = race.vs(arm, leader)
        cands[arm].vs_leader = r
        if r.lo is None or r.hi is None or r.estimate is None:
            open_.append(arm)
        elif r.verdict == "slower":
            cands[arm].status = "eliminated"
            live.remove(arm)
        elif r.verdict.startswith("within") or (r.lo >= 1 - tol and r.hi <= 1 + tol):
            same.append(arm)  # significant but small, or a CI inside +-tol
        else:
            open_.append(arm)
    if open_:
        return False, ""
    pick = min([leader, *same], key=lambda a: a.cost)
    for arm in same:
        cands[arm].status = "within tolerance"
    cands[pick].status = "chosen"
    if pick != leader:
        cands[leader].status = "within tolerance"
        why = (
            f"{pick.label}: within +-{tol:.0%} of the leader {leader.label} "
            f"({_fmt(race.vs(pick, leader))} of it) and cheaper"
        )
    elif same:
        why = (
            f"{pick.label}: the leader; "
            + ", ".join(a.label for a in same)
            + f" within +-{tol:.0%} of it, none cheaper"
        )
    else:
        why = f"{pick.label}: significantly ahead of every other candidate"
    return True, why


def _fmt(r: Comparison | None) -> str:
    if r is None or r.estimate is None:
        return "n/a"
    if r.lo is None:
        return f"{r.estimate:.2f}x (no CI)"
    return f"{r.estimate:.2f}x [{r.lo:.2f}, {r.hi:.2f}]"


async def tune(loads: Sequence[int], methods: Mapping[str, Sequence[int]], measure: Measure,
               s: Settings = Settings(), on_load: Callable[[LoadResult], None] | None = None,
               ) -> list[LoadResult]:  # fmt: skip
    out = []
    for load in loads:
        out.append(await tune_load(load, methods, measure, s))
        if on_load is not None:
            on_load(out[-1])
    return out


async def saturation_loads(measure: Measure, up_to: int, gain: float = 1.10) -> list[int]:
    """1, 2, 4, ... until doubling the load raises the baseline's tokens/s by less than
    ``gain`` (that load included), or ``up_to``: where more in flight stops buying throughput."""
    loads: list[int] = []
    rate = None
    load = 1
    while load <= up_to:
        got = await measure(load, [BASELINE], -1)
        s = got.get(BASELINE)
        loads.append(load)
        new = s.tokens / s.seconds if s and s.seconds > 0 else None
        if rate is not None and new is not None and new < rate * gain:
            break
        rate = new
        load *= 2
    return loads


@dataclass
class Verification:
    """The emitted schedule against the best fixed K and the baseline, interleaved per load."""

    schedule: Arm
    fixed: Arm
    rounds: int
    rows: list[dict[str, Any]]  # load, schedule_vs_fixed, schedule_vs_baseline, fixed_vs_baseline

    @property
    def failures(self) -> list[str]:
        out = []
        for row in self.rows:
            if row["schedule_vs_fixed"].lo is None or row["schedule_vs_baseline"].lo is None:
                n = min(row["schedule_vs_fixed"].n, row["schedule_vs_baseline"].n)
                out.append(
                    f"load {row['load']}: the schedule was not measured ({n} paired rounds; "
                    "see stderr)"
                )
                continue
            for key, what in (("schedule_vs_fixed", f"fixed {self.fixed.label}"), ("schedule_vs_baseline",
                              "the baseline")):  # fmt: skip
                if row[key].verdict == "slower":
                    out.append(
                        f"load {row['load']}: the schedule is slower than {what} ({_fmt(row[key])})"
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
            f"tune: verified: the schedule {gain} and is never significantly slower than it "
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
                 s: Settings = Settings()) -> Verification:  # fmt: skip
    """``arms`` = (baseline, schedule, fixed K): ``rounds`` rotated rounds at every load."""
    base, sched, fixed = arms
    rows = []
    for load in loads:
        race = _Race(load, measure, s)
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
