"""The answer block's decisions under known truth: with no true difference it says "pays" or
"does not pay" rarely (the CI's 5%, shared by both tails, less where --min-effect cuts in);
with a planted 1.25x it says "pays" almost always. Simulated runs with per-repeat machine noise
(tests/test_stats.py's records), analysed by the real pipeline."""

from __future__ import annotations

import numpy as np
import pytest

from harness.analysis.answer import DOES_NOT, NO_VERDICT, NOT_SIGNIFICANT, PAYS, answer_word
from harness.analysis.derived import analyze
from harness.report.answer_text import answer_sections
from tests.test_stats import _batch_run, _records, _run

SIMULATIONS = 200


def _decisions(planted: float, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(SIMULATIONS):
        runs = []
        for r in range(5):
            machine = rng.lognormal(0.0, 0.05)  # the whole repeat slower or faster
            runs.append(_run(_records(rng, machine, n_prompts=6, tokens=16), "baseline", r))
            runs.append(_run(_records(rng, machine * planted, n_prompts=6, tokens=16), "ngram", r))
        (entry,) = analyze(runs, min_effect=0.02, temperature=0.0)["answer"]["speculation"]
        assert entry["n"] == 5 and entry["baseline"] == "fake/baseline"
        out.append(entry["answer"])
    return out


def test_no_true_difference_rarely_reads_as_a_decision():
    got = _decisions(1.0, seed=11)
    decided = sum(a in (PAYS, DOES_NOT) for a in got) / len(got)
    assert decided <= 0.08, decided  # nominal 5%; 200 runs: a binomial margin
    assert got.count(NOT_SIGNIFICANT) >= 0.9 * len(got)


def test_a_planted_speedup_pays():
    got = _decisions(1.25, seed=12)
    assert got.count(PAYS) / len(got) >= 0.95, got.count(PAYS)


@pytest.mark.parametrize(
    "verdict,word",
    [
        ("faster", PAYS),
        ("slower", DOES_NOT),
        ("within +-2%", DOES_NOT),
        ("no significant difference", NOT_SIGNIFICANT),
        ("n/a (n too small)", "no verdict"),
        ("n/a (sequential design)", "no verdict"),
        (None, "no verdict"),
    ],
)
def test_each_verdict_reads_as_one_decision(verdict, word):
    assert answer_word(verdict) == word


def _where_it_stops(speedups: dict[float, float], noise: tuple[float, ...]) -> tuple[dict, str]:
    """Open-loop runs at each request rate, the candidate ``speedups[rate]`` faster on E2E with
    its own per-repeat factors ``noise``: the stored crossover entry and its line."""
    runs = []
    for rate, speedup in speedups.items():
        for r, f in enumerate(noise):
            runs.append(_batch_run("baseline", r, 0.05, 1.0, rate=rate))
            runs.append(_batch_run("ngram", r, 0.05, f / speedup, rate=rate))
    res = analyze(runs, min_effect=0.02, temperature=0.0)
    (stop,) = res["answer"]["stops"]
    (line,) = dict(answer_sections(res))["Where it stops paying"]
    return stop, line


NOISY = (0.8, 1.25, 1.0)  # the candidate's own spread over 3 repeats: no verdict either way


def test_an_undecided_comparison_reads_as_undecided_not_as_does_not_pay():
    stop, line = _where_it_stops({2.0: 1.0, 8.0: 1.0}, NOISY)
    assert (stop["kind"], stop["verdict"], stop["answer"]) == (
        "never pays", "no significant difference", NOT_SIGNIFICANT)  # fmt: skip
    assert "does not pay" not in line, line
    assert line.startswith(
        "fake/ngram (64 tok): at request rate 2 undecided at 3 repeats (no significant "
        "difference): cannot say whether it pays (E2E "
    ), line
    stop, line = _where_it_stops({2.0: 2.0, 8.0: 1.0}, NOISY)
    assert (stop["kind"], stop["answer"]) == ("stops paying", NOT_SIGNIFICANT)
    assert "; from 8 undecided at 3 repeats" in line and "does not pay" not in line, line


def test_a_decided_comparison_still_reads_as_does_not_pay():
    stop, line = _where_it_stops({2.0: 0.5, 8.0: 0.5}, (1.0, 1.01, 1.02))
    assert (stop["kind"], stop["verdict"], stop["answer"]) == ("never pays", "slower", DOES_NOT)
    assert "does not pay even at request rate 2 (E2E 0.50x [" in line and "slower" in line
    stop, line = _where_it_stops({2.0: 2.0, 8.0: 0.5}, (1.0, 1.01, 1.02))
    assert "pays up to request rate 2; from 8 it does not pay (E2E 0.50x [" in line, line


def test_the_sequential_undecided_verdict_reads_as_undecided():
    """A sequential run's stored verdict names its blocks: the line says them as they are."""
    stop = {"candidate": "hf/ngram", "max_new_tokens": 32, "unit": "concurrency",
            "kind": "never pays", "at": 1.0, "metric": "output_tok_s", "estimate": 1.01,
            "lo": 0.9, "hi": 1.12, "n": 5, "method": "group-sequential t",
            "verdict": "undecided at 5 blocks", "answer": NO_VERDICT}  # fmt: skip
    (line,) = dict(answer_sections({"answer": {"stops": [stop]}}))["Where it stops paying"]
    assert line.startswith(
        "hf/ngram (32 tok): at concurrency 1 undecided at 5 blocks: cannot say whether it pays"
    ), line
