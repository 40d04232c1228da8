"""Capacity under an SLO (harness.analysis.capacity.slo): the search and its CIs on simulated
engines whose latency-vs-rate curve is given (known truth), with per-run noise and drift."""

from __future__ import annotations

import math

import numpy as np

from harness.analysis.capacity.slo import capacities, margin_of, next_rate

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


def test_rate_crossover_from_the_probed_points() -> None:
    """Speculation faster at low rates, slower at high ones: E2E p90 of the baseline
    1 s / (1 - r / 10), of the candidate 0.7 s / (1 - r / 8); they cross at r = 0.3 / 0.055
    = 5.45 req/s. The search (SLO e2e <= 3 s) probes the rates; the crossover is read from
    those same probes (placed for the capacities, not for it): its estimate within 20% in
    >= 90% of runs, its CI covering the truth in >= 85% (90% measured: the line through the
    probes near the sign change bends; the issue sets no rate for this one)."""
    from harness.analysis.capacity.crossover import rate_crossover

    rng = np.random.default_rng(3)
    curves = {"baseline": (1.0, 10.0), "spec": (0.7, 8.0)}
    slo = {"e2e": 3000.0}
    truth_at = 0.3 / 0.055
    runs, close, covered = 200, 0, 0
    for _ in range(runs):
        probes: list[dict] = []
        t = 0
        while (rate := next_rate(probes, list(curves), 1.0, 10)) is not None:
            for b in range(REPEATS):
                for v in list(curves)[b % 2 :] + list(curves)[: b % 2]:
                    a, mu = curves[v]
                    f = (1 + 0.03 * t / 100) * math.exp(rng.normal(0, 0.05))
                    t += 1
                    sat = rate / mu >= 0.97
                    e2e = a * f / (1 - rate / mu) if not sat else 100.0
                    m = margin_of({"e2e": e2e}, slo)
                    probes.append({"variant": v, "rate": rate, "repeat": b, "saturated": sat,
                                   "margin": max(m, math.log(2.0)) if sat else m,
                                   "quantiles_s": {"e2e": e2e}})  # fmt: skip
        (x,) = rate_crossover(probes, list(curves))
        assert x["kind"] == "stops paying"
        close += abs(x["at"] / truth_at - 1) <= 0.20
        covered += x["lo"] is not None and x["lo"] <= truth_at <= x["hi"]
    print(close / runs, covered / runs)
    assert close / runs >= 0.90
    assert covered / runs >= 0.85
