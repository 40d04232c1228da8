"""`harness tune`'s vocabulary and its unit of measurement: an arm (an engine configuration),
a sample (one run), a candidate's standing, a load's result, and the race, whose rounds pair
every live arm (order rotated, so drift falls on all alike) for the harness's paired CIs."""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from harness.analysis.comparisons.stats import Comparison, compare_log_ratios

COST_RANK = {None: 0, "ngram": 1, "suffix": 2, "mtp": 3, "eagle3": 3, "eagle": 3, "draft_model": 4}


@dataclass(frozen=True)
class Arm:
    """One engine configuration: speculation off (method None), (method, K), or a schedule."""

    method: str | None = None
    k: int = 0
    schedule: tuple[tuple[int, int, int], ...] | None = None
    variant: str = ""  # a second schedule of the same tune (the corrected one): its own engine

    @property
    def label(self) -> str:
        if self.method is None:
            return "baseline"
        if self.schedule:
            return "schedule" + (f"-{self.variant}" if self.variant else "")
        return f"{self.method}(k={self.k})"

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
    decided: bool = True  # False: the rounds or the budget ran out, ``chosen`` only leads

    def candidate(self, arm: Arm) -> Candidate | None:
        return next((c for c in self.candidates if c.arm == arm), None)


def compare(a: Mapping[int, Sample], b: Mapping[int, Sample], tol: float) -> Comparison:
    """Tokens/s of ``a`` over ``b``, paired by round (both ran in it): the harness's comparison
    (harness/analysis/comparisons/stats.py: a t-interval on per-round log ratios, the round being the unit)."""
    logs = [
        math.log((a[r].tokens / a[r].seconds) / (b[r].tokens / b[r].seconds))
        for r in sorted(set(a) & set(b))
        if a[r].seconds > 0 and b[r].seconds > 0 and a[r].tokens > 0 and b[r].tokens > 0
    ]
    return compare_log_ratios("output_tok_s", logs, tol)


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


def fmt_ratio(r: Comparison | None) -> str:
    if r is None or r.estimate is None:
        return "n/a"
    if r.lo is None:
        return f"{r.estimate:.2f}x (no CI)"
    return f"{r.estimate:.2f}x [{r.lo:.2f}, {r.hi:.2f}]"
