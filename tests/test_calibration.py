"""Calibration of the verdicts, proven on simulated experiments with a known truth.

Each experiment is what the harness runs: P prompts, R repeats of a baseline and a candidate,
interleaved in rounds with the order rotated (A B, B A, ...), on a machine whose speed moves:
every run draws its own speed (run noise, 3-10%), the machine shifts by 3% at a random moment
(drift between blocks), prompts differ (per-prompt spread) and every request has its own noise.
Two kinds of data: throughput-like (one tokens/s per run, closed loop) and latency-like
(per-request TTFT/TPOT/E2E, paired by prompt within a round). In-process engines add an
instance effect: an engine keeps a speed offset of its own for its whole life (real A/A runs,
docs/statistics.md), so the design decides whether the offset varies between blocks (a fresh
instance per block: the CI sees it) or not (one instance per lane: a bias the CI cannot see).

Thousands of experiments are simulated as arrays (seconds), reduced to one log speedup per
repeat as the harness reduces its runs, and pushed through the harness's own interval and
verdict (``log_ratio_ci``, ``verdicts``: what ``compare_log_ratios`` calls). A subset is built as
real ``Run``s of ``RequestRecord``s and sent through ``compare_groups`` to show that the
array reduction is the harness's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pytest

from harness.analysis.comparisons.paired import compare_groups
from harness.analysis.comparisons.stats import MIN_REPEATS, log_ratio_ci, verdicts
from harness.core.records import RequestRecord
from harness.core.results import Cell, Run
from harness.flags.stop import DEFAULT_REPEATS

PROMPTS = 16
TOKENS = 64
MIN_EFFECT = 0.02
EXPERIMENTS = 4000

# The power the defaults promise (docs/statistics.md, Power): a 10% speedup of tokens/s is called
# "faster" with probability >= POWER[instances] at DEFAULT_REPEATS when each run's speed varies by
# NOISE (sd of log tok/s; this machine when not shared: 4-8%; 15-40% with six sessions on 2
# cores), with no instance effect (servers) and with a fresh in-process engine per block.
EFFECT = 1.10
NOISE = 0.03
POWER = {"none": 0.74, "per-block": 0.53}
# The repeats that find EFFECT at NOISE with >= 80% power with a fresh engine per block.
REPEATS_FOR_80 = 6

# The sd of an engine instance's log speed offset. Real A/A runs on this machine (docs/measurements.md:
# Statistics), 14 with the build order swapped run by run (seeds 31-38, 41-46): per-run latency
# estimates 0.93-1.08, sd of their logs 4.6%; less the run noise's share (3% noise over 4
# blocks: sqrt(2 * 0.03**2 / 4) = 2.1%) 4.1% is left for the difference of two instances, so
# 4.1% / sqrt(2) = 2.9% per instance (seeds 11-20, one build order: 4.4% -> 2.7%). A random build
# order makes the first-built engine's 3-5% an offset of random sign, inside these figures.
INSTANCE = 0.03
INSTANCES = ("none", "one", "per-block")  # no effect (servers, ideal); today's lanes; per block


@dataclass
class Sim:
    """log speedups per repeat, shape (experiments, repeats), one array per metric."""

    d: dict[str, np.ndarray]


def _speeds(rng: np.random.Generator, n: int, r: int, noise: np.ndarray) -> np.ndarray:
    """Machine speed factor of every run, shape (n, r, 2): [..., 0] baseline, [..., 1] candidate.

    Runs happen in rounds, the order rotated (A B, B A, ...); each run draws its own speed
    (lognormal, sd ``noise`` per experiment) and the machine slows by 3% from a random run on.
    """
    run_noise = np.exp(rng.normal(0.0, 1.0, (n, r, 2)) * noise[:, None, None])
    slot = np.arange(r)[:, None] * 2 + np.where(np.arange(r)[:, None] % 2 == 0, [0, 1], [1, 0])
    step_at = rng.integers(1, 2 * r, size=n)  # the shift happens before this slot
    drift = np.where(slot[None] >= step_at[:, None, None], 1 / 1.03, 1.0)
    return run_noise * drift


def _instances(rng: np.random.Generator, n: int, r: int, design: str) -> np.ndarray:
    """Speed factor of the engine instance every run used, shape (n, r, 2): each instance draws
    a lognormal offset (sd INSTANCE) kept for its life; "one": a lane's instance serves all its
    blocks, "per-block": a fresh instance per lane and block, "none": no instance effect."""
    if design == "none":
        return np.ones((n, r, 2))
    shape = {"one": (n, 1, 2), "per-block": (n, r, 2)}[design]
    return np.broadcast_to(np.exp(rng.normal(0.0, INSTANCE, shape)), (n, r, 2))


def simulate(
    rng: np.random.Generator,
    n: int,
    r: int,
    effect: float = 1.0,
    noise: float | None = None,
    instances: str = "none",
) -> tuple[Sim, dict[str, np.ndarray]]:
    """``n`` experiments of ``r`` repeats; the candidate is ``effect`` times faster; engine
    instances as ``instances`` (INSTANCES).

    Returns the per-repeat log speedups the harness derives, and the raw per-request arrays
    (for building Runs): e2e and ttft of shape (n, r, 2, P), throughput-mode run span (n, r, 2).
    """
    sd = rng.uniform(0.03, 0.10, n) if noise is None else np.full(n, noise)
    speed = _speeds(rng, n, r, sd)  # >1 = the machine was faster during that run
    # instances from a stream of their own: every design sees the same runs, prompts, requests
    speed = speed * _instances(np.random.default_rng(rng.integers(2**63)), n, r, instances)
    prompt_e2e = np.exp(rng.normal(np.log(0.5), 0.5, (n, 1, 1, PROMPTS)))  # per-prompt spread
    prompt_ttft = prompt_e2e * rng.uniform(0.02, 0.1, (n, 1, 1, PROMPTS))
    gain = np.array([1.0, effect])[None, None, :, None]
    req = np.exp(rng.normal(0.0, 0.05, (n, r, 2, PROMPTS)))  # each request's own noise
    e2e = prompt_e2e * req / (speed[..., None] * gain)
    ttft = prompt_ttft * np.exp(rng.normal(0.0, 0.05, (n, r, 2, PROMPTS))) / speed[..., None]
    span = (
        PROMPTS * TOKENS / 800.0 * np.exp(rng.normal(0, 0.01, (n, r, 2))) / (speed * gain[..., 0])
    )
    tpot = (e2e - ttft) / (TOKENS - 1)
    d = {
        # latency mode, one at a time: summed tokens over summed E2E, per round
        "output_tok_s": np.log(e2e[:, :, 0].sum(-1) / e2e[:, :, 1].sum(-1)),
        "e2e": np.log(e2e[:, :, 0] / e2e[:, :, 1]).mean(-1),
        "tpot": np.log(tpot[:, :, 0] / tpot[:, :, 1]).mean(-1),
        # throughput mode, closed loop: tokens over the run's span
        "throughput_tok_s": np.log(span[..., 0] / span[..., 1]),
    }
    return Sim(d), {"e2e": e2e, "ttft": ttft, "span": span}


def judge(d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The harness's estimate, CI and verdict for each experiment."""
    est, lo, hi = log_ratio_ci(d)
    return est, lo, hi, verdicts(est, lo, hi, MIN_EFFECT)


def _se(p: float, n: int) -> float:
    return 3 * float(np.sqrt(p * (1 - p) / n))  # three standard errors of a rate


@functools.cache
def aa(repeats: int, instances: str) -> Sim:
    """A/A experiments (no difference), one set per design and number of repeats."""
    return simulate(np.random.default_rng(20261130), EXPERIMENTS, repeats, instances=instances)[0]


def _rates(d: np.ndarray) -> tuple[float, float]:
    """The false-verdict rate and CI coverage of A/A experiments' log speedups ``d``."""
    _, lo, hi, v = judge(d)
    return float(np.isin(v, ["faster", "slower"]).mean()), float(((lo <= 1) & (hi >= 1)).mean())


def _aa_rates(repeats: int, instances: str, metric: str) -> tuple[float, float]:
    return _rates(aa(repeats, instances).d[metric])


METRICS = ["output_tok_s", "e2e", "tpot", "throughput_tok_s"]


@pytest.mark.parametrize("instances", ["none", "per-block"])
@pytest.mark.parametrize("repeats", sorted({MIN_REPEATS, DEFAULT_REPEATS, 8}))
@pytest.mark.parametrize("metric", METRICS)
def test_no_difference_gives_few_falseverdicts_and_covering_cis(
    metric: str, repeats: int, instances: str
) -> None:
    """Without an instance effect, and with one when every block has fresh instances."""
    false, cover = _aa_rates(repeats, instances, metric)
    assert false <= 0.05 + _se(0.05, EXPERIMENTS), f"{metric}: false verdicts {false:.1%}"
    assert cover >= 0.93, f"{metric}: CI coverage {cover:.1%}"


@pytest.mark.parametrize(("repeats", "worst"), [(DEFAULT_REPEATS, (0.09, 0.90)), (8, (0.15, 0.85))])
@pytest.mark.parametrize("metric", METRICS)
def test_one_instance_per_lane_gives_falseverdicts(
    metric: str, repeats: int, worst: tuple[float, float]
) -> None:
    """Why in-process engines are built fresh for every block: an instance's offset shared by
    all blocks is a bias the per-repeat t-interval cannot see, and more repeats make it worse
    (the CI narrows, the bias stays)."""
    false, cover = _aa_rates(repeats, "one", metric)
    assert false > worst[0], f"{metric}: false verdicts {false:.1%}"
    assert cover < worst[1], f"{metric}: CI coverage {cover:.1%}"


# The build order: the first-built engine of a build stepped ~3.6% slower (docs/measurements.md, real A/A
# runs, seeds 41-46). Rebuilt every block, the order's sign per block decides what it does.
BUILD_FIRST = 0.036
ORDERS = ("rotated", "random", "fixed")


def _build_signs(order: str, n: int, r: int) -> np.ndarray:
    """+1 where the candidate was built second in a block (baseline first), -1 where first."""
    if order == "fixed":
        return np.ones((n, r))
    if order == "rotated":
        return np.broadcast_to(np.where(np.arange(r) % 2 == 0, 1.0, -1.0), (n, r))
    return np.random.default_rng(1).choice([-1.0, 1.0], (n, r))


@pytest.mark.parametrize("repeats", [DEFAULT_REPEATS, 8])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("metric", ["output_tok_s", "throughput_tok_s"])
def test_a_fresh_instance_per_block_needs_the_build_order_to_vary(
    metric: str, order: str, repeats: int
) -> None:
    """Fresh instances per block, built in a rotated or random order per block: calibrated (on
    top of INSTANCE, which already holds a random order's share: conservative); the same order
    in every block makes the first-built engine's handicap a bias again. A whole-instance speed
    factor shifts every metric's per-block log ratio by exactly its log, so it is added there."""
    d = aa(repeats, "per-block").d[metric]
    false, cover = _rates(d + BUILD_FIRST * _build_signs(order, *d.shape))
    if order == "fixed":
        assert false > (0.12 if repeats >= 8 else 0.07), f"{metric}: false verdicts {false:.1%}"
    else:
        assert false <= 0.05 + _se(0.05, EXPERIMENTS), f"{metric}: false verdicts {false:.1%}"
        assert cover >= 0.93, f"{metric}: CI coverage {cover:.1%}"


@pytest.mark.parametrize(
    ("instances", "repeats", "promised"),
    [
        ("none", DEFAULT_REPEATS, POWER["none"]),
        ("per-block", DEFAULT_REPEATS, POWER["per-block"]),
        ("per-block", REPEATS_FOR_80, 0.82),
    ],
)
@pytest.mark.parametrize("metric", ["output_tok_s", "e2e", "throughput_tok_s"])
def test_planted_ten_percent_is_covered_and_found_with_the_promised_power(
    metric: str, instances: str, repeats: int, promised: float
) -> None:
    rng = np.random.default_rng(7)
    sim, _ = simulate(rng, EXPERIMENTS, repeats, effect=EFFECT, noise=NOISE, instances=instances)
    _, lo, hi, v = judge(sim.d[metric])
    cover = ((lo <= EFFECT) & (hi >= EFFECT)).mean()
    power = (v == "faster").mean()
    assert cover >= 0.93, f"{metric}: CI coverage {cover:.1%}"
    assert power >= promised - _se(promised, EXPERIMENTS), f"{metric}: power {power:.1%}"
    assert not np.isin(v, ["slower"]).any()


def _runs(e2e: np.ndarray, ttft: np.ndarray, span: np.ndarray, mode: str) -> list[list[Run]]:
    """One experiment's arrays as the harness's Runs: [baseline runs, candidate runs]."""
    out: list[list[Run]] = [[], []]
    r_count = e2e.shape[0]
    for r in range(r_count):
        for v, label in enumerate(("baseline", "ngram")):
            recs = []
            for p in range(PROMPTS):
                t0 = p * 10.0 if mode == "latency" else 0.0
                end = t0 + (e2e[r, v, p] if mode == "latency" else span[r, v])
                first = t0 + ttft[r, v, p]
                times = (first, first + (end - first) / 2, end)
                recs.append(RequestRecord(f"p{p}", t0, end, times, (1, TOKENS - 2, 1)))
            load = {"concurrency": 1 if mode == "latency" else PROMPTS}
            cell = Cell("sim", label, mode, load, TOKENS, r, "w")
            out[v].append(Run(cell, None if v == 0 else {"method": "ngram"}, tuple(recs)))
    return out


@pytest.mark.parametrize("mode", ["latency", "throughput"])
def test_the_array_reduction_is_the_harness_reduction(mode: str) -> None:
    """Experiments built as real Runs give compare_groups' verdicts the arrays predicted."""
    rng = np.random.default_rng(11)
    sim, raw = simulate(rng, 60, DEFAULT_REPEATS, effect=1.06, instances="per-block")
    key = "output_tok_s" if mode == "latency" else "throughput_tok_s"
    est, lo, hi, v = judge(sim.d[key])
    for i in range(60):
        base, cand = _runs(raw["e2e"][i], raw["ttft"][i], raw["span"][i], mode)
        got = compare_groups(base, cand, min_effect=MIN_EFFECT)
        tok = got["output_tok_s"]
        assert tok.n == DEFAULT_REPEATS and tok.verdict == v[i]
        assert (tok.estimate, tok.lo, tok.hi) == pytest.approx((est[i], lo[i], hi[i]), rel=1e-9)
        if mode == "latency":
            e_est, e_lo, e_hi, e_v = judge(sim.d["e2e"][i : i + 1])
            assert got["e2e"].verdict == e_v[0]
            assert got["e2e"].estimate == pytest.approx(e_est[0], rel=1e-9)


if __name__ == "__main__":  # docs/statistics.md's power table: python -m tests.test_calibration
    for instances in ("none", "per-block"):
        for effect, noise in ((1.10, 0.03), (1.10, 0.05), (1.20, 0.03), (1.20, 0.05)):
            row = []
            for r in (3, 4, 5, 6, 8, 10):
                sim, _ = simulate(
                    np.random.default_rng(7), EXPERIMENTS, r, effect, noise, instances
                )
                found = [(judge(sim.d[k])[3] == "faster").mean() for k in METRICS if k != "tpot"]
                row.append(f"{r}: {min(found):.0%}-{max(found):.0%}")
            print(f"{instances:9} {effect:.2f}x at {noise:.0%} noise:", ", ".join(row))
