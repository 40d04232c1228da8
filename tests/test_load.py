"""Load strategies decide only when requests go."""

import numpy as np
import pytest

from harness.core.load import Concurrent, Constant, Poisson, Synchronous, strategy_from_json


def test_poisson_mean_gap_is_one_over_rate():
    offsets = Poisson(rate=8.0, seed=1).offsets(20001)
    gaps = np.diff(offsets)
    assert gaps.mean() == pytest.approx(1 / 8.0, rel=0.03)
    # exponential gaps: coefficient of variation ~1
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


def test_poisson_is_seeded_and_burstiness_changes_spread():
    assert Poisson(4.0, seed=7).offsets(50) == Poisson(4.0, seed=7).offsets(50)
    assert Poisson(4.0, seed=7).offsets(50) != Poisson(4.0, seed=8).offsets(50)
    regular = np.diff(Poisson(4.0, burstiness=8.0, seed=1).offsets(5000))
    bursty = np.diff(Poisson(4.0, burstiness=0.25, seed=1).offsets(5000))
    assert regular.mean() == pytest.approx(0.25, rel=0.05)
    assert bursty.mean() == pytest.approx(0.25, rel=0.15)
    assert regular.std() < 0.5 * bursty.std()


def test_constant_and_closed_loops():
    assert Constant(4.0).offsets(3) == [0.0, 0.25, 0.5]
    assert Concurrent(8).offsets(3) == [0.0, 0.0, 0.0] and Concurrent(8).max_concurrency == 8
    assert Synchronous().max_concurrency == 1


@pytest.mark.parametrize(
    "s", [Synchronous(), Concurrent(4), Constant(2.0, 8), Poisson(3.0, 0.5, 2, 16)]
)
def test_json_round_trip(s):
    assert strategy_from_json(s.to_json()) == s
