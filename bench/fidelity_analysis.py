"""The fidelity benchmark's analysis, apart from its measurement (bench/fidelity.py): rows of
each side's runs in round order (in memory, or ``runs.jsonl`` re-read) -> the table, the
verdicts and the lines beside them. ``python -m bench.fidelity_analysis RUNS.jsonl`` prints
them for a saved or cut-short run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from bench.common import Headline, med, median_ci, ratio_headline, spread, table

SAMPLED_S = 0.5  # the interval every run used before sampling became opt-in


KEYS = ("tok_s", "ttft", "server_itl")
LABELS = {
    "tok_s": ("output tok/s", 1.0),
    "ttft": ("median TTFT (ms)", 1e3),
    "server_itl": ("server's mean ITL (ms, its /metrics)", 1e3),
}


def by_round(runs: dict[str, list[dict]], side: str, key: str) -> dict[int, float]:
    """Round -> ratio ``side`` / vllm bench of one figure, for the rounds in which both sides
    measured it (a figure missing or zero on either side leaves that round out)."""
    v = {r["round"]: r.get(key) for r in runs["vbench"]}
    return {
        r["round"]: r[key] / v[r["round"]] for r in runs[side] if r.get(key) and v.get(r["round"])
    }


def pair_ratios(runs: dict[str, list[dict]], side: str, key: str) -> list[float]:
    """Per-round ratios ``side`` / vllm bench of one figure, in round order."""
    d = by_round(runs, side, key)
    return [d[k] for k in sorted(d)]


def results_table(runs: dict[str, list[dict]]) -> str:
    """Medians of each side and the per-round ratios [min, max]; the sampled side if it ran."""
    if not (runs["harness"] and runs["vbench"]):
        return "No timed round finished."
    sampled = bool(runs.get("sampled"))
    headers = [
        "metric",
        "harness (median)",
        "vllm bench (median)",
        "harness / vllm bench [min, max]",
    ]
    if sampled:
        headers += [f"harness --sample-server-load {SAMPLED_S:g} (median)", "its ratio [min, max]"]
    rows = []
    for key in KEYS:
        label, sc = LABELS[key]
        row = [label] + [
            med([r[key] * sc for r in runs[s] if r.get(key) is not None])
            for s in ("harness", "vbench")
        ]
        row.append(spread(pair_ratios(runs, "harness", key)))
        if sampled:
            row += [
                med([r[key] * sc for r in runs["sampled"] if r.get(key) is not None]),
                spread(pair_ratios(runs, "sampled", key)),
            ]
        rows.append(row)
    tokens = (
        ["output tokens per run"] + [runs[s][0]["tokens"] for s in ("harness", "vbench")] + [""]
    )
    if sampled:
        tokens += [runs["sampled"][0]["tokens"], ""]
    return table(headers, rows + [tokens])


def noise_line(itl_r: list[float], unit: str = "pairs") -> str:
    """Done-when wording for the server's ITL: equal within noise means its CI contains 1."""
    ci = median_ci(itl_r)
    if ci is None:
        return f"Server's ITL: too few {unit} for a CI."
    lo, hi, level = ci
    same = lo <= 1.0 <= hi
    return (
        f"Server's mean ITL, harness runs / vllm bench runs: {level:.1%} CI of the median "
        f"[{lo:.3f}, {hi:.3f}] "
        + (
            "contains 1: equal within noise."
            if same
            else "excludes 1: the server ran at a different speed."
        )
    )


def abba(rs: Mapping[int, float]) -> list[float]:
    """Rounds 2k and 2k+1 merged (with two sides: one with the harness first, one with vllm bench
    first, A B B A): the geometric mean of their ratios, in which a drift linear over the four
    runs cancels. A round whose partner is missing (left out, or the last of an odd count)
    joins no block."""
    return [math.sqrt(rs[k] * rs[k + 1]) for k in sorted(rs) if k % 2 == 0 and k + 1 in rs]


def lag1(rs: list[float]) -> float | None:
    """Lag-1 autocorrelation of the log ratios: near 0 when rounds are independent, as the
    order-statistic CI assumes."""
    xs = [math.log(r) for r in rs]
    if len(xs) < 3:
        return None
    m = sum(xs) / len(xs)
    den = sum((x - m) ** 2 for x in xs)
    return sum((a - m) * (b - m) for a, b in zip(xs, xs[1:])) / den if den else None


def analyse(runs: dict[str, list[dict]]) -> tuple[list[str], list[Headline]]:
    """The table, the ITL's noise line, the design check, the TTFT line and the three headlines
    from the runs of each side in round order (what ``run`` measured, or ``runs.jsonl``).

    With two sides the verdicts use A B B A blocks (rounds 2k, 2k+1 merged): the first side
    alternates, so a drift or a carry-over from the run before biases single rounds in
    alternating directions (their log ratios were negatively autocorrelated at lag 1:
    docs/measurements.md), against the independence the order-statistic CI assumes; a block
    cancels both. Three sides rotate: single rounds."""
    two = not runs.get("sampled")
    unit = "A B B A blocks" if two else "rounds"
    rounds = {k: by_round(runs, "harness", k) for k in KEYS}
    per_round = {k: [d[i] for i in sorted(d)] for k, d in rounds.items()}
    used = {k: abba(rounds[k]) if two else rs for k, rs in per_round.items()}
    alone = {k: len(per_round[k]) - 2 * len(used[k]) for k in KEYS} if two else {}
    checks = []
    for key, rs in per_round.items():
        ci, r1, rb = median_ci(rs), lag1(rs), lag1(used[key])
        checks.append(
            f"{LABELS[key][0].split(' (')[0]}: single rounds "
            + (f"{med(rs):.3f}" if rs else "n/a")
            + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
            + ", lag-1 autocorrelation "
            + ("n/a" if r1 is None else f"{r1:+.2f}")
            + (f" (the blocks': {rb:+.2f})" if two and rb is not None else "")
            + (f", {alone[key]} round(s) in no block" if alone.get(key) else "")
        )
    design = (
        f"Verdicts on {unit}"
        + (
            " (rounds 2k and 2k+1 merged: a drift linear over four runs and the order cancel)"
            if two
            else ""
        )
        + ". Beside them: "
        + "; ".join(checks)
        + ". Independent units show a lag-1 autocorrelation near 0."
    )
    heads = [
        ratio_headline("output tok/s harness / vllm bench", used["tok_s"], 0.95, 1.05, "within 5%", unit),
        ratio_headline("median TTFT harness / vllm bench", used["ttft"], 0.90, 1.10, "within 10%", unit),
        ratio_headline(
            "server's mean ITL, harness runs / vllm bench runs", used["server_itl"], 0.95, 1.05,
            "within 5%", unit,
        ),
    ]  # fmt: skip
    body = [results_table(runs), noise_line(used["server_itl"], unit), design, ttft_line(runs)]
    return body, heads


def ttft_line(runs: dict[str, list[dict]]) -> str:
    """Whose TTFT is nearer the server's own: each client's mean TTFT over a run minus the
    server's mean TTFT (its histogram, arrival to first token) over the same run. What is
    left is the delivery and the client's own delay in stamping; the smaller, the truer."""
    sides = ("harness", "vbench")
    if not all(runs[s] and runs[s][0].get("server_ttft") is not None for s in sides):
        return "Client TTFT against the server's own: not recorded in these runs."
    gap = {
        s: {
            r["round"]: (r["ttft_mean"] - r["server_ttft"]) * 1e3
            for r in runs[s]
            if r.get("ttft_mean") is not None and r.get("server_ttft") is not None
        }
        for s in sides
    }
    both = sorted(set(gap["harness"]) & set(gap["vbench"]))
    if not both:
        return "Client TTFT against the server's own: no round with both figures."
    ci = median_ci([gap["harness"][i] - gap["vbench"][i] for i in both])
    return (
        "Mean TTFT minus the server's own mean TTFT over the same run (its /metrics; what is "
        f"left is delivery plus the client's delay in stamping): harness "
        f"{med(list(gap['harness'].values())):.1f} ms, vllm bench "
        f"{med(list(gap['vbench'].values())):.1f} ms (medians over rounds); harness - vllm bench "
        + (f"{ci[0]:+.1f} .. {ci[1]:+.1f} ms ({ci[2]:.1%} CI of the median)" if ci else "n/a")
        + "."
    )


def load(path: Path) -> dict[str, list[dict]]:
    """``runs.jsonl`` back into each side's timed runs in round order (warm-ups left out)."""
    runs: dict[str, list[dict]] = {"harness": [], "vbench": [], "sampled": []}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in sorted((r for r in rows if r["round"] is not None), key=lambda r: r["round"]):
        runs[row["side"]].append(row)
    return runs


if (
    __name__ == "__main__"
):  # python -m bench.fidelity_analysis RUNS.jsonl: a saved run's analysis again
    import sys

    body, heads = analyse(load(Path(sys.argv[1])))
    for h in heads:
        value = "n/a" if h.value is None else f"{h.value:.3f}"
        print(f"{h.label}: {value} ({h.target}): {h.verdict}; {h.detail}")
    print("\n\n".join(body))
