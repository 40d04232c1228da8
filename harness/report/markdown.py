"""summary.md from results.json: formats the stored analysis (:mod:`harness.analysis.derived`) through the
column registry (:mod:`harness.report.columns`); computes nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tabulate import tabulate

from harness.core.design import PER_BLOCK, SEPARATE
from harness.core.results import PACKAGES
from harness.report.columns import (
    COMPARISONS,
    MAIN,
    METRIC_LABEL,
    THEORY,
    Column,
    Line,
    ci_text,
    load_label,
    method_tag,
    percentile_columns,
)
from harness.report.workload_tables import workload_lines

FOOTNOTE = (
    "Times are medians over all counted requests of all repeats; out tok/s is the median over "
    "repeats of (output tokens / run wall time). Speedups are candidate over baseline (>1 = "
    "better) with a 95% CI, its n (the units paired) and its method; acceptance rate = "
    "accepted / drafted tokens (vLLM's definition), alpha = acceptance at draft position 1, "
    "mean acc len (vLLM) = 1 + accepted / drafts (counts only passes that drafted), tok/target "
    "pass = output tokens / target forward passes (every pass, measured)."
)

THEORY_NOTE = (
    "Leviathan et al. (2023): E = (1 - alpha^(gamma+1)) / (1 - alpha) tokens per target pass; "
    "predicted speedup = E / (gamma*c + 1), c = draft step cost / target step cost. c from "
    "step times = (seconds per target pass of the speculative run / seconds per token of the "
    "baseline - 1) / gamma: drafting (model or n-gram lookup) and verification as they ran; "
    "bare forwards = one draft forward / one target forward, without the round's overhead. "
    "Best gamma only where the cost model has a finite optimum."
)


def table(columns: Sequence[Column], lines: Sequence[Line], metric: str = "output_tok_s") -> str:
    headers = [c.header.format(metric=METRIC_LABEL.get(metric, metric)) for c in columns]
    rows = [[c.fmt(c.get(x)) for c in columns] for x in lines]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _at(items: Sequence[Mapping[str, Any]] | None, i: int | None) -> Mapping[str, Any] | None:
    return None if i is None or items is None else items[i]


def _instances_phrase(instances: Mapping[str, str]) -> str:
    """One short phrase: fresh engine instances per block, or one for the whole run (then an
    instance's own speed offset is not inside the CI); older files say nothing."""
    kinds = set(instances.values())
    if not kinds:
        return ""
    if kinds == {PER_BLOCK}:
        return "Engines: a fresh instance per block (seeded build order per block). "
    ones = ", ".join(lane for lane, k in instances.items() if k != PER_BLOCK)
    return f"Engines: one instance for the whole run ({ones}): instance effect not in the CI. "


SEPARATE_NOTE = (
    "Runs of separate sessions (files run one after the other) were not interleaved, so their "
    "pairs show the estimate only, CI n/a (sequential design)."
)


def _design_lines(results: Mapping[str, Any]) -> list[str]:
    """The design (harness.core.design) and what each engine's cache got before its measured runs."""
    design = results.get("design")
    if not design:
        return []
    caches: dict[str, set[str]] = {}
    for run in results.get("runs", []):
        cache = (run.get("schedule") or {}).get("cache")
        if cache:
            caches.setdefault(run["engine"], set()).add(cache)
    done = "; ".join(f"{e}: {', '.join(sorted(c))}" for e, c in caches.items())
    return [
        "",
        f"Design: {design['name']} ({design['description']}). "
        + _instances_phrase(design.get("instances") or {})
        + f"Prefix cache: {design['prefix_cache_description']}"
        + (f" (before each measured run: {done})." if done else "."),
    ]


def render(results: Mapping[str, Any]) -> str:
    comps, checks = results.get("comparisons") or [], results.get("lossless") or []
    lines = [f"# Harness results ({results.get('created', '')})", ""]
    env, wl = results.get("environment", {}), results.get("workload", {})
    lines.append(
        f"Machine: {env.get('processor', '?')}, {env.get('cpu_count', '?')} CPUs"
        + (f", GPU {env['gpu']}" if env.get("gpu") else "")
        + "; "
        + ", ".join(f"{p} {env.get(p) or 'n/a'}" for p in PACKAGES)
        + f". Workload: {wl.get('name', '?')} "
        f"({wl.get('num_requests', '?')} prompts)."
    )
    lines += _design_lines(results)
    if any(c.get("design") == SEPARATE for c in comps):  # compare of files run one after another
        lines += ["", SEPARATE_NOTE]
    if results.get("upgraded_from"):
        lines += ["", f"(A schema {results['upgraded_from']} file: derived numbers recomputed.)"]
    if results.get("status") not in (None, "complete"):
        lines += ["", f"**Run {results['status']}**: partial results."]
    points: dict[str, list[Mapping[str, Any]]] = {}
    for row in results.get("rows", []):
        points.setdefault(row["point"], []).append(row)
    not_run = results.get("not_run") or []
    sol = results.get("speed_of_light")
    for point, rows in points.items():
        first = rows[0]
        lines += [
            "",
            f"## {first['mode']}, {load_label(first['load'])}, max_new_tokens={first['max_new_tokens']}",
            "",
        ]
        view = [
            Line(r, _at(comps, r.get("comparison")), _at(checks, r.get("lossless"))) for r in rows
        ]
        lines.append(table(MAIN, view, first.get("deciding_metric", "output_tok_s")))
        lines += in_flight_notes(rows) + token_id_notes(rows)
        extra = percentile_columns(results.get("config") or {})
        if extra:
            lines += ["", table(extra, view)]
        if sol and first["mode"] == "latency":
            shares = ", ".join(
                f"{s['name']} {'n/a' if s['share'] is None else format(s['share'], '.1%')}"
                for s in sol["reached"]
                if s["point"] == point
            )
            lines.append(
                f"\nSpeed of light (batch-1 decode reads all {sol['n_params'] / 1e6:.2f}M "
                f"parameters x {sol['bytes_per_param']} B per token at "
                f"{sol['bandwidth_bytes_s'] / 1e9:.1f} GB/s, {sol.get('memory', 'host')} memory): "
                f"{sol['tok_s']:.0f} tok/s; "
                f"reached: {shares}."
            )
        for n in not_run:
            if n["point"] == point and n["repeat"] is not None:
                lines.append(f"\n- {n['name']} repeat {n['repeat']}: {n['status']}")
    skipped = [
        n for n in not_run if str(n["status"]).startswith(("unsupported", "failed", "stopped"))
    ]
    if skipped:
        lines += ["", "## Cells not run", ""]
        lines += [
            f"- {n['name']}, {n['mode']}, {load_label(n['load'])}: {n['status']}" for n in skipped
        ]
    theory = results.get("theory") or []
    if theory:
        view = [Line(t, _at(comps, t.get("comparison"))) for t in theory]
        lines += [
            "",
            "## Theory vs measurement (latency mode)",
            "",
            THEORY_NOTE,
            "",
            table(THEORY, view),
        ]
    lines += category_lines(results.get("categories") or [])
    lines += workload_lines(results)  # a trace replay's checks, a conversation run's turns
    cross = [crossover_line(x, comps) for x in results.get("crossover") or []]
    if cross:
        lines += ["", "## Crossover", "", *[f"- {x}" for x in cross]]
    if comps:
        view = [Line(c) for c in comps]
        lines += ["", "## Paired comparisons", "", table(COMPARISONS, view)]
    methods = dict.fromkeys(c["method"] for c in comps if c.get("method"))
    named = "; ".join(f"{method_tag(m)} = {m}" for m in methods)
    lines += ["", FOOTNOTE + (f" CI methods: {named}." if named else ""), ""]
    return "\n".join(lines)


def category_cell(cell: Mapping[str, Any] | None) -> str:
    """``1.42x [1.23, 1.66] faster, acc 0.34`` (speedup, CI, verdict, acceptance rate)."""
    if not cell:
        return "n/a"
    acc = (cell.get("acceptance") or {}).get("acceptance_rate")
    head = ci_text(cell).split(" n=")[0]
    verdict = cell.get("verdict", "")
    short = {"faster": "faster", "slower": "slower"}.get(verdict, "")
    return f"{head}{' ' + short if short else ''}, acc {'n/a' if acc is None else f'{acc:.2f}'}"


def category_lines(tables: Sequence[Mapping[str, Any]]) -> list[str]:
    """Spec-Bench's shape: a row per variant, a column per category and overall."""
    out: list[str] = []
    points: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for t in tables:
        key = (t["mode"], load_label(t["load"]), t["max_new_tokens"], t["workload"])
        points.setdefault(key, []).append(t)
    for (mode, load, mnt, workload), ts in points.items():
        cats = [*ts[0]["categories"], "overall"]
        rows = [[t["candidate"], *(category_cell(t["cells"].get(c)) for c in cats)] for t in ts]
        n = {c: max((t["cells"].get(c) or {}).get("prompts", 0) for t in ts) for c in cats}
        heads = ["variant", *(f"{c} ({n[c]})" for c in cats)]
        out += [
            "",
            f"## Per category: {workload}, {mode}, {load}, max_new_tokens={mnt}",
            "",
            "Speedup of tok/s over the same engine's baseline on each category's prompts "
            "[95% CI], verdict when significant, and acceptance rate from each request's own "
            "counts (n/a: the engine reports none per request); (N) = prompts.",
            "",
            tabulate(rows, headers=heads, tablefmt="github", disable_numparse=True),
        ]
    return out


def in_flight_notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A line for each configuration whose peak in flight (median over repeats) stayed below the
    asked concurrency: too few requests, or the engine held them back; less load was measured."""
    out = []
    for r in rows:
        asked, peak = r["load"].get("concurrency"), r["summary"].get("peak_in_flight")
        if asked and asked > 1 and peak is not None and peak < asked:
            out.append(
                f"\n- {r['name']}: peak in flight {peak:g} < the asked concurrency {asked} "
                f"(requests per repeat: {r['summary']['completed'] // max(1, r['repeats'])})"
            )
    return out


def token_id_notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A line for each configuration whose outputs carry no token ids (``--token-ids``, or a
    server that sends none): where its token counts came from, and the checks that need ids."""
    out = []
    for r in rows:
        s = r.get("sanity") or {}
        if s.get("tokens_from") and s.get("with_token_ids") == 0:  # HTTP records say "from"
            src = ", ".join(s["tokens_from"])
            out.append(
                f"\n- {r['name']}: no token ids (output tokens from {src}): the lossless and "
                "repetition checks are n/a"
            )
    return out


def crossover_line(x: Mapping[str, Any], comps: Sequence[Mapping[str, Any]]) -> str:
    c = comps[x["comparison"]]
    what = (
        ci_text(c)
        if c["metric"] == "output_tok_s"
        else f"{METRIC_LABEL.get(c['metric'], c['metric'])} {ci_text(c)}"
    )
    head = f"{x['candidate']} ({x['max_new_tokens']} tok)"
    unit = x["unit"]
    if x["kind"] == "pays everywhere":
        return f"{head}: speculation pays at every {unit} tried (up to {x['at']:g}: {what})."
    if x["kind"] == "never pays":
        return (
            f"{head}: speculation does not pay even at {unit} {x['at']:g} ({what}, {c['verdict']})."
        )
    return (
        f"{head}: speculation pays up to {unit} {x['pays_up_to']:g}; "
        f"from {x['at']:g} it is {what} ({c['verdict']})."
    )
