"""Paired comparisons across runs: speedups with CIs and verdicts."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from harness.analysis.comparisons.sequential import Rule, sequential_comparison
from harness.analysis.comparisons.stats import (
    MIN_REPEATS,
    Comparison,
    compare_log_ratios,
    half_width,
    t975,
)
from harness.analysis.pooled import point_key
from harness.core.design import INTERLEAVED, SEPARATE, SEQUENTIAL, design_of
from harness.core.load import open_loop
from harness.core.records import RequestRecord
from harness.core.results import Run, group_runs

# Per-request metrics: lower is better, so a speedup is baseline / candidate. TTFT and E2E as the
# user waits them (DESIGN rule 11): from the schedule under an open loop, from the send in a
# closed one; the same clock as --slo, --goodput and the rate crossover (GOODPUT_METRICS).
LATENCIES: dict[str, Callable[[RequestRecord], float | None]] = {
    "tpot": lambda r: r.tpot,
    "ttft": lambda r: r.user_ttft,
    "e2e": lambda r: r.user_e2e,
}
METRICS = ("output_tok_s", *LATENCIES)

# Each variant's repeats back to back: a shift of the machine between the blocks is confounded
# with the variant (3% drift -> 73% false "slower" in simulation), so no CI over repeats covers
# it and no paired verdict is claimed (DESIGN.md, rule 1). The estimate is still shown. Runs of
# separate sessions (``compare`` of two files run one after the other) are the extreme case.
UNPAIRED_DESIGNS = (SEQUENTIAL, "mixed", SEPARATE)
UNPAIRED = "n/a (sequential design)"


def pair_design(runs: Iterable[Run]) -> str:
    """How a pair's runs were scheduled: SEPARATE when they come from more than one session
    (a run without a session marker belongs to whichever its file holds), else their design
    (harness.core.design.design_of)."""
    runs = list(runs)
    if len({r.session for r in runs if r.session is not None}) > 1:
        return SEPARATE
    return design_of(r.schedule for r in runs)


def deciding_metric(mode: str, load: Mapping[str, Any]) -> str:
    """The metric whose verdict is the point's verdict: tokens/s where the load is a closed loop
    (the harness keeps N in flight, so throughput is what it measures); E2E per request under an
    open loop (a rate, a ramp, a trace: :func:`harness.core.load.open_loop`), where tokens/s
    only echoes the arrival schedule."""
    return "e2e" if mode == "throughput" and open_loop(load) else "output_tok_s"


def _by_repeat(runs: list[Run]) -> dict[int, Run]:
    return {run.cell.repeat: run for run in runs}


def _tok_s(base: Run, cand: Run) -> float:
    """Log speedup of output tokens/s in one round. Throughput mode: tokens over the run's wall
    time (a property of the whole run). Latency mode (one at a time): summed tokens over summed
    E2E of the prompts that finished in both runs."""
    if base.cell.mode == "throughput":
        b, c = _run_tok_s(base), _run_tok_s(cand)
    else:
        bp = {r.request_id: r for r in base.counted}
        cp = {r.request_id: r for r in cand.counted}
        ids = sorted(set(bp) & set(cp))
        b = _sum_tok_s([bp[i] for i in ids])
        c = _sum_tok_s([cp[i] for i in ids])
    return math.log(c / b) if b > 0 and c > 0 else math.nan


def _sum_tok_s(rs: list[RequestRecord]) -> float:
    secs = sum(r.e2e for r in rs)
    return sum(r.output_tokens for r in rs) / secs if secs > 0 else math.nan


def _run_tok_s(run: Run) -> float:
    rs = run.counted
    if not rs:
        return math.nan
    span = max(r.t_end for r in rs) - min(r.t_send for r in rs)
    return sum(r.output_tokens for r in rs) / span if span > 0 else math.nan


def _latency(name: str) -> Callable[[Run, Run], float]:
    """Log speedup of one latency in one round: the mean over prompts of log(base / cand)."""
    value = LATENCIES[name]

    def log_speedup(base: Run, cand: Run) -> float:
        bp = {r.request_id: value(r) for r in base.counted}
        cp = {r.request_id: value(r) for r in cand.counted}
        logs = [
            math.log(bp[i] / cp[i])
            for i in sorted(bp.keys() & cp.keys())
            if bp[i] is not None and cp[i] is not None and bp[i] > 0 and cp[i] > 0
        ]
        return float(np.mean(logs)) if logs else math.nan

    return log_speedup


ROUND_LOG_SPEEDUP: dict[str, Callable[[Run, Run], float]] = {
    "output_tok_s": _tok_s,
    **{name: _latency(name) for name in LATENCIES},
}


def log_speedups(base: list[Run], cand: list[Run], metric: str) -> list[float]:
    """One log speedup (>0 = candidate better) per repeat that both sides ran, in repeat order."""
    b, c = _by_repeat(base), _by_repeat(cand)
    return [ROUND_LOG_SPEEDUP[metric](b[i], c[i]) for i in sorted(b.keys() & c.keys())]


def compare_groups(
    base: list[Run], cand: list[Run], *, min_effect: float, seed: int = 0, rule: Rule | None = None
) -> dict[str, Comparison]:
    """Speedups of ``cand`` over ``base`` (>1 = candidate better) for every metric, paired by
    repeat (see harness/analysis/comparisons/stats.py for why the repeat is the unit); with ``rule`` the
    sequential design's interval (harness.analysis.comparisons.sequential). ``seed`` is unused (the
    t-interval draws nothing) and kept for callers."""
    del seed
    if rule is not None:
        return {
            m: sequential_comparison(m, log_speedups(base, cand, m), rule, min_effect)[0]
            for m in METRICS
        }
    return {m: compare_log_ratios(m, log_speedups(base, cand, m), min_effect) for m in METRICS}


def comparisons(
    runs: Sequence[Run],
    *,
    min_effect: float = 0.02,
    seed: int = 0,
    rule: Rule | None = None,
    stopped: Mapping[str, str] | None = None,
) -> list[dict]:
    """Spec vs baseline of the same engine, and each engine vs the first engine (same label).

    One dict per (pair, point, metric), the shape every reader uses::

        baseline, candidate   "engine/label"
        mode, load, max_new_tokens, workload   the plan point
        metric       "output_tok_s" | "tpot" | "ttft" | "e2e"
        estimate     speedup, >1 = candidate better (tok/s: cand/base; latencies: base/cand),
                     exp(mean of per-repeat log speedups); None when nothing paired
        lo, hi       95% CI of the speedup; None when n < MIN_REPEATS (harness.analysis.comparisons.stats) or the
                     design is sequential/mixed (verdict "n/a (sequential design)")
        n            repeats paired (the unit), i.e. how many repeats this point used
        method       how the CI was made ("t on per-repeat log ratios")
        verdict      "faster" | "slower" | "within +-2%" (significant, below --min-effect) |
                     "no significant difference" | "n/a (n too small)" |
                     "n/a (sequential design)" | "n/a"
        decides      True on the metric that decides this pair at this point: output_tok_s
                     in closed loop, e2e under an open loop (see deciding_metric)
        design       how the pair's runs were scheduled (harness.core.design: "interleaved",
                     "sequential", "mixed", "unknown", "separate sessions")
        (harness.analysis.derived adds ``id`` and ``lossless``, the index of the pair's output check)

    With ``rule`` (the run's sequential design, harness.analysis.comparisons.sequential) every interleaved
    pair's interval is the group-sequential one, reported at its first deciding look, and the
    dict adds ``looks`` (each look: n, estimate, lo, hi, boundary, decided, verdict), ``blocks``
    (the n reported) and ``stopped`` ("decided", or why its point stopped: ``stopped`` maps a
    point key (harness.analysis.pooled.point_key) to "cap", "budget", ...; "cap" when n
    reached the cap).
    """
    del seed
    groups = group_runs(runs)
    engines = list(dict.fromkeys(r.cell.engine for r in runs))
    out: list[dict[str, Any]] = []
    for (engine, label, *point), cand in groups.items():
        pairs = []
        if label != "baseline" and (engine, "baseline", *point) in groups:
            pairs.append(((engine, "baseline"), groups[(engine, "baseline", *point)]))
        if engine != engines[0] and (engines[0], label, *point) in groups:
            pairs.append(((engines[0], label), groups[(engines[0], label, *point)]))
        cell = cand[0].cell
        decides = deciding_metric(cell.mode, cell.load)
        for (b_engine, b_label), base in pairs:
            design = pair_design((*base, *cand))
            seq: dict[str, dict[str, Any]] = {}
            if rule is not None and design == INTERLEAVED:
                point = _point_key(cell)
                for metric in METRICS:
                    comp, extra = sequential_comparison(
                        metric, log_speedups(base, cand, metric), rule, min_effect
                    )
                    if not extra["decided"]:
                        why = "cap" if comp.n >= rule.cap else (stopped or {}).get(point, "stopped")
                        extra["stopped"] = why
                    seq[metric] = {"comp": comp, "extra": extra}
                ratios = {m: v["comp"] for m, v in seq.items()}
            else:
                ratios = compare_groups(base, cand, min_effect=min_effect)
            for metric, comp in ratios.items():
                if design in UNPAIRED_DESIGNS:
                    comp = replace(comp, lo=None, hi=None, verdict=UNPAIRED)
                extra = (
                    {k: v for k, v in seq[metric]["extra"].items() if k != "decided"} if seq else {}
                )
                out.append(
                    {
                        "baseline": f"{b_engine}/{b_label}",
                        "candidate": f"{engine}/{label}",
                        "mode": cell.mode,
                        "load": dict(cell.load),
                        "max_new_tokens": cell.max_new_tokens,
                        "workload": cell.workload,
                        **comp.to_json(),
                        "decides": metric == decides,
                        "design": design,
                        **extra,
                    }
                )
    return out


def _point_key(cell: Any) -> str:
    return point_key(cell.mode, cell.load, cell.max_new_tokens, cell.workload)


def precise_enough(runs: Sequence[Run], target: float, min_effect: float = 0.02) -> bool:
    """--target-ci: whether the runs of one plan point so far pin every deciding comparison
    (candidate vs baseline) to a valid 95% CI of half-width <= ``target`` (log scale, ~ +-x).
    With nothing to compare (one lane, or a sequential design, whose comparisons get no CI
    however long they run), each lane's own tokens/s: a t-interval of its mean log."""
    comps = [
        c
        for c in comparisons(runs, min_effect=min_effect)
        if c["decides"] and c["verdict"] != UNPAIRED
    ]
    if comps:
        widths = [half_width(c) for c in comps]
        return all(w is not None and w <= target for w in widths)
    for lane in group_runs(runs).values():
        logs = [math.log(x) for x in (_run_tok_s(r) for r in lane) if x > 0]
        if len(logs) < MIN_REPEATS:
            return False
        h = t975(len(logs) - 1) * float(np.std(logs, ddof=1)) / math.sqrt(len(logs))
        if h > target:
            return False
    return True
