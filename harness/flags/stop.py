"""The flags that say how many blocks a point gets: the sequential design (the default where a
run compares), its budget and cap, or a fixed n (--repeats, --target-ci)."""

from __future__ import annotations

import argparse

from harness.flags.options import positive_float, positive_int

# The fixed-n design (--repeats N, or a run that compares nothing): blocks are the unit of every
# CI (harness/analysis/comparisons/stats.py); with a fresh engine per block 4 find a 10% speedup of tok/s at
# 3% run noise 54% of the time, 20% 96% (README, Statistics; tests/test_calibration.py).
DEFAULT_REPEATS = 4
# A run that compares (--spec, --aa, several engines) uses the sequential design by default
# (harness.analysis.comparisons.sequential): looks from 3 blocks, the cap, and one time budget for the
# session, so that the main job's worst case (every answer close) runs the 4 blocks the fixed
# design ran (~1.8 min a block on 2 cores) and stays under 10 minutes with set-up and report.
DEFAULT_BUDGET_MIN = 8.0


def add(r: argparse._ArgumentGroup) -> None:
    """--repeats, --budget, --target-ci, --max-repeats (resolved by harness.flags.plan._stopping)."""
    r.add_argument(
        "--repeats",
        type=positive_int,
        default=None,
        help="fixed design: N blocks (repeats) of every point. Default: a run that compares "
        "(--spec, --aa, several engines) stops each point when its verdicts are settled (the "
        f"sequential design, README Statistics); --slo: 3; else {DEFAULT_REPEATS}",
    )
    r.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="MINUTES",
        help="sequential design: minutes of the session for all blocks; after the first 3 a "
        "block starts only where it fits, for the points still undecided (default "
        f"{DEFAULT_BUDGET_MIN:g}; 0: none)",
    )
    r.add_argument(
        "--target-ci",
        type=positive_float,
        default=None,
        metavar="W",
        help="keep repeating a point until the 95%% CI of every candidate-vs-baseline speedup "
        "that decides there (tok/s; E2E at a request rate) has a half-width under W (log scale, "
        "0.05 ~ +-5%%), up to --max-repeats (a precision target, not a verdict: fixed-n "
        "intervals)",
    )
    r.add_argument(
        "--max-repeats",
        type=positive_int,
        default=None,
        help="cap on blocks: of the sequential design (default 8) or of --target-ci (default 20)",
    )
