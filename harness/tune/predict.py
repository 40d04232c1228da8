"""`harness tune`'s prediction: one probe per method (its largest K) measures acceptance per draft
position; Leviathan et al.'s E(K) = 1 + sum_{i<K} a_i with a cost per draft token c fitted to the
probe's speedup predicts every other K, and decides which arms race (``select``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from harness.tune.race import BASELINE, Arm, Candidate, Race, Sample, Settings


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


def best_predicted(predicted: Mapping[Arm, float], arm: Arm) -> float:
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
