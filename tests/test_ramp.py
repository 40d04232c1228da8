"""Ramp-up (vLLM bench serve's --ramp-up-strategy): the send-time rate of each request matches
the asked ramp, timed with the fake clock (tests/clock.py)."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from engines.base import GenParams, Request
from harness.core.load import strategy_from_json
from harness.core.ramp import Ramp
from harness.run.runner import Runner
from tests.clock import FakeClock, ScriptedEngine


def sends(strategy: Ramp, n: int) -> list:
    clock = FakeClock()
    engine = ScriptedEngine(clock, {str(i): [(0.0, 1)] for i in range(n)})
    runner = Runner(engine, clock=clock, sleep=clock.sleep)
    requests = [Request(str(i), "x") for i in range(n)]
    return asyncio.run(runner.run(requests, GenParams(), strategy))


def asked(kind: str, start: float, end: float, i: int, n: int) -> float:
    """vLLM bench's ``_get_current_request_rate``: progress i / (n - 1)."""
    p = i / (n - 1)
    return start + (end - start) * p if kind == "linear" else start * (end / start) ** p


@pytest.mark.parametrize("kind", ["linear", "exponential"])
def test_constant_gaps_follow_the_ramp_exactly(kind: str) -> None:
    n = 60
    records = sends(Ramp(kind, 2.0, 20.0, burstiness=math.inf), n)
    t = [r.t_send for r in records]
    for i, r in enumerate(records):
        assert r.info["request_rate"] == pytest.approx(asked(kind, 2.0, 20.0, i, n))
        if i:  # the gap before request i is 1 / (the rate at its send)
            assert 1.0 / (t[i] - t[i - 1]) == pytest.approx(r.info["request_rate"], rel=1e-9)


@pytest.mark.parametrize("kind", ["linear", "exponential"])
def test_poisson_ramp_rate_in_windows(kind: str) -> None:
    """Gamma gaps (burstiness 1: Poisson): over each tenth of the requests, the achieved rate
    (sends / time) is the harmonic mean of the asked rates there, within 10%."""
    n = 4000
    records = sends(Ramp(kind, 1.0, 50.0, seed=3), n)
    t = np.array([r.t_send for r in records])
    rates = np.array([r.info["request_rate"] for r in records])
    for part in np.array_split(np.arange(1, n), 10):
        achieved = part.size / (t[part[-1]] - t[part[0] - 1])
        expect = part.size / np.sum(1.0 / rates[part])
        assert achieved == pytest.approx(expect, rel=0.10)


def test_ramp_round_trips_and_is_labelled() -> None:
    r = Ramp("exponential", 1.0, 8.0, 1.0, 5, None)
    assert strategy_from_json(r.to_json()) == r
    assert r.to_json()["ramp_up_strategy"] == "exponential"
    assert "1->8 req/s" in r.label


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--ramp-up-strategy", "linear"], "--ramp-up-strategy needs --ramp-up-start-rps"),
        (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "5", "--ramp-up-end-rps", "1"],
         "expected 0 <= start <= end"),
        (["--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "0",
          "--ramp-up-end-rps", "4"], "--ramp-up-start-rps cannot be 0"),
        (["--ramp-up-start-rps", "1"], "need --ramp-up-strategy"),
        (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "4",
          "--request-rate", "3"], "do not give --request-rate"),
        (["--slo", "ttft"], "--slo: expected ttft:MS"),
        (["--slo", "ttft:abc"], "--slo: 'ttft:abc': 'abc' is not a number"),
        (["--slo", "ttft:500", "--slo-quantile", "1.5"], "--slo-quantile: expected a fraction"),
        (["--slo", "ttft:500", "--repeats", "2"], "--repeats >= 3"),
        (["--slo", "ttft:500", "--request-rate", "4"], "--slo searches the rate itself"),
    ],
)  # fmt: skip
def test_bad_ramp_and_slo_flags_are_one_line(argv: list[str], said: str, capsys) -> None:
    from harness.cli.main import main

    code = main(["--engine", "hf", "--model", "tiny", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert said in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("given, repeats", [([], 3), (["--repeats", "5"], 5)])
def test_slo_runs_a_fixed_number_of_repeats_under_the_sequential_default(given, repeats) -> None:
    """A comparison defaults to the sequential design, whose --repeats is None: --slo's CI is
    over repeats, so it runs a fixed n (3 unless --repeats), said in the dry-run plan."""
    from harness.cli.plan_view import repeats_line
    from harness.flags.inputs import model_names
    from harness.flags.parser import build_parser
    from harness.flags.plan import build_plan

    args = build_parser().parse_args(
        ["--engine", "vllm", "--spec", "ngram", "--model", "tiny", "--slo", "ttft:2000", *given]
    )
    plan = build_plan(args, *model_names(args))
    assert (plan.stopping, plan.repeats, plan.max_repeats) == ("fixed", repeats, repeats)
    assert repeats_line(plan).startswith(f"{repeats} (fixed: --slo's")


def test_the_slo_dry_run_says_what_the_search_runs(capsys) -> None:
    """--slo runs one engine instance per lane for the whole search (harness.run.capacity), its
    rates and so its requests chosen as it runs: the plan says so, not a rebuild per block nor
    the requests of the points the flags alone would give."""
    from harness.cli.main import main

    argv = ["--engine", "vllm", "--spec", "ngram", "--model", "tiny", "--slo", "ttft:2000",
            "tpot:200", "--slo-start-rate", "2", "--slo-max-probes", "6", "--dry-run"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "design: interleaved; engines built: one per lane for the whole search (2 in all)" in out
    assert "capacity search: rates from 2 req/s, chosen as it runs, at most 6 probed; each " \
           "probe 5 s of Poisson arrivals x 3 repeats per lane" in out  # fmt: skip
    assert "vllm/ngram: one engine for the whole search" in out
    assert "per block" not in out and " requests (+" not in out and "measured" not in out
