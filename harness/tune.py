"""Which speculative configuration (method, K) pays at which load, decided with paired CIs.

Per load: a pilot (the baseline and each method's probe, at its largest K) measures acceptance
per draft position; Leviathan et al.'s E(K) = 1 + sum_{i<K} a_i with a cost per draft token c
fitted to the probe's speedup predicts every other K from that one engine. A method predicted
more than ``prune_margin`` below the best (speculation off = 1.0) does not race, and is not
probed at larger loads if below 1 - ``prune_margin``; of a method's K, the best prediction races
with warm engines predicted within ``k_margin`` of it (one new engine per method and load, at
most ``max_engines`` in all). The rest race by successive elimination: every round measures
each live arm once (order rotated, so drift falls on all alike), paired by round; an arm
significantly slower than the leader by more than ``tolerance`` is dropped; the search stops when
one arm is left, or every live arm is within +-``tolerance`` of the leader (then the cheapest
wins: speculation off < ngram < a model; smaller K), or when ``max_rounds`` or the time budget is
spent (then the leader, called undecided). Measuring is a callback, so the search is tested
without engines.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

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


class Budget(Protocol):
    """Whether ``rounds`` more rounds of ``arms`` at ``load`` still leave time for the loads
    after it and the verification (harness/tune_plan.py: from the measured times)."""

    def fits(self, load: int, arms: Sequence[Arm], rounds: int, later: Sequence[int]) -> bool: ...


@dataclass(frozen=True)
class Settings:
    tolerance: float = 0.02  # +-: "within tolerance" = no difference worth a costlier arm
    prune_margin: float = 0.10  # a method predicted this far below the best (>= 1.0): not raced
    k_margin: float = 0.05  # a K predicted this far below its method's best: not raced
    keep_per_method: int = 2  # at most this many K per method race after the pilot
    new_per_method: int = 1  # of which at most this many start an engine (per load)
    max_engines: int = 7  # distinct arms the search may start (baseline and probes included)
    pilot_rounds: int = 1  # predictions after one round; a K joining the race still gets 3
    min_rounds: int = 3  # no decision before every live arm has this many paired rounds
    max_rounds: int = 4
    saturation_gain: float = 1.10  # a sweep stops once doubling the load gains less
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
    below: list[str] = field(default_factory=list)  # predicted < 1 - margin: not probed above
    baseline_tok_s: float | None = None  # geometric mean over the rounds
    note: str = ""  # why the sweep stopped here, if it did

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


class Race:
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
                    s: Settings = Settings(), started: set[Arm] | None = None,
                    budget: Budget | None = None, later: Sequence[int] = ()) -> LoadResult:  # fmt: skip
    """The best arm at one load (see the module docstring). ``started``: arms that have an
    engine (shared across loads: a warm engine within the margin is raced before a new one)."""
    race = Race(load, measure, s)
    started = set() if started is None else started
    cands: dict[Arm, Candidate] = {BASELINE: Candidate(BASELINE)}
    pilot = [BASELINE] + [Arm(m, max(ks)) for m, ks in methods.items() if ks]
    started.update(pilot)
    for i in range(s.pilot_rounds):
        if i:  # a method predicted far below 1 after the first round has told enough
            far = 1 - 2 * s.prune_margin
            pilot = [
                a for a in pilot if a == BASELINE or _best(predictions(race, methods)[0], a) >= far
            ]
        await race.run(pilot)
    predicted, c_fit = predictions(race, methods)
    live = [BASELINE, *select(methods, predicted, started, s, cands)]
    below = [
        m for m in methods
        if max((v for a, v in predicted.items() if a.method == m), default=0.0) < 1 - s.prune_margin
    ]  # fmt: skip
    verdict_line = ""
    if live == [BASELINE]:  # nothing is predicted to come near: no race to run
        cands[BASELINE].status = "chosen"
        top = max(predicted, key=lambda a: predicted[a], default=None)
        verdict_line = "baseline: every candidate predicted more than " + (
            f"{s.prune_margin:.0%} below speculation off (best: {top.label} {predicted[top]:.2f}x)"
            if top
            else "the margin below speculation off"
        )
    out_of_time = False
    while not verdict_line:
        ready = all(len(race.samples.get(a, {})) >= s.min_rounds for a in live)
        if ready:
            done, verdict_line = _decide(race, live, cands, s)
            if done:
                break
        if race.rounds >= s.max_rounds:
            break
        arms = sorted(set(live) | {BASELINE}, key=lambda a: a.label)
        if budget is not None and not budget.fits(load, arms, 1, later):
            out_of_time = True
            break
        await race.run(arms)
    for arm, cand in cands.items():
        cand.vs_baseline = race.vs(arm, BASELINE) if arm != BASELINE else None
        cand.rounds = len(race.samples.get(arm, {}))
    chosen = next((a for a, c in cands.items() if c.status == "chosen"), None)
    if chosen is None:  # the rounds (or the time budget) ran out first
        leader = _leader(race, live)
        for arm in live:
            cands[arm].status = "undecided"
            cands[arm].vs_leader = race.vs(arm, leader) if arm != leader else None
        cands[leader].status = "chosen"
        chosen = leader
        verdict_line = (
            f"undecided after {race.rounds} rounds"
            + (" (the time budget)" if out_of_time else "")
            + f": {leader.label} leads by its point estimate; "
            + ", ".join(a.label for a in live if a != leader)
            + " not separated from it"
        )
    rates = [x.tokens / x.seconds for x in race.samples.get(BASELINE, {}).values() if x.seconds > 0]
    rate = math.exp(float(np.mean(np.log(rates)))) if rates else None
    return LoadResult(load, chosen, verdict_line, race.rounds, list(cands.values()), c_fit,
                      below, rate)  # fmt: skip


def predictions(race: Race, methods: Mapping[str, Sequence[int]]
                ) -> tuple[dict[Arm, float], dict[str, float]]:  # fmt: skip
    """Every (method, K) predicted from its probe's acceptance and fitted c; c per method."""
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
    return predicted, c_fit


def _best(predicted: Mapping[Arm, float], arm: Arm) -> float:
    return max((v for a, v in predicted.items() if a.method == arm.method), default=0.0)


def select(methods: Mapping[str, Sequence[int]], predicted: Mapping[Arm, float],
           started: set[Arm], s: Settings, cands: dict[Arm, Candidate]) -> list[Arm]:  # fmt: skip
    """The arms that race after the pilot. A method races only if its best prediction is within
    ``prune_margin`` of the best overall (speculation off = 1.0); then its best-predicted K (a
    new engine only while fewer than ``max_engines`` were started; else the best warm one within
    ``k_margin``, else its probe), and warm K predicted within ``k_margin`` of that best, up to
    ``keep_per_method``: at most ``new_per_method`` new engines per method and load."""
    best = max([1.0, *predicted.values()])
    live: list[Arm] = []
    for m, ks in methods.items():
        arms = sorted((a for a in predicted if a.method == m), key=lambda a: (-predicted[a], a.k))
        for a in arms:
            cands[a] = Candidate(a, status="pruned", predicted=predicted[a])
        if not arms or predicted[arms[0]] < best * (1 - s.prune_margin):
            continue
        near = [a for a in arms if predicted[a] >= predicted[arms[0]] * (1 - s.k_margin)]
        near.sort(key=lambda a: (a != arms[0] and a not in started, -predicted[a], a.k))
        picked: list[Arm] = []
        new = 0
        for a in near:  # the best, then warm engines, then new ones while allowed
            fresh = a not in started
            if fresh and (new >= s.new_per_method or len(started) + new >= s.max_engines):
                continue
            picked.append(a)
            new += fresh
        picked = picked[: s.keep_per_method] or [Arm(m, max(ks))]  # the cap: the probe stands in
        started.update(picked)
        cands.setdefault(picked[0], Candidate(picked[0]))
        for a in picked:
            cands[a].status = "racing"
        live += picked
    return live


def _leader(race: Race, live: Sequence[Arm]) -> Arm:
    def score(a: Arm) -> float:
        r = race.vs(a, BASELINE).estimate if a != BASELINE else 1.0
        return -math.inf if r is None else r

    return max(live, key=lambda a: (score(a), [-x for x in a.cost]))


def _decide(race: Race, live: list[Arm], cands: dict[Arm, Candidate], s: Settings
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
            f"({fmt_ratio(race.vs(pick, leader))} of it) and cheaper"
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


def fmt_ratio(r: Comparison | None) -> str:
    if r is None or r.estimate is None:
        return "n/a"
    if r.lo is None:
        return f"{r.estimate:.2f}x (no CI)"
    return f"{r.estimate:.2f}x [{r.lo:.2f}, {r.hi:.2f}]"


async def tune(loads: Sequence[int], methods: Mapping[str, Sequence[int]], measure: Measure,
               s: Settings = Settings(), on_load: Callable[[LoadResult], None] | None = None,
               sweep: bool = False, budget: Budget | None = None) -> list[LoadResult]:  # fmt: skip
    """Every load in ascending order. A method predicted more than ``prune_margin`` below 1 at
    a load is not probed at larger ones (its gain falls with load: c grows as the target's step
    gets cheaper per token in a bigger batch). ``sweep``: ``loads`` is a doubling sweep that
    stops where the baseline's tokens/s gains < ``saturation_gain`` over the previous load (that
    load included; measured in the search's own baseline rounds, no separate probe); with a
    ``budget``, a load whose minimum (pilot + min_rounds) does not fit is not started."""
    out: list[LoadResult] = []
    started: set[Arm] = set()
    live = {m: tuple(ks) for m, ks in methods.items() if ks}
    order = sorted(set(loads))
    for i, load in enumerate(order):
        later = order[i + 1 :]
        pilot = [BASELINE] + [Arm(m, max(ks)) for m, ks in live.items()]
        if out and budget is not None and not budget.fits(load, pilot, s.min_rounds, later):
            out[-1].note = f"load {load} and above not tuned: the time budget"
            break
        r = await tune_load(load, live, measure, s, started, budget, later)
        out.append(r)
        live = {m: ks for m, ks in live.items() if m not in r.below}
        prev = out[-2].baseline_tok_s if len(out) > 1 else None
        if sweep and prev and r.baseline_tok_s and r.baseline_tok_s < prev * s.saturation_gain:
            r.note = (
                f"the sweep stops at load {load}: the baseline's tokens/s gained "
                f"{r.baseline_tok_s / prev - 1:+.0%} over load {out[-2].load} "
                f"(< {s.saturation_gain - 1:.0%})"
            )
        if on_load is not None:
            on_load(r)
        if r.note:
            break
    return out
