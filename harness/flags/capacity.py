"""Flags of ramp-up (vLLM bench serve's names), saturation detection and the capacity search
under an SLO (``--slo``, aligned with ``--goodput``), and their checks."""

from __future__ import annotations

import argparse
from typing import Any

from harness.core.ramp import RAMP_STRATEGIES
from harness.flags.options import UsageError, goodput, positive_float, positive_int

# --slo's repeats without --repeats: a fixed design (the capacity search probes rates, and each
# capacity's CI and the paired ratio's are over repeats), at the fewest that give a CI.
SLO_REPEATS = 3


def add_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ramp-up, saturation, capacity under an SLO")
    g.add_argument(
        "--ramp-up-strategy", choices=RAMP_STRATEGIES, default=None,
        help="ramp the request rate from --ramp-up-start-rps to --ramp-up-end-rps over the "
        "point's requests (as vllm bench serve); each request records its rate",
    )  # fmt: skip
    g.add_argument("--ramp-up-start-rps", type=float, default=None, help="ramp's first rate")
    g.add_argument("--ramp-up-end-rps", type=float, default=None, help="ramp's last rate")
    g.add_argument(
        "--detect-saturation", action="store_true",
        help="stop a rate point once arrivals outpace completions and TTFT trends up; it is "
        "marked 'saturated' (always on with a ramp or --slo)",
    )  # fmt: skip
    g.add_argument(
        "--slo", nargs="+", default=None, metavar="METRIC:MS",
        help="capacity search: per variant the highest request rate whose --slo-quantile of "
        "each metric stays under its bound, e.g. ttft:2000 tpot:200 [e2e:MS]",
    )  # fmt: skip
    g.add_argument(
        "--slo-quantile", type=float, default=0.9, help="the SLO's quantile (default 0.9)"
    )
    g.add_argument(
        "--slo-start-rate", type=positive_float, default=1.0,
        help="the search's first rate, req/s (default 1); it doubles or halves from there",
    )  # fmt: skip
    g.add_argument(
        "--slo-max-probes", type=positive_int, default=10,
        help="rates probed at most (each runs every variant, interleaved; default 10)",
    )  # fmt: skip


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The RunPlan fields of this group, checked (one-line errors)."""
    strategy = args.ramp_up_strategy
    start, end = args.ramp_up_start_rps, args.ramp_up_end_rps
    if strategy is not None:
        if args.request_rate:
            raise UsageError("--ramp-up-strategy: do not give --request-rate (the ramp sets it)")
        if start is None or end is None:
            raise UsageError("--ramp-up-strategy needs --ramp-up-start-rps and --ramp-up-end-rps")
        if start < 0 or end < 0 or start > end:
            raise UsageError("--ramp-up-start-rps/--ramp-up-end-rps: expected 0 <= start <= end")
        if strategy == "exponential" and start == 0:
            raise UsageError("--ramp-up-strategy exponential: --ramp-up-start-rps cannot be 0")
        if args.mode == "latency":
            raise UsageError("--ramp-up-strategy applies to throughput mode")
    elif start is not None or end is not None:
        raise UsageError("--ramp-up-start-rps/--ramp-up-end-rps need --ramp-up-strategy")
    slo = goodput(args.slo, "--slo")
    if slo is not None:
        if args.request_rate or strategy:
            raise UsageError("--slo searches the rate itself: drop --request-rate/--ramp-up-*")
        if not 0 < args.slo_quantile < 1:
            raise UsageError("--slo-quantile: expected a fraction in (0, 1), e.g. 0.9")
        if args.repeats is not None and args.repeats < SLO_REPEATS:
            raise UsageError(
                f"--slo: needs --repeats >= {SLO_REPEATS} (the CI is over repeats; default "
                f"{SLO_REPEATS})"
            )
    return {
        "ramp_up_strategy": strategy,
        "ramp_up_start_rps": start,
        "ramp_up_end_rps": end,
        "detect_saturation": args.detect_saturation,
        "slo": slo,
        "slo_quantile": args.slo_quantile,
        "slo_start_rate": args.slo_start_rate,
        "slo_max_probes": args.slo_max_probes,
    }
