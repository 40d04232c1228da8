"""From the best speculative arm per load to one ``speculative_config`` that vLLM accepts as is.

vLLM (0.32, ``vllm/v1/spec_decode/dynamic/utils.py``) takes ``num_speculative_tokens_per_batch_size``:
``[[range_start, range_end, K], ...]``, inclusive batch-size ranges, sorted, non-overlapping, the
first starting at 1; K >= 0 (0 = no drafting at that batch size); batch sizes in a gap or above
the last range keep the previous range's K; every K is clamped to ``num_speculative_tokens``,
which must be > 0. The scheduler looks K up by the number of requests in each step.

Two things a per-load answer can hold that one config cannot, and what is emitted instead:
* one method per config: the method that won at the most loads; where another won, that load
  gets this method's own best K there (or 0), and a note says what was given up;
* loads are concurrencies, the schedule is by batch size: load L_i covers batch sizes
  [L_i, L_(i+1) - 1] (as vLLM's ``tune_speculative_k.py`` does), the first range starts at 1
  and batch sizes above the last load keep its K.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.common.vllm_args import SCHEDULE
from harness.analysis.comparisons.stats import Comparison, t975, t_quantile
from harness.tune.search import LoadResult

Schedule = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class Pick:
    """The answer at one load: the chosen method (None = speculation off) and K, and for each
    method the K to use here if the config's method is that one (0 = off)."""

    load: int
    method: str | None
    k: int
    speedup: float | None = None  # the chosen arm over the baseline (point estimate)
    by_method: Mapping[str, tuple[int, float | None]] = field(default_factory=dict)
    off: str = ""  # why the chosen arm is not emitted here (speculation off), if it is not


def choose_method(picks: Sequence[Pick]) -> str | None:
    """The method chosen at the most loads; ties go to the larger summed log speedup."""
    score: dict[str, tuple[int, float]] = {}
    for p in picks:
        if p.method is None:
            continue
        n, s = score.get(p.method, (0, 0.0))
        gain = math.log(p.speedup) if p.speedup and p.speedup > 0 else 0.0
        score[p.method] = (n + 1, s + gain)
    if not score:
        return None
    return max(sorted(score), key=lambda m: score[m])


def ranges(ks: Sequence[tuple[int, int]]) -> Schedule:
    """(load, K) pairs -> inclusive batch-size ranges, adjacent equal K merged."""
    pts = sorted(ks)
    out: list[list[int]] = []
    for i, (load, k) in enumerate(pts):
        start = 1 if i == 0 else load
        end = pts[i + 1][0] - 1 if i + 1 < len(pts) else load
        if out and out[-1][2] == k:
            out[-1][1] = end
        else:
            out.append([start, end, k])
    return tuple((a, b, k) for a, b, k in out)


def build_config(
    picks: Sequence[Pick], method_configs: Mapping[str, Mapping[str, Any]],
    method: str | None = None,
) -> tuple[dict[str, Any] | None, Schedule, list[str]]:  # fmt: skip
    """(speculative_config, schedule, notes). The config is None where speculation pays at none
    of the loads tuned: a schedule of K = 0 everywhere is not the same as no speculative_config (the engine
    still carries the method and its drafter's cost: docs/tune.md), so the answer there is to
    run without one. ``method``: the config's method where already chosen (a correction keeps
    it), else ``choose_method``."""
    notes: list[str] = []
    if method is None or all(p.method is None for p in picks):
        method = choose_method(picks)
    if method is None:
        return (
            None,
            (),
            ["speculation pays at none of the loads tuned: run without a speculative_config"],
        )
    ks: list[tuple[int, int]] = []
    for p in sorted(picks, key=lambda p: p.load):
        if p.method in (method, None):
            ks.append((p.load, p.k if p.method == method else 0))
            continue
        k, s = p.by_method.get(method, (0, None))
        ks.append((p.load, k))
        here = f"{method}(k={k})" + (f" {s:.2f}x" if s else "") if k else "speculation off"
        notes.append(
            f"load {p.load}: the best was {p.method}(k={p.k})"
            + (f" ({p.speedup:.2f}x)" if p.speedup else "")
            + f"; vLLM takes one method per config, so this schedule uses {here} there"
        )
    schedule = ranges(ks)
    top = max(k for _, _, k in schedule)
    config = {
        **dict(method_configs[method]),
        "method": method,
        "num_speculative_tokens": max(top, 1),  # must be > 0; the schedule says where K = 0
        SCHEDULE: [list(r) for r in schedule],
    }
    if method != "ngram" and any(k == 0 for _, _, k in schedule):
        notes.append(
            f"K = 0 ranges of {method} are not speculation off: the drafter still costs its steps "
            "(docs/tune.md); the "
            "verification's schedule-vs-baseline column says what they cost here"
        )
    loads = sorted(p.load for p in picks)
    if loads and loads[0] > 1:
        notes.append(f"batch sizes 1..{loads[0] - 1} (not measured) take the K of load {loads[0]}")
    if loads:
        notes.append(
            f"batch sizes above {loads[-1]} (not measured) keep the K of load {loads[-1]} "
            "(vLLM carries the last range forward)"
        )
    return config, schedule, notes


def fixed_config(config: Mapping[str, Any], k: int) -> dict[str, Any]:
    """The same speculative_config with one fixed K everywhere (no schedule)."""
    out = {key: v for key, v in config.items() if key != SCHEDULE}
    out["num_speculative_tokens"] = k
    return out


def describe(schedule: Schedule) -> str:
    """ "batch 1-3: K=4, 4-7: K=2, 8+: off" (the last range reaches every larger batch)."""
    parts = []
    for i, (a, b, k) in enumerate(schedule):
        last = i == len(schedule) - 1
        span = f"{a}+" if last else (f"{a}" if a == b else f"{a}-{b}")
        parts.append(f"{span}: {'off' if k == 0 else f'K={k}'}")
    return "batch " + ", ".join(parts)


FAMILY_ALPHA = 0.05  # the chance, over every arm raced at a load, that one is emitted unproven
RULE = (
    "speculation is on at a load only where the chosen arm's CI against the baseline, at the "
    f"Bonferroni level 1 - {FAMILY_ALPHA}/m over the m speculative arms measured there (the "
    "pilot's probes included), lies above 1 + the tolerance (--min-effect): lower bound > 1.02 "
    "by default, so the evidence holds after choosing the best of m (the winner's curse), "
    "decided or undecided alike; elsewhere K = 0. Where the verification then finds the schedule "
    "significantly slower than the baseline at a load (or than a fixed K shown faster than the "
    "baseline there by this rule, in the search and again in the verification over the loads "
    "verified), that load is set to that fixed K (else K = 0) and verified again; where no "
    "change of K can correct a load (it runs that K already), the fixed K's own config is "
    "emitted in the schedule's place if it passed this rule and its confirmation at every load, "
    "else none (speculation off) where that load runs K = 0, else that load is set to K = 0. "
    "Significantly slower: over the loads verified (1 - 0.05/n)"
)


def raced(r: LoadResult) -> int:
    """The speculative arms a load's choice was made among: every one measured there, the
    pilot's probes included (a probe pruned after one round was still a chance to lead), at
    least 1."""
    return max(1, sum(1 for c in r.candidates if c.arm.method and c.rounds))


def adjusted_lo(v: Comparison | None, arms: int, alpha: float = FAMILY_ALPHA) -> float | None:
    """The lower bound of ``v``'s CI at the two-sided level 1 - alpha / arms (Bonferroni), from
    its 95% one (the same t-interval on per-round log ratios, wider by the ratio of quantiles)."""
    if v is None or v.estimate is None or v.lo is None or v.estimate <= 0 or v.lo <= 0:
        return None
    wider = t_quantile(1 - alpha / (2 * arms), v.n - 1) / t975(v.n - 1)
    return math.exp(math.log(v.estimate) - wider * (math.log(v.estimate) - math.log(v.lo)))


def adjusted_hi(v: Comparison | None, arms: int, alpha: float = FAMILY_ALPHA) -> float | None:
    """The upper bound of ``v``'s CI at the two-sided level 1 - alpha / arms (``adjusted_lo``'s
    other side)."""
    if v is None or v.estimate is None or v.hi is None or v.estimate <= 0 or v.hi <= 0:
        return None
    wider = t_quantile(1 - alpha / (2 * arms), v.n - 1) / t975(v.n - 1)
    return math.exp(math.log(v.estimate) + wider * (math.log(v.hi) - math.log(v.estimate)))


def shown_slower(v: Comparison | None, tol: float, arms: int = 1) -> bool:
    """The verification's "significantly slower", over the ``arms`` (loads) it looked at: the
    estimate more than the tolerance below 1 and the CI at the level 1 - 0.05/arms below 1. At
    95% per load, a schedule equal to the baseline at 4 loads is found slower somewhere in up to
    1 - 0.975^4 ~ 10% of tunes (a K = 0 range of ngram runs the baseline's own steps): a
    correction, or a FAILED tune, made by noise (tests/test_tune_emit.py)."""
    if v is None or v.estimate is None or v.estimate > 1 - tol:
        return False
    hi = adjusted_hi(v, arms)
    return hi is not None and hi < 1


def pays(v: Comparison | None, tol: float, arms: int = 1) -> bool:
    """Speculation on: its CI against the baseline, at the level adjusted for the ``arms`` it was
    chosen among, above 1 + the tolerance (``RULE``). The unadjusted CI of the best of several
    arms holds less often than it says, and a bound just above 1 still emitted truly slower loads
    where speculation breaks even on a noisy machine (tests/test_tune_emit.py; docs/tune.md)."""
    if v is None or v.estimate is None or v.estimate <= 1 + tol:
        return False
    lo = adjusted_lo(v, arms)
    return lo is not None and lo > 1 + tol


def off_why(v: Comparison | None, tol: float, arms: int) -> str:
    """Why a speculative leader is not emitted (``RULE``), in the table's words."""
    if v is None or v.estimate is None or v.estimate <= 1 + tol:
        return f"off: not more than {tol:.0%} faster than the baseline"
    lo = adjusted_lo(v, arms)
    level = f"{1 - FAMILY_ALPHA / arms:.1%}"
    return (
        f"off: not shown more than {tol:.0%} faster than the baseline at the {level} level over "
        f"the {arms} arms raced" + (f" (lower bound {lo:.2f})" if lo is not None else " (no CI)")
    )


def picks(results: Sequence[LoadResult], tol: float = 0.02) -> list[Pick]:
    """Per load: the chosen arm where it pays (``pays``), else speculation off; and for each
    method its best K that pays there (none: off): what a one-method schedule can use there."""
    out = []
    for r in results:
        m_arms = raced(r)
        by_method: dict[str, tuple[int, float | None]] = {}
        for c in r.candidates:
            m, v = c.arm.method, c.vs_baseline
            if m is None or v is None or v.estimate is None or c.status == "pruned":
                continue
            if pays(v, tol, m_arms) and v.estimate > (by_method.get(m, (0, 0.0))[1] or 0.0):
                by_method[m] = (c.arm.k, v.estimate)
        chosen = r.candidate(r.chosen)
        v = chosen.vs_baseline if chosen else None
        if r.chosen.method is not None and pays(v, tol, m_arms):
            out.append(Pick(r.load, r.chosen.method, r.chosen.k, v.estimate, by_method))
            continue
        why = off_why(v, tol, m_arms) if r.chosen.method is not None else ""
        out.append(Pick(r.load, None, 0, 1.0, by_method, why))  # on only where shown to pay
    return out


def best_fixed_k(results: Sequence[LoadResult], method: str) -> int:
    """The single K of ``method`` with the best summed log speedup over the loads (measured
    where it raced, else predicted), of the K that raced somewhere: its engine is warm."""
    score = _scores(results, method)
    return max(sorted(score), key=lambda k: score[k]) if score else 1


def best_fixed_score(results: Sequence[LoadResult], method: str) -> float:
    return max(_scores(results, method).values(), default=-math.inf)


def _scores(results: Sequence[LoadResult], method: str) -> dict[int, float]:
    ran = {c.arm.k for r in results for c in r.candidates if c.arm.method == method and c.rounds}
    score: dict[int, float] = {}
    for r in results:
        for c in r.candidates:
            if c.arm.method != method or c.arm.k not in ran:
                continue
            v = c.vs_baseline
            s = v.estimate if v is not None and v.estimate and c.status != "pruned" else None
            s = s or c.predicted
            if s and s > 0:
                score[c.arm.k] = score.get(c.arm.k, 0.0) + math.log(s)
    return score
