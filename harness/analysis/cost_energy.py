"""The answer in money and energy, computed once (docs/statistics.md, "Cost and energy").

Cost: ``--price-per-hour`` prices an hour of the hardware an engine's lane holds. A run holds it
for its wall time, so the cost of an output token is price x seconds per token, and the cost per
million output tokens of a row is ``price / 3600 x 1e6 / output_tok_s`` (the row's tokens/s:
the median over repeats of tokens over each run's wall time). The paired cost ratio (candidate
over baseline, <1 = cheaper) comes from the same paired blocks as the speedup: per block the
log cost ratio is log(price_c / price_b) - the log speedup of tokens/s, so its interval is the
speedup's, inverted, reversed and scaled by the price ratio (at equal price exactly the inverse).

Energy: each measured run's joules (``extra["energy"]``, harness.run.energy) over its output
tokens; a row's joules per token is its runs' joules summed over their tokens summed; the paired
ratio (candidate over baseline, <1 = less energy) is a t-interval (or the sequential design's)
on one log ratio of joules per token per block, like every other comparison.

What it adds to results.json: ``rows[].cost``, ``rows[].energy``, and on every tokens/s
comparison ``cost`` and ``energy`` (estimate, lo, hi, n, method, verdict: "cheaper" | "costs
more" (energy: "less energy" | "more energy") | "within +-x%" | "no significant difference" |
"undecided at N blocks" | "n/a (...)"; None when unpriced or unmeasured), and the answer
block's ``cost`` and ``energy`` entries (:func:`answer_entries`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from harness.analysis.comparisons.paired import UNPAIRED, UNPAIRED_DESIGNS
from harness.analysis.comparisons.sequential import Rule, sequential_comparison
from harness.analysis.comparisons.stats import Comparison, compare_log_ratios, verdict
from harness.analysis.pooled import point_key
from harness.core.results import Run, group_runs

HOUR_S = 3600.0
PER = 1e6  # cost per million output tokens
# a saving > 1 (the candidate better) in each ratio's words
COST_WORDS = {"faster": "cheaper", "slower": "costs more"}
ENERGY_WORDS = {"faster": "less energy", "slower": "more energy"}


def price_of(prices: Mapping[str, float] | None, name: str) -> float | None:
    """The price per hour of a variant's engine (``name`` "engine/label"), None unpriced."""
    if not prices:
        return None
    return prices.get(name.split("/")[0])


def usd_per_million(price: float | None, tok_s: float | None) -> float | None:
    """USD per million output tokens at ``price`` per device-hour and ``tok_s`` tokens/s."""
    if price is None or not tok_s:
        return None
    return price / HOUR_S * PER / tok_s


def run_energy(run: Run) -> tuple[float, int] | None:
    """(joules, output tokens of the counted requests that finished) of one run, None when no
    reading (or no tokens)."""
    e = (run.extra or {}).get("energy") or {}
    joules = e.get("joules")
    if joules is None:
        return None
    tokens = sum(r.output_tokens for r in run.records if r.counted)
    if tokens <= 0:
        return None
    return float(joules), tokens


def row_energy(runs: Sequence[Run]) -> dict[str, Any] | None:
    """A row's joules per output token over the runs with a reading, and where they came from."""
    read = [(r, e) for r in runs if (e := run_energy(r)) is not None]
    if not read:
        return None
    joules, tokens = sum(e[0] for _, e in read), sum(e[1] for _, e in read)
    seconds = sum(r.extra["energy"].get("seconds") or 0.0 for r, _ in read)
    first = read[0][0].extra["energy"]
    return {
        "joules_per_token": joules / tokens,
        "joules": joules,
        "output_tokens": tokens,
        "mean_watts": joules / seconds if seconds > 0 else None,
        "runs": len(read),
        "source": first.get("source"),
        "devices": first.get("devices"),
    }


def _flip(c: Comparison, words: Mapping[str, str]) -> dict[str, Any]:
    """A saving (>1 = the candidate better) as the ratio candidate / baseline, its interval
    inverted and reversed, its verdict in ``words``."""
    inv = lambda x: None if x is None else 1.0 / x  # noqa: E731
    return {
        "estimate": inv(c.estimate),
        "lo": inv(c.hi),
        "hi": inv(c.lo),
        "n": c.n,
        "method": c.method,
        "verdict": words.get(c.verdict, c.verdict),
    }


def cost_ratio(comp: Mapping[str, Any], factor: float, min_effect: float) -> dict[str, Any]:
    """The cost ratio of a tokens/s comparison at price ratio ``factor`` (candidate's price over
    the baseline's): saving = speedup / factor, its interval the speedup's scaled. At equal
    prices the verdict is the speedup's own (a sequential design's look included)."""
    est, lo, hi = (comp.get(k) for k in ("estimate", "lo", "hi"))
    scale = lambda x: None if x is None else x / factor  # noqa: E731
    v = comp.get("verdict") or "n/a"
    if factor != 1.0 and lo is not None and hi is not None:
        v = verdict(scale(est), scale(lo), scale(hi), min_effect)
    saving = Comparison("cost", scale(est), scale(lo), scale(hi), comp.get("n") or 0,
                        str(comp.get("method")), v)  # fmt: skip
    return _flip(saving, COST_WORDS)


def energy_ratio(
    base: Sequence[Run], cand: Sequence[Run], design: str, min_effect: float, rule: Rule | None
) -> dict[str, Any] | None:
    """Joules per token, candidate over baseline, paired by repeat; None when a side has no
    reading at all."""
    b = {r.cell.repeat: e for r in base if (e := run_energy(r)) is not None}
    c = {r.cell.repeat: e for r in cand if (e := run_energy(r)) is not None}
    if not b or not c:
        return None
    # per block: log of the baseline's joules per token over the candidate's (a saving)
    logs = [math.log((b[i][0] / b[i][1]) / (c[i][0] / c[i][1])) for i in sorted(b.keys() & c.keys())
            if b[i][0] > 0 and c[i][0] > 0]  # fmt: skip
    if rule is not None and design not in UNPAIRED_DESIGNS:
        saving = sequential_comparison("energy", logs, rule, min_effect)[0]
    else:
        saving = compare_log_ratios("energy", logs, min_effect)
    if design in UNPAIRED_DESIGNS:
        saving = Comparison(
            "energy", saving.estimate, None, None, saving.n, saving.method, UNPAIRED
        )
    return _flip(saving, ENERGY_WORDS)


def add_cost_energy(
    rows: Sequence[dict[str, Any]],
    comps: Sequence[dict[str, Any]],
    runs: Sequence[Run],
    prices: Mapping[str, float] | None,
    min_effect: float,
    rule: Rule | None = None,
) -> None:
    """Store ``cost`` and ``energy`` on every row and every tokens/s comparison (in place)."""
    groups = {
        (f"{k[0]}/{k[1]}", point_key(rs[0].cell.mode, rs[0].cell.load, rs[0].cell.max_new_tokens,
                                    rs[0].cell.workload)): rs
        for k, rs in group_runs(runs).items()
    }  # fmt: skip
    for row in rows:
        price = price_of(prices, row["name"])
        per_m = usd_per_million(price, row["summary"].get("output_tok_s"))
        row["cost"] = None if price is None else {
            "price_per_hour": price, "usd_per_million_tokens": per_m}  # fmt: skip
        row["energy"] = row_energy(groups.get((row["name"], row["point"]), []))
    for c in comps:
        if c["metric"] != "output_tok_s":
            continue
        pb, pc = price_of(prices, c["baseline"]), price_of(prices, c["candidate"])
        c["cost"] = None if pb is None or pc is None else cost_ratio(c, pc / pb, min_effect)
        point = point_key(c["mode"], c["load"], c["max_new_tokens"], c["workload"])
        base, cand = groups.get((c["baseline"], point)), groups.get((c["candidate"], point))
        c["energy"] = (
            energy_ratio(base, cand, c["design"], min_effect, rule) if base and cand else None
        )


def answer_entries(
    rows: Sequence[Mapping[str, Any]], comps: Sequence[Mapping[str, Any]], key: str
) -> list[dict[str, Any]]:
    """The answer block's ``cost`` or ``energy`` (``key``): each speculative candidate's ratio
    against its own engine's baseline at every point, with both rows' figures (USD per million
    tokens, joules per token); empty when nothing was priced or measured."""
    figure = {"cost": "usd_per_million_tokens", "energy": "joules_per_token"}[key]
    by = {(r["name"], r["point"]): r for r in rows}
    out = []
    for c in comps:
        same = c["baseline"].split("/")[0] == c["candidate"].split("/")[0]
        if c["metric"] != "output_tok_s" or not same or not c.get(key):
            continue
        point = point_key(c["mode"], c["load"], c["max_new_tokens"], c["workload"])
        b, k = by.get((c["baseline"], point)) or {}, by.get((c["candidate"], point)) or {}
        out.append({
            "candidate": c["candidate"], "baseline": c["baseline"], "mode": c["mode"],
            "load": dict(c["load"]), "max_new_tokens": c["max_new_tokens"],
            "workload": c["workload"], **c[key],
            "baseline_value": (b.get(key) or {}).get(figure),
            "candidate_value": (k.get(key) or {}).get(figure),
            "comparison": c.get("id"),
        })  # fmt: skip
    return out
