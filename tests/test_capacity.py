"""Capacity under an SLO (harness.analysis.capacity): the search and its CIs on simulated
engines whose latency-vs-rate curve is given (known truth), with per-run noise and drift."""

from __future__ import annotations

import math

import numpy as np

from harness.analysis.capacity import capacities, margin_of, next_rate

SLO = {"ttft": 500.0, "tpot": 100.0}
REPEATS = 3


def simulate(mu: dict[str, float], rng: np.random.Generator, noise: float, drift: float,
             start: float = 1.0, max_probes: int = 10) -> dict:  # fmt: skip
    """One capacity search against engines with p90 TTFT = 0.1 s / (1 - rate / mu) (an M/M/1
    queue's shape; saturated at mu), p90 TPOT 40 ms x (1 + rate / mu), latencies multiplied by
    a per-run lognormal noise and a linear drift of ``drift`` per 100 runs; the variants run
    interleaved in a rotated order at each rate, ``REPEATS`` times."""
    variants = list(mu)
    probes: list[dict] = []
    t = 0
    while (rate := next_rate(probes, variants, start, max_probes)) is not None:
        for b in range(REPEATS):
            order = variants[b % 2 :] + variants[: b % 2]
            for v in order:
                f = (1 + drift * t / 100) * math.exp(rng.normal(0, noise))
                t += 1
                u = rate / mu[v]
                sat = u >= 0.97
                q = {"ttft": 0.1 * f / (1 - u) if not sat else 100.0, "tpot": 0.04 * f * (1 + u)}
                m = max(margin_of(q, SLO), math.log(2.0)) if sat else margin_of(q, SLO)
                probes.append({"variant": v, "rate": rate, "repeat": b, "margin": m,
                               "saturated": sat})  # fmt: skip
    return capacities(probes, variants, min_effect=0.02)


def truth(mu: float) -> float:
    """The rate where 0.1 / (1 - r / mu) = 0.5 s (TTFT binds: TPOT stays under 100 ms)."""
    return mu * (1 - 0.1 / 0.5)


def test_capacity_within_10pct_and_ratio_ci_covers() -> None:
    rng = np.random.default_rng(1)
    mu = {"baseline": 10.0, "spec": 13.0}
    runs = 300
    within = covered = 0
    for _ in range(runs):
        out = simulate(mu, rng, noise=0.05, drift=0.03)
        caps = {r["variant"]: r["capacity"] for r in out["variants"]}
        within += all(caps[v] is not None and abs(caps[v] / truth(mu[v]) - 1) <= 0.10 for v in mu)
        ratio = out["ratios"][0]
        true_ratio = truth(13.0) / truth(10.0)
        covered += ratio["lo"] is not None and ratio["lo"] <= true_ratio <= ratio["hi"]
    print(within / runs, covered / runs)
    assert within / runs >= 0.90
    assert covered / runs >= 0.93


def test_equal_capacities_rarely_called_different() -> None:
    rng = np.random.default_rng(2)
    mu = {"baseline": 10.0, "spec": 10.0}
    runs = 300
    false = 0
    for _ in range(runs):
        out = simulate(mu, rng, noise=0.05, drift=0.03)
        false += out["ratios"][0]["verdict"] in ("faster", "slower")
    print(false / runs)
    assert false / runs <= 0.05
