"""Capacity under an SLO (harness.analysis.capacity.slo): the search and its CIs on simulated
engines whose latency-vs-rate curve is given (known truth), with per-run noise and drift."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

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
        if x["at"] is None:  # no estimate (1 in 200: its fit crossed above the rates probed)
            continue
        close += abs(x["at"] / truth_at - 1) <= 0.20
        covered += x["lo"] is not None and x["lo"] <= truth_at <= x["hi"]
    print(close / runs, covered / runs)
    assert close / runs >= 0.90
    assert covered / runs >= 0.85


def _pairs(table: dict[float, dict[int, float]]) -> list[dict]:
    """Probes where both variants ran unsaturated: rate -> repeat -> log(base E2E / spec E2E)."""
    out = []
    for rate, logs in table.items():
        for b, y in logs.items():
            for v, e2e in (("baseline", 1.0), ("spec", math.exp(-y))):
                out.append({"variant": v, "rate": rate, "repeat": b, "saturated": False,
                            "quantiles_s": {"e2e": e2e}})  # fmt: skip
    return out


# the --slo ttft:2000 tpot:200 run on the tiny pair (vllm, ngram) that printed "stops being faster
# at nan req/s": per probed rate the repeats where both ran unsaturated, log E2E p90 speedup
TINY_NGRAM = {1.0: {0: 0.328, 1: 0.323, 2: -0.224}, 4.0: {0: -0.108, 1: 0.403, 2: 0.368},
              7.89: {0: 0.273, 1: -0.794, 2: 0.888}, 9.673: {2: 0.218},
              10.156: {0: 0.381, 1: -0.881, 2: -0.559}, 11.974: {0: -0.276}}  # fmt: skip


@pytest.mark.parametrize(
    "table, why",
    [(TINY_NGRAM, None),  # no repeat at every rate near the change: fitted per repeat's own
     # one repeat, at the two rates past the change: its line crosses at 0.06 req/s
     ({1.0: {1: 0.2}, 2.0: {0: -0.5}, 4.0: {0: -0.6}}, "lies outside the probed rates"),
     # the means beside the change rise with the rate: no line crosses downwards
     ({1.0: {0: 0.01}, 2.0: {0: -1.0}, 4.0: {0: 0.5}}, "does not fall"),
     # no repeat ran at two of the rates
     ({1.0: {0: 0.2}, 2.0: {1: -0.2}}, "no repeat ran both")],
)  # fmt: skip
def test_a_crossover_without_an_estimate_is_said_in_words(table: dict, why: str | None) -> None:
    """Never a nan: the change is said between two probed rates; a crossing is estimated only
    from repeats with two rates there and only inside the probed rates, else ``no_estimate``
    says why (fails on the code that printed "stops being faster at nan req/s")."""
    from harness.analysis.capacity.crossover import rate_crossover
    from harness.report.capacity_plot import crossover_text

    (x,) = rate_crossover(_pairs(table), ["baseline", "spec"])
    json.dumps(x, allow_nan=False)
    rates = sorted(table)
    assert x["kind"] == "stops paying"
    assert rates.index(x["pays_up_to"]) + 1 == rates.index(x["not_faster_from"])
    text = crossover_text(x)
    assert "nan" not in text
    assert f"between {x['pays_up_to']:.3g} and {x['not_faster_from']:.3g} req/s" in text
    if why is None:
        assert x["n"] == 3 and rates[0] <= x["at"] <= rates[-1], x
        assert "fitted crossing" in text
    else:
        assert x["at"] is None and why in x["no_estimate"] and why in text
