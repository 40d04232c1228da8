"""When a point of a sequential run stops, and the run's one time budget.

After every block the session asks :meth:`Stopper.wants` for each point: a point stops when
every comparison that decides there is decided (harness.analysis.comparisons.sequential: an interval that
stays valid at every look), or at the cap; before a block, :meth:`Stopper.fits` says whether the
block, for the points still undecided, fits in what is left of the budget (predicted from the
blocks run so far). The first ``rule.first`` blocks always run: no verdict exists before them.
Every block stays one repeat of every variant of its points, in the rotated order
(harness.core.design), so a block is still the pairing unit whichever points it holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.analysis.comparisons.paired import comparisons
from harness.analysis.comparisons.sequential import Rule
from harness.analysis.pooled import point_key
from harness.core.results import Run

DECIDED, CAP, BUDGET, FAILED = "decided", "cap", "budget", "failed"


def stopper_for(plan: Any) -> Stopper | None:
    """The plan's Stopper (a RunPlan with stopping "sequential"), else None (fixed n)."""
    if getattr(plan, "stopping", "fixed") != "sequential":
        return None
    points = len(list(plan.points()))
    return Stopper(Rule(cap=plan.max_repeats), plan.min_effect, plan.budget_s, points=points)


def point_decided(runs: Sequence[Run], rule: Rule, min_effect: float) -> bool:
    """Whether every deciding comparison among ``runs`` (one point) is decided; False when
    there is none (nothing to decide: the point runs to its cap or the budget)."""
    comps = [c for c in comparisons(runs, min_effect=min_effect, rule=rule) if c["decides"]]
    return bool(comps) and all(c.get("stopped") == DECIDED for c in comps)


def complete_blocks(runs: Sequence[Run], key: str, default: int) -> int:
    """The blocks of point ``key`` that every lane there finished (what its looks pair), else
    ``default`` (no runs given)."""
    lanes: dict[str, set[int]] = {}
    for r in runs:
        c = r.cell
        if r.status == "ok" and point_key(c.mode, c.load, c.max_new_tokens, c.workload) == key:
            lanes.setdefault(f"{c.engine}/{c.label}", set()).add(c.repeat)
    return len(set.intersection(*lanes.values())) if lanes else default


@dataclass
class Stopper:
    """The sequential design's stops, recorded per point (``results.json`` design.stopping)."""

    rule: Rule
    min_effect: float
    budget_s: float | None
    reasons: dict[str, str] = field(default_factory=dict)  # point key -> why it stopped
    blocks: dict[str, int] = field(default_factory=dict)  # point key -> blocks run
    points: int = 1  # points of the plan (the share of the budget each gets, one instance)
    durations: list[tuple[frozenset[int], float]] = field(default_factory=list)
    _admitted: tuple[frozenset[int], float] | None = None  # the last block: points, start
    _last: dict[str, float] = field(default_factory=dict)  # one instance: last repeat's end
    _longest: dict[str, float] = field(default_factory=dict)  # one instance: longest repeat

    def wants(
        self, runs: Sequence[Run], block: int, now: float = 0.0, since: float | None = None
    ) -> bool:
        """Whether the point of ``runs`` (its runs so far) gets block ``block``; ``now`` (session
        seconds) and ``since`` (when the point began) where points run one after the other (one
        instance per lane, a point's repeats the inner loop): each point gets an equal share of
        the budget."""
        key = self._key(runs)
        if key is None:
            return block < self.rule.first
        if key in self.reasons:
            return False
        self.blocks[key] = block
        if since is not None:  # the repeat that just ended, for the prediction
            took = now - self._last.get(key, since)
            self._longest[key] = max(self._longest.get(key, 0.0), took)
            self._last[key] = now
        if block < self.rule.first:
            return True
        if point_decided(runs, self.rule, self.min_effect):
            self.reasons[key] = DECIDED
        elif block >= self.rule.cap:
            self.reasons[key] = CAP
        elif since is not None and self.budget_s is not None:
            share = self.budget_s / max(1, self.points)
            if now - since + self._longest[key] > share:
                self.reasons[key] = BUDGET
        return key not in self.reasons

    def settled(self, runs: Sequence[Run]) -> bool:
        """Whether the point of ``runs`` (a --resume's journaled runs) was decided: the session
        that ran them stopped it there, so it gets no block again (recorded as decided)."""
        key = self._key(runs)
        if key is not None and key not in self.reasons:
            if not point_decided(runs, self.rule, self.min_effect):
                return False
            self.blocks[key] = len({r.cell.repeat for r in runs if r.status == "ok"})
            self.reasons[key] = DECIDED
        return key is not None and self.reasons[key] == DECIDED

    def failed(self, runs: Sequence[Run]) -> None:
        """The point of ``runs`` has no lane left (each one's engine died or its run there
        failed): it stops, with the blocks every lane finished, not counting on to the cap."""
        key = self._key(runs)
        if key is not None and key not in self.reasons:
            self.blocks[key] = complete_blocks(runs, key, 0)
            self.reasons[key] = FAILED

    def fits(self, points: Iterable[int], block: int, elapsed_s: float) -> bool:
        """Whether a block of ``points`` fits in the budget, ``elapsed_s`` into the session:
        predicted as the longest block so far of these points, else of more (a block that
        included all of these), else the longest."""
        if self.budget_s is None or block < self.rule.first:
            return True
        want = frozenset(points)
        past = (
            [s for pts, s in self.durations if want == pts]
            or [s for pts, s in self.durations if want <= pts]
            or [s for _, s in self.durations]
        )
        return elapsed_s + (max(past) if past else 0.0) <= self.budget_s

    def admits(self, here: Mapping[int, Sequence[Run]], block: int, now: float) -> bool:
        """Whether the next block (``here``: each wanted point's runs so far) fits in the
        budget, ``now`` session seconds in; if not, those points stop on the budget. The block
        before this one lasted from its own admission to now."""
        if self._admitted is not None:
            self.ran(self._admitted[0], now - self._admitted[1])
        self._admitted = (frozenset(here), now)
        if self.fits(here, block, now):
            return True
        self.out_of_budget(here.values())
        return False

    def ran(self, points: Iterable[int], seconds: float) -> None:
        self.durations.append((frozenset(points), seconds))

    def out_of_budget(self, runs_by_point: Iterable[Sequence[Run]]) -> None:
        for runs in runs_by_point:
            key = self._key(runs)
            if key is not None and key not in self.reasons:
                self.reasons[key] = BUDGET

    def record(self, runs: Sequence[Run] = ()) -> dict[str, Any]:
        """design.stopping in results.json; ``runs``: the session's, whose blocks every lane
        finished are the blocks of a point that an interruption stopped mid-way."""
        return {
            "rule": "sequential",
            **self.rule.to_json(),
            "budget_s": self.budget_s,
            "min_effect": self.min_effect,
            "points": {
                k: {"blocks": n, "stopped": self.reasons.get(k, "stopped")}
                | ({} if k in self.reasons else {"blocks": complete_blocks(runs, k, n)})
                for k, n in self.blocks.items()
            },
            "blocks_s": [round(s, 3) for _, s in self.durations],  # per-block instances
            "repeat_s": {k: round(s, 3) for k, s in self._longest.items()},  # one: longest
        }

    @staticmethod
    def _key(runs: Sequence[Run]) -> str | None:
        if not runs:
            return None
        c = runs[0].cell
        return point_key(c.mode, c.load, c.max_new_tokens, c.workload)
