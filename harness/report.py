"""Markdown views of results.json: rebuilt from the JSON alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tabulate import tabulate

from harness.analysis import group_runs
from harness.insight import crossover_lines, fmt_ratio, sanity, theory
from harness.results import Run
from harness.stats import instability, median, summarize


def fmt(x: Any, scale: float = 1.0, digits: int = 1) -> str:
    """A number, or "n/a" for a missing value (never 0)."""
    if x is None:
        return "n/a"
    return f"{x * scale:.{digits}f}"


def _pooled(runs: list[Run]) -> dict[str, Any]:
    """Summary over the pooled repeats of one configuration at one point."""
    records = [r for run in runs for r in run.records]
    s = summarize(records)
    per_rep = [summarize(run.records).get("output_tok_s") for run in runs]
    per_rep = [x for x in per_rep if x is not None]
    s["output_tok_s_runs"] = per_rep
    s["output_tok_s"] = median(per_rep)
    s["instability"] = instability(per_rep)
    return s


def _spec(runs: list[Run]) -> dict[str, Any] | None:
    """Spec counters summed over repeats, rates recomputed."""
    ms = [r.spec_metrics for r in runs if r.spec_metrics]
    if not ms:
        return None
    drafts = sum(m["num_drafts"] for m in ms)
    dt = sum(m["num_draft_tokens"] for m in ms)
    acc = sum(m["num_accepted_tokens"] for m in ms)
    n = max(len(m.get("accepted_per_pos") or []) for m in ms)
    pos = [
        sum(
            (m.get("accepted_per_pos") or [0] * n)[i]
            if i < len(m.get("accepted_per_pos") or [])
            else 0
            for m in ms
        )
        for i in range(n)
    ]
    passes = [m.get("target_passes") for m in ms]
    return {
        "target_passes": sum(passes) if all(p is not None for p in passes) else None,
        "num_drafts": drafts,
        "acceptance_rate": acc / dt if dt else None,
        "mean_acceptance_length": 1 + acc / drafts if drafts else None,
        "alpha": pos[0] / drafts if drafts and pos else None,
        "acceptance_per_pos": [x / drafts for x in pos] if drafts else [],
    }


def _load_label(load: Mapping[str, Any]) -> str:
    if "request_rate" in load:
        cap = f", cap {load['concurrency']}" if load.get("concurrency") else ""
        return f"{load['request_rate']:g} req/s{cap}"
    n = load.get("concurrency", 1)
    return "1 at a time" if n == 1 else f"concurrency {n}"


def render(results: Mapping[str, Any]) -> str:
    runs = [Run.from_json(r) for r in results.get("runs", [])]
    comps = results.get("comparisons", [])
    lines = [f"# Harness results ({results.get('created', '')})", ""]
    env = results.get("environment", {})
    lines.append(
        f"Machine: {env.get('processor', '?')}, {env.get('cpu_count', '?')} CPUs"
        + (f", GPU {env['gpu']}" if env.get("gpu") else "")
        + f"; torch {env.get('torch') or 'n/a'}, transformers {env.get('transformers') or 'n/a'}, "
        f"vllm {env.get('vllm') or 'n/a'}. Workload: {results.get('workload', {}).get('name', '?')} "
        f"({results.get('workload', {}).get('num_requests', '?')} prompts)."
    )
    if results.get("status") not in (None, "complete"):
        lines += ["", f"**Run {results['status']}**: partial results."]
    groups = group_runs(runs)
    points: dict[tuple[Any, ...], list[tuple[str, str]]] = {}
    for engine, label, *point in groups:
        points.setdefault(tuple(point), []).append((engine, label))
    for point, members in points.items():
        mode, load, mnt, workload = point
        lines += ["", f"## {mode}, {_load_label(dict(load))}, max_new_tokens={mnt}", ""]
        rows = []
        for engine, label in members:
            rs = groups[(engine, label, *point)]
            s = _pooled(rs)
            sp = _spec(rs)
            comp = _find(comps, f"{engine}/{label}", mode, dict(load), mnt, None)
            base_name = comp["baseline"] if comp else None
            unstable = s.get("instability")
            rows.append(
                [
                    f"{engine}/{label}",
                    f"{s['completed']}/{s['failed']}",
                    fmt(s.get("output_tok_s"))
                    + (" (unstable)" if unstable is not None and unstable > 0.10 else ""),
                    fmt(s.get("ttft_s", {}).get("median"), 1e3),
                    fmt(s.get("ttft_s", {}).get("p99"), 1e3),
                    fmt(s.get("tpot_s", {}).get("median"), 1e3, 2),
                    fmt(s.get("tpot_s", {}).get("p99"), 1e3, 2),
                    fmt(s.get("e2e_s", {}).get("median"), 1e3, 0),
                    fmt(sp and sp["acceptance_rate"], 1, 2),
                    fmt(sp and sp["alpha"], 1, 2),
                    fmt(sp and sp["mean_acceptance_length"], 1, 2),
                    (
                        f"{_METRIC_TAG[comp['metric']]}{fmt_ratio(comp)} vs "
                        f"{base_name.split('/')[-1]}"
                        if comp
                        else "n/a"
                    ),
                    comp.get("verdict", "n/a") if comp else "n/a",
                    _lossless(comp),
                    _sanity(rs),
                ]
            )
        headers = [
            "engine/variant",
            "ok/failed",
            "out tok/s",
            "TTFT med ms",
            "TTFT p99 ms",
            "TPOT med ms",
            "TPOT p99 ms",
            "E2E med ms",
            "accept rate",
            "alpha",
            "mean acc len",
            "speedup [95% CI] (tok/s; E2E at a request rate)",
            "verdict",
            "identical to baseline",
            "degenerate out",
        ]
        lines.append(tabulate(rows, headers=headers, tablefmt="github"))
        sol = results.get("speed_of_light")
        if sol and mode == "latency":
            shares = ", ".join(f"{row[0]} {_share(row[2], sol['tok_s'])}" for row in rows)
            lines.append(
                f"\nSpeed of light (batch-1 decode reads all {sol['n_params'] / 1e6:.2f}M "
                f"parameters x {sol['bytes_per_param']} B per token at "
                f"{sol['bandwidth_bytes_s'] / 1e9:.1f} GB/s): {sol['tok_s']:.0f} tok/s; "
                f"reached: {shares}."
            )
        bad = [
            r
            for r in (groups.get((e, lb, *point), []) for e, lb in members)
            for r in r
            if r.status != "ok"
        ]
        for run in bad:
            lines.append(
                f"\n- {run.cell.engine}/{run.cell.label} repeat {run.cell.repeat}: {run.status}"
            )
    skipped = [r for r in runs if r.status.startswith(("unsupported", "failed", "stopped"))]
    if skipped:
        lines += ["", "## Cells not run", ""]
        seen = set()
        for r in skipped:
            key = (r.cell.engine, r.cell.label, r.cell.mode, _load_label(r.cell.load), r.status)
            if key not in seen:
                seen.add(key)
                lines.append(f"- {key[0]}/{key[1]}, {key[2]}, {key[3]}: {key[4]}")
    lines += _theory_table(groups, comps)
    cross = crossover_lines(comps)
    if cross:
        lines += ["", "## Crossover", "", *[f"- {x}" for x in cross]]
    lines += _comparison_table(comps)
    lines += [
        "",
        "Times are medians over all counted requests of all repeats; out tok/s is the median "
        "over repeats of (output tokens / run wall time). Speedups are candidate over baseline "
        "(>1 = faster) with a 95% t-interval over the n repeats paired (one log ratio per "
        "repeat); acceptance rate = accepted / drafted "
        "tokens (vLLM's definition), alpha = acceptance at draft position 1, mean acc len = "
        "1 + accepted / drafts.",
        "",
    ]
    return "\n".join(lines)


def _share(tok_s: str, bound: float) -> str:
    try:
        return f"{float(tok_s.split()[0]) / bound:.1%}"
    except ValueError:
        return "n/a"


def _sanity(runs: list[Run]) -> str:
    s = sanity([r for run in runs for r in run.records])
    if not s["outputs"]:
        return "n/a"
    parts = [f"{k} {s[k]:.0%}" for k in ("whitespace", "repetition") if s[k]]
    return ", ".join(parts) if parts else "none"


def _theory_table(
    groups: Mapping[tuple[Any, ...], list[Run]], comps: Sequence[Mapping[str, Any]]
) -> list[str]:
    rows = []
    for (engine, label, mode, load, mnt, _), rs in groups.items():
        if mode != "latency" or rs[0].spec_config is None:
            continue
        th = theory(rs[0].spec_config, _spec(rs), rs[0].engine_info)
        if th is None:
            continue
        comp = _find(comps, f"{engine}/{label}", mode, dict(load), mnt, "output_tok_s")
        sp = _spec(rs)
        tokens = sum(r.output_tokens for run in rs for r in run.counted)
        per_tok = sp["target_passes"] / tokens if sp and sp["target_passes"] and tokens else None
        rows.append(
            [
                f"{engine}/{label}",
                mnt,
                fmt(th["alpha"], 1, 2),
                th["gamma"],
                fmt(th["c"], 1, 3) + (f" ({th['c_source']})" if th["c_source"] else " (unknown)"),
                fmt(th["expected_tokens_per_pass"], 1, 2),
                fmt(th.get("predicted_speedup"), 1, 2),
                fmt_ratio(comp),
                th.get("best_gamma", "n/a"),
                fmt(per_tok, 1, 2),
            ]
        )
    if not rows:
        return []
    return [
        "",
        "## Theory vs measurement (latency mode)",
        "",
        "Leviathan et al. (2023): E = (1 - alpha^(gamma+1)) / (1 - alpha) tokens per target pass; "
        "predicted speedup = E / (gamma*c + 1), c = draft step cost / target step cost.",
        "",
        tabulate(
            rows,
            headers=[
                "engine/variant",
                "max tok",
                "alpha",
                "gamma",
                "c",
                "E tok/pass",
                "predicted",
                "measured tok/s speedup",
                "best gamma (1-16)",
                "target passes / token",
            ],
            tablefmt="github",
        ),
    ]


_METRIC_TAG = {"output_tok_s": "", "e2e": "E2E ", "tpot": "TPOT ", "ttft": "TTFT "}


def _lossless(comp: Mapping[str, Any] | None) -> str:
    check = (comp or {}).get("lossless")
    if not check or check.get("share_identical") is None:
        return "n/a"
    out = f"{check['identical']}/{check['compared']}"
    div = check.get("first_divergence") or {}
    if div:
        out += f" (first diff at token {min(div.values())})"
    return out


def _find(
    comps: Sequence[Mapping[str, Any]],
    cand: str,
    mode: str,
    load: Mapping,
    mnt: int,
    metric: str | None,
) -> Mapping[str, Any] | None:
    """The comparison of ``cand`` at this point on ``metric`` (None: the deciding one): against
    its own engine's baseline first, else against the first engine (engine vs engine)."""
    matches = [
        c
        for c in comps
        if (c["candidate"], c["mode"], c["load"], c["max_new_tokens"]) == (cand, mode, load, mnt)
        and (c["metric"] == metric if metric else c["decides"])
    ]
    same_engine = [c for c in matches if c["baseline"].split("/")[0] == cand.split("/")[0]]
    return (same_engine or matches or [None])[0]


def _comparison_table(comps: Sequence[Mapping[str, Any]]) -> list[str]:
    if not comps:
        return []
    rows = [
        [
            f"{c['candidate']} vs {c['baseline']}",
            f"{c['mode']}, {_load_label(c['load'])}, {c['max_new_tokens']} tok",
            c["metric"],
            fmt_ratio(c),
            c["method"],
            c["verdict"],
        ]
        for c in comps
    ]
    return [
        "",
        "## Paired comparisons",
        "",
        tabulate(
            rows,
            headers=["pair", "cell", "metric", "speedup [95% CI] n", "method", "verdict"],
            tablefmt="github",
        ),
    ]
