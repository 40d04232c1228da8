"""The answer block's decisions under known truth: with no true difference it says "pays" or
"does not pay" rarely (the CI's 5%, shared by both tails, less where --min-effect cuts in);
with a planted 1.25x it says "pays" almost always. Simulated runs with per-repeat machine noise
(tests/test_stats.py's records), analysed by the real pipeline."""

from __future__ import annotations

import numpy as np
import pytest

from harness.analysis.answer import DOES_NOT, NOT_SIGNIFICANT, PAYS, answer_word
from harness.analysis.derived import analyze
from tests.test_stats import _records, _run

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
