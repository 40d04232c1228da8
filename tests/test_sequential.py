"""The sequential design, proven on simulated experiments with a known truth.

The experiments are tests/test_calibration.py's (per-prompt spread, 3-10% run noise, a 3%
instance offset per fresh instance, a 3% shift of the machine at a random moment, rotated
order), run to the default cap; the stopping rule is the one the session applies after every
block (harness.analysis.comparisons.sequential.run_to_stop: the first look whose interval decides, else the
cap). A session test checks that the session stops where that rule says.

``python -m tests.test_sequential`` prints the power table of the README's page
(docs/statistics-sequential.md).
"""

from __future__ import annotations

import asyncio
import functools

import numpy as np
import pytest

from engines.base import EngineConfig, Request
from harness.analysis.comparisons import sequential
from harness.analysis.comparisons.paired import log_speedups
from harness.analysis.comparisons.sequential import DEFAULT_CAP, Rule, boundaries, run_to_stop
from harness.analysis.comparisons.stats import t975
from harness.core.results import group_runs
from harness.flags.options import UsageError
from harness.flags.parser import build_parser
from harness.flags.plan import build_plan
from harness.run.session import Session
from tests.clock import FakeClock
from tests.test_calibration import simulate
from tests.test_target_ci import NoisyEngine

MIN_EFFECT = 0.02
EXPERIMENTS = 4000
RULE = Rule(cap=DEFAULT_CAP)
METRICS = ["output_tok_s", "e2e", "tpot", "throughput_tok_s"]


def _se(p: float, n: int = EXPERIMENTS) -> float:
    return 3 * float(np.sqrt(p * (1 - p) / n))


@functools.cache
def _sim(effect: float, noise: float | None, instances: str, seed: int) -> dict[str, np.ndarray]:
    return simulate(
        np.random.default_rng(seed), EXPERIMENTS, DEFAULT_CAP, effect, noise, instances
    )[0].d


def _false(stop: dict[str, np.ndarray]) -> float:
    return float(((stop["lo"] > 1.0) | (stop["hi"] < 1.0)).mean())


def _covers(stop: dict[str, np.ndarray], truth: float) -> float:
    return float(((stop["lo"] <= truth) & (stop["hi"] >= truth)).mean())


def test_the_boundaries_spend_alpha_on_the_t_statistic() -> None:
    """Under iid normal log ratios (a stream of draws other than the boundaries'), the chance
    that any look's |t| crosses its boundary is alpha; the boundaries fall look by look."""
    c = boundaries(RULE)
    assert np.all(np.diff(c) < 0)
    x = np.random.default_rng(3).normal(0.0, 0.07, (200_000, RULE.cap))
    stop = run_to_stop(x, RULE, 0.0)  # min effect 0: only an interval excluding 0 decides
    assert abs(_false(stop) - RULE.alpha) <= 3 * np.sqrt(0.05 * 0.95 / 200_000)


@pytest.mark.parametrize("instances", ["none", "per-block"])
@pytest.mark.parametrize("metric", METRICS)
def test_no_difference_gives_few_false_verdicts_and_covering_intervals(
    metric: str, instances: str
) -> None:
    """A/A, 3-10% run noise, stopped as the session stops: "faster"/"slower" (any interval that
    excludes 1) at most 5% of the time, the reported interval covering the truth >= 93%."""
    stop = run_to_stop(_sim(1.0, None, instances, 20261201)[metric], RULE, MIN_EFFECT)
    assert _false(stop) <= 0.05 + _se(0.05), f"{metric}: false verdicts {_false(stop):.1%}"
    assert _covers(stop, 1.0) >= 0.93


def test_the_fixed_n_interval_at_every_look_gives_false_verdicts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same stopping with the fixed-n t-interval at each look (the rule is what makes the
    stop honest): false verdicts far above 5% (docs/statistics-sequential.md has the rate)."""
    naive = np.array([t975(n - 1) for n in range(RULE.first, RULE.cap + 1)])
    monkeypatch.setattr(sequential, "boundaries", lambda rule: naive[: rule.cap - rule.first + 1])
    for metric in ("output_tok_s", "throughput_tok_s"):
        stop = run_to_stop(_sim(1.0, None, "per-block", 20261201)[metric], RULE, MIN_EFFECT)
        assert _false(stop) > 0.10, f"{metric}: {_false(stop):.1%}"


@pytest.mark.parametrize("metric", ["output_tok_s", "e2e", "throughput_tok_s"])
def test_a_ten_percent_effect_is_found_with_80_percent_power_within_the_cap(metric: str) -> None:
    """10% faster, 3% run noise, a fresh engine per block: "faster" >= 80% by the default cap,
    never "slower", the reported interval covering 1.10 >= 93%."""
    stop = run_to_stop(_sim(1.10, 0.03, "per-block", 7)[metric], RULE, MIN_EFFECT)
    power = float((stop["verdict"] == "faster").mean())
    assert power >= 0.80, f"{metric}: power {power:.1%}"
    assert not (stop["verdict"] == "slower").any()
    assert _covers(stop, 1.10) >= 0.93


@pytest.mark.parametrize("metric", ["output_tok_s", "e2e", "throughput_tok_s"])
def test_a_clear_thirty_percent_effect_stops_by_three_blocks(metric: str) -> None:
    """30% faster at 3% run noise: the median comparison decides at its first look (3 blocks)."""
    stop = run_to_stop(_sim(1.30, 0.03, "per-block", 8)[metric], RULE, MIN_EFFECT)
    assert np.median(stop["blocks"]) <= 3
    assert (stop["verdict"] == "faster").mean() >= 0.99
    assert _covers(stop, 1.30) >= 0.93


def test_an_interval_inside_the_min_effect_decides_within() -> None:
    """No difference and a tight spread: the interval falls inside +-2% and says so."""
    d = np.random.default_rng(5).normal(0.0, 0.002, (1, RULE.cap))
    stop = run_to_stop(d, RULE, MIN_EFFECT)
    assert stop["verdict"][0] == "within +-2%" and stop["blocks"][0] == RULE.first


# ---- the session applies that rule --------------------------------------------------------

PROMPTS = [Request(f"p{i}", "x") for i in range(4)]


def _session(argv: list[str], noise: float, seed: int, speedup: float = 2.0) -> Session:
    args = build_parser().parse_args(
        ["--engine", "hf", "--spec", "ngram", "--mode", "latency", "--warmup", "0", *argv]
    )
    plan = build_plan(args, "model", None)
    clock = FakeClock()
    built: list[NoisyEngine] = []

    def factory(config: EngineConfig) -> NoisyEngine:  # a fresh instance per block: own draws
        spec = config.spec_config is not None
        per_token = 0.02 / speedup if spec else 0.02
        built.append(NoisyEngine(clock, per_token, noise, seed * 1000 + len(built)))
        return built[-1]

    base = EngineConfig(engine="hf", model="model")
    cand = EngineConfig(engine="hf", model="model", spec_config={"method": "ngram"})
    session = Session(plan, PROMPTS, engine_factory=factory, clock=clock, progress=False)
    asyncio.run(session.execute([("baseline", base), ("ngram", cand)]))
    return session


def _blocks(session: Session) -> dict[str, int]:
    return {
        k[1]: len([r for r in v if r.status == "ok"]) for k, v in group_runs(session.runs).items()
    }


def test_a_clear_answer_stops_at_the_first_look_and_a_close_one_runs_to_the_cap() -> None:
    clear = _session([], noise=0.01, seed=1, speedup=2.0)
    assert _blocks(clear) == {"baseline": 3, "ngram": 3}
    assert set(clear.stopper.reasons.values()) == {"decided"}
    close = _session([], noise=0.3, seed=2, speedup=1.0)
    assert _blocks(close) == {"baseline": DEFAULT_CAP, "ngram": DEFAULT_CAP}
    assert set(close.stopper.reasons.values()) == {"cap"}


@pytest.mark.parametrize("seed", range(12))
def test_the_session_stops_where_the_rule_says(seed: int) -> None:
    """Noisy sessions with a modest effect: the blocks the session ran and the verdict are
    run_to_stop's on the session's own per-block log speedups."""
    session = _session([], noise=0.15, seed=seed, speedup=1.15)
    (base, cand) = group_runs(session.runs).values()
    d = np.array(log_speedups(base, cand, "output_tok_s"))
    stop = run_to_stop(d, RULE, MIN_EFFECT)
    assert len(d) == int(stop["blocks"])
    (reason,) = session.stopper.reasons.values()
    assert reason == ("decided" if stop["decided"] else "cap")


@pytest.mark.parametrize("instances", ["per-block", "one"])
def test_the_budget_stops_a_point_when_its_next_block_would_not_fit(instances: str) -> None:
    """The fake clock's blocks take ~1.4-1.5 s: a 6 s budget admits the 3 first blocks (no
    verdict exists before them) and a 4th, which fits (~4.3 s + the longest block so far), not
    a 5th; the reason is recorded. With one instance per lane (points one after the other) the
    point's share of the budget (all of it here: one point) is checked after each repeat."""
    session = _session(["--budget", "0.1", "--instances", instances], noise=0.3, seed=2, speedup=1)
    assert _blocks(session) == {"baseline": 4, "ngram": 4}
    assert set(session.stopper.reasons.values()) == {"budget"}
    record = session.stopper.record()
    assert next(iter(record["points"].values())) == {"blocks": 4, "stopped": "budget"}
    assert sum(record["blocks_s"]) <= 6.0


def test_one_instance_per_lane_stops_on_the_same_rule() -> None:
    clear = _session(["--instances", "one"], noise=0.01, seed=1, speedup=2.0)
    assert _blocks(clear) == {"baseline": 3, "ngram": 3}
    assert set(clear.stopper.reasons.values()) == {"decided"}


def test_repeats_fixes_n_and_the_plan_records_the_design() -> None:
    assert _blocks(_session(["--repeats", "4"], noise=0.01, seed=1)) == {"baseline": 4, "ngram": 4}
    parse = build_parser().parse_args
    plan = build_plan(parse(["--engine", "vllm", "--spec"]), "model", None)
    assert (plan.stopping, plan.repeats, plan.max_repeats) == ("sequential", 3, DEFAULT_CAP)
    assert plan.budget_s == 8 * 60
    alone = build_plan(parse(["--engine", "vllm"]), "model", None)  # nothing to compare
    assert (alone.stopping, alone.repeats) == ("fixed", 4)
    with pytest.raises(UsageError, match="--budget is for the sequential design"):
        build_plan(
            parse(["--engine", "vllm", "--spec", "--repeats", "4", "--budget", "3"]), "m", None
        )


if __name__ == "__main__":  # the power table of docs/statistics-sequential.md
    from harness.analysis.comparisons.stats import log_ratio_ci, verdicts

    for effect in (1.10, 1.20):
        rng = np.random.default_rng(7)
        d = simulate(rng, EXPERIMENTS, 10, effect, 0.03, "per-block")[0].d["output_tok_s"]
        for cap in (6, 8, 10):
            found = [
                (run_to_stop(d[:, :n], Rule(cap=cap), MIN_EFFECT)["verdict"] == "faster").mean()
                for n in range(3, cap + 1)
            ]
            print(f"{effect:.2f}x cap {cap}: " + ", ".join(f"{x:.0%}" for x in found))
        fixed = [
            (verdicts(*log_ratio_ci(d[:, :n]), MIN_EFFECT) == "faster").mean()
            for n in (3, 4, 5, 6, 8)
        ]
        print(f"{effect:.2f}x fixed n 3,4,5,6,8: " + ", ".join(f"{x:.0%}" for x in fixed))


def test_the_summary_says_per_comparison_the_blocks_and_why_it_stopped() -> None:
    """A real sequential session through the analysis and the markdown: each deciding
    comparison's line names its verdict, its blocks and its reason; every look is stored."""
    from harness.analysis.derived import analyze
    from harness.report.markdown import render

    session = _session([], noise=0.01, seed=1, speedup=2.0)
    design = {"name": "interleaved", "description": "", "stopping": session.stopper.record()}
    design |= {"prefix_cache_description": ""}
    derived = analyze(session.runs, min_effect=MIN_EFFECT, stopping=design["stopping"])
    (tok,) = [c for c in derived["comparisons"] if c["decides"]]
    assert (tok["verdict"], tok["blocks"], tok["stopped"]) == ("faster", 3, "decided")
    assert [look["n"] for look in tok["looks"]] == [3]
    assert set(tok["looks"][0]) >= {"n", "estimate", "lo", "hi", "boundary"}
    md = render({**derived, "design": design})
    assert "## Sequential stopping" in md
    assert "hf/ngram vs hf/baseline, latency, 1 at a time: 2.00x [" in md
    assert (
        md.split("hf/ngram vs hf/baseline, latency, 1 at a time: ")[1]
        .split("\n")[0]
        .endswith("faster at 3 blocks (decided)")
    )
