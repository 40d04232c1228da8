"""What the numbers mean: output sanity, theory (Leviathan et al.) next to measurement, and the
crossover concurrency where speculation stops paying."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.records import RequestRecord


def fmt_ratio(c: Mapping[str, Any] | None) -> str:
    """A stored speedup with its CI and n ("1.23x [1.10, 1.37] n=5"), or "n/a"."""
    if not c or c.get("estimate") is None:
        return "n/a"
    if c.get("lo") is None:
        return f"{c['estimate']:.2f}x (no CI, n={c['n']})"
    return f"{c['estimate']:.2f}x [{c['lo']:.2f}, {c['hi']:.2f}] n={c['n']}"


# ---- output sanity ---------------------------------------------------------------------------
def degenerate(record: RequestRecord) -> str | None:
    """ "whitespace" (mostly blank text), "repetition" (stuck on one short n-gram) or None."""
    text = record.output_text
    if text is not None and len(text) >= 8:
        blank = sum(ch.isspace() for ch in text) / len(text)
        if blank > 0.5:
            return "whitespace"
    ids = record.output_token_ids
    if ids and len(ids) >= 16:
        tail = ids[len(ids) // 2 :]
        for period in range(1, 9):
            if len(tail) > 2 * period and all(
                tail[i] == tail[i - period] for i in range(period, len(tail))
            ):
                return "repetition"
    return None


def sanity(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Share of counted outputs that are degenerate, by kind."""
    counted = [r for r in records if r.counted]
    kinds = [degenerate(r) for r in counted]
    out: dict[str, Any] = {"outputs": len(counted)}
    for kind in ("whitespace", "repetition"):
        n = kinds.count(kind)
        out[kind] = n / len(counted) if counted else None
    return out


# ---- theory ------------------------------------------------------------------------------------
def expected_tokens(alpha: float, gamma: int) -> float:
    """E = (1 - alpha^(gamma+1)) / (1 - alpha): tokens per target pass (Leviathan et al. 2023)."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """E / (gamma * c + 1), c = cost of a draft step relative to a target step."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def best_gamma(alpha: float, c: float, up_to: int = 16) -> int:
    return max(range(1, up_to + 1), key=lambda g: predicted_speedup(alpha, g, c))


def theory(
    spec_config: Mapping[str, Any] | None,
    spec_metrics: Mapping[str, Any] | None,
    engine_info: Mapping[str, Any],
) -> dict[str, Any] | None:
    """Predicted speedup from the measured alpha and cost ratio c (None when unknown)."""
    if not spec_config or not spec_metrics or spec_metrics.get("alpha") is None:
        return None
    gamma = spec_config.get("num_speculative_tokens")
    if not gamma:
        return None
    alpha = float(spec_metrics["alpha"])
    method = spec_config.get("method")
    costs = engine_info.get("step_costs") or {}
    c = costs.get("c")
    c_source = "measured" if c is not None else None
    if c is None and method in ("ngram", "suffix"):
        c, c_source = 0.0, "lookup (no model)"
    out: dict[str, Any] = {
        "alpha": alpha,
        "gamma": int(gamma),
        "c": c,
        "c_source": c_source,
        "expected_tokens_per_pass": expected_tokens(alpha, int(gamma)),
    }
    if c is not None:
        out["predicted_speedup"] = predicted_speedup(alpha, int(gamma), float(c))
        out["best_gamma"] = best_gamma(alpha, float(c))
    return out


# ---- crossover ---------------------------------------------------------------------------------
def _x(c: Mapping[str, Any]) -> float | None:
    if c["mode"] == "latency":
        return 1.0
    load = c["load"]
    return load.get("concurrency") if "request_rate" not in load else load.get("request_rate")


def crossover_lines(comparisons: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per spec configuration: up to which load it pays, and where it stops."""
    series: dict[tuple[str, int, bool], list[tuple[float, Mapping[str, Any]]]] = {}
    for c in comparisons:
        same_engine = c["baseline"].split("/")[0] == c["candidate"].split("/")[0]
        if not c["decides"] or not same_engine or c["estimate"] is None:
            continue
        x = _x(c)
        if x is None:
            continue
        rate = "request_rate" in c["load"]
        series.setdefault((c["candidate"], c["max_new_tokens"], rate), []).append((float(x), c))
    lines = []
    for (cand, mnt, rate), pts in sorted(series.items()):
        pts.sort(key=lambda p: p[0])
        if len(pts) < 2:
            continue
        unit = "request rate" if rate else "concurrency"
        pays = [x for x, c in pts if c["verdict"] == "faster"]
        stop = next(((x, c) for x, c in pts if c["verdict"] != "faster"), None)
        if stop is None:
            lines.append(
                f"{cand} ({mnt} tok): speculation pays at every {unit} tried (up to {pts[-1][0]:g}: {fmt_ratio(pts[-1][1])})."
            )
        elif not pays or stop[0] == pts[0][0]:
            lines.append(
                f"{cand} ({mnt} tok): speculation does not pay even at {unit} {pts[0][0]:g} ({fmt_ratio(pts[0][1])}, {pts[0][1]['verdict']})."
            )
        else:
            last = max(x for x in pays if x < stop[0])
            lines.append(
                f"{cand} ({mnt} tok): speculation pays up to {unit} {last:g}; "
                f"from {stop[0]:g} it is {fmt_ratio(stop[1])} ({stop[1]['verdict']})."
            )
    return lines
