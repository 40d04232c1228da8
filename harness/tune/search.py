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
spent (then the leader, called undecided; harness/tune/schedule.py emits it only with its CI
against the baseline above 1). Measuring is a callback, so the search is tested without
engines. The arms, samples and rounds are in harness/tune/race.py, the prediction in
harness/tune/predict.py, the time budget in harness/tune/budget.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from harness.tune.predict import (
    best_predicted,
    expected_tokens,
    fit_cost,
    predict,
    predictions,
    select,
)
from harness.tune.race import (
    BASELINE,
    COST_RANK,
    Arm,
    Candidate,
    LoadResult,
    Measure,
    Race,
    Sample,
    Settings,
    compare,
    fmt_ratio,
)

__all__ = [  # the search's vocabulary, importable from here (harness/tune/race.py, tune_predict.py)
    "BASELINE", "COST_RANK", "Arm", "Budget", "Candidate", "LoadResult", "Measure", "Race",
    "Sample", "Settings", "compare", "expected_tokens", "fit_cost", "fmt_ratio", "predict",
    "predictions", "select", "tune", "tune_load",
]  # fmt: skip


DEFAULTS = Settings()


class Budget(Protocol):
    """The wall-clock guard (harness/tune/budget.py: from the times measured in this tune)."""

    def start_load(self, load: int, pilot: Sequence[Arm], later: Sequence[int]) -> bool:
        """Whether ``load`` can be tuned: its minimum (the pilot, then a decision) and its
        verification fit beside the verification of the loads tuned before it."""
        ...

    def next_round(self, load: int, arms: Sequence[Arm], short: int, later: Sequence[int]) -> bool:
        """Whether one more race round of ``arms`` fits. ``short``: the rounds still needed
        before every arm has a CI (the load's minimum, which comes first); past it, a round must
        leave the verification and the minimum of the later loads that still fit."""
        ...


async def tune_load(load: int, methods: Mapping[str, Sequence[int]], measure: Measure,
                    s: Settings = DEFAULTS, started: set[Arm] | None = None,
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
                a
                for a in pilot
                if a == BASELINE or best_predicted(predictions(race, methods)[0], a) >= far
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
        short = max(s.min_rounds - len(race.samples.get(a, {})) for a in arms)
        short = max(0, min(short, s.max_rounds - race.rounds))
        if budget is not None and not budget.next_round(load, arms, short, later):
            out_of_time = True
            break
        await race.run(arms)
    for arm, cand in cands.items():
        cand.vs_baseline = race.vs(arm, BASELINE) if arm != BASELINE else None
        cand.rounds = len(race.samples.get(arm, {}))
    chosen = next((a for a, c in cands.items() if c.status == "chosen"), None)
    decided = chosen is not None
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
                      below, rate, decided=decided)  # fmt: skip


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


async def tune(loads: Sequence[int], methods: Mapping[str, Sequence[int]], measure: Measure,
               s: Settings = DEFAULTS, on_load: Callable[[LoadResult], None] | None = None,
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
        if budget is not None and not budget.start_load(load, pilot, later) and out:
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
