"""Paired comparisons across runs: speedups with CIs and verdicts, and the lossless check."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from harness.records import RequestRecord
from harness.results import Run
from harness.stats import Ratio, median_speedup, paired_ratio, throughput_speedup

# metric name -> (what each prompt contributes, the paired statistic)
PromptValue = Callable[[list[RequestRecord]], list[float] | None]


def _tok_time(rs: list[RequestRecord]) -> list[float] | None:
    return [float(sum(r.output_tokens for r in rs)), float(sum(r.e2e for r in rs))]


def _median_of(attr: str) -> PromptValue:
    def value(rs: list[RequestRecord]) -> list[float] | None:
        xs = [getattr(r, attr) for r in rs]
        xs = [x for x in xs if x is not None]
        return [float(np.median(xs))] if xs else None

    return value


PROMPT_METRICS: dict[str, tuple[PromptValue, Callable[[np.ndarray, np.ndarray], float]]] = {
    "output_tok_s": (_tok_time, throughput_speedup),
    "tpot": (_median_of("tpot"), median_speedup),
    "ttft": (_median_of("ttft"), median_speedup),
    "e2e": (_median_of("e2e"), median_speedup),
}


def group_runs(runs: Sequence[Run]) -> dict[tuple[Any, ...], list[Run]]:
    """Runs of one configuration at one plan point, repeats pooled."""
    groups: dict[tuple[Any, ...], list[Run]] = defaultdict(list)
    for run in runs:
        if run.status == "ok" or run.status == "interrupted":
            groups[(run.cell.engine, run.cell.label, *run.cell.group)].append(run)
    return groups


def _by_prompt(runs: list[Run]) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = defaultdict(list)
    for run in runs:
        for r in run.counted:
            out[r.request_id].append(r)
    return out


def compare_groups(
    base: list[Run], cand: list[Run], *, min_effect: float, seed: int = 0
) -> dict[str, Ratio]:
    """Speedups of ``cand`` over ``base`` (>1 = candidate better), paired by prompt.

    Throughput-mode tokens/s is a property of the whole run, so there it is paired by repeat.
    """
    out: dict[str, Ratio] = {}
    if base[0].cell.mode == "throughput":
        b = {r.cell.repeat: r for r in base}
        c = {r.cell.repeat: r for r in cand}
        reps = sorted(set(b) & set(c))
        rows_b = np.array([_run_tok_time(b[i]) for i in reps], dtype=float).reshape(-1, 2)
        rows_c = np.array([_run_tok_time(c[i]) for i in reps], dtype=float).reshape(-1, 2)
        ok = np.isfinite(rows_b).all(axis=1) & np.isfinite(rows_c).all(axis=1)
        out["output_tok_s"] = paired_ratio(
            rows_b[ok], rows_c[ok], throughput_speedup, min_effect=min_effect, seed=seed
        )
    bp, cp = _by_prompt(base), _by_prompt(cand)
    ids = sorted(set(bp) & set(cp))
    for name, (value, stat) in PROMPT_METRICS.items():
        if name in out:
            continue
        pairs = [(value(bp[i]), value(cp[i])) for i in ids]
        pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
        rows_b = np.array([x for x, _ in pairs], dtype=float)
        rows_c = np.array([y for _, y in pairs], dtype=float)
        out[name] = paired_ratio(rows_b, rows_c, stat, min_effect=min_effect, seed=seed)
    return out


def _run_tok_time(run: Run) -> list[float]:
    rs = run.counted
    if not rs:
        return [float("nan"), float("nan")]
    start = min(r.t_send for r in rs)
    end = max(r.t_end for r in rs)
    return [float(sum(r.output_tokens for r in rs)), end - start]


def lossless(base: list[Run], cand: list[Run]) -> dict[str, Any]:
    """Share of prompts whose output token ids are identical; first divergence otherwise."""

    def first_ids(runs: list[Run]) -> dict[str, tuple[int, ...]]:
        out: dict[str, tuple[int, ...]] = {}
        for run in runs:
            for r in run.counted:
                if r.output_token_ids is not None:
                    out.setdefault(r.request_id, r.output_token_ids)
        return out

    b, c = first_ids(base), first_ids(cand)
    ids = sorted(set(b) & set(c))
    diverged = {}
    for i in ids:
        if b[i] != c[i]:
            x, y = b[i], c[i]
            pos = next((k for k, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            diverged[i] = pos
    return {
        "compared": len(ids),
        "identical": len(ids) - len(diverged),
        "share_identical": (len(ids) - len(diverged)) / len(ids) if ids else None,
        "first_divergence": diverged,
    }


def comparisons(runs: Sequence[Run], *, min_effect: float = 0.02, seed: int = 0) -> list[dict]:
    """Spec vs baseline of the same engine, and each engine vs the first engine (same label)."""
    groups = group_runs(runs)
    engines = list(dict.fromkeys(r.cell.engine for r in runs))
    out: list[dict[str, Any]] = []
    for (engine, label, *point), cand in groups.items():
        pairs = []
        if label != "baseline" and (engine, "baseline", *point) in groups:
            pairs.append(((engine, "baseline"), groups[(engine, "baseline", *point)]))
        if engine != engines[0] and (engines[0], label, *point) in groups:
            pairs.append(((engines[0], label), groups[(engines[0], label, *point)]))
        for (b_engine, b_label), base in pairs:
            ratios = compare_groups(base, cand, min_effect=min_effect, seed=seed)
            check = lossless(base, cand)
            for metric, ratio in ratios.items():
                out.append(
                    {
                        "baseline": f"{b_engine}/{b_label}",
                        "candidate": f"{engine}/{label}",
                        "mode": cand[0].cell.mode,
                        "load": dict(cand[0].cell.load),
                        "max_new_tokens": cand[0].cell.max_new_tokens,
                        "workload": cand[0].cell.workload,
                        "metric": metric,
                        **ratio.to_json(),
                        "lossless": check if metric == "output_tok_s" else None,
                    }
                )
    return out
