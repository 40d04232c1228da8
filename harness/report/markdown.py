"""summary.md from results.json: formats the stored analysis (:mod:`harness.analysis.derived`) through the
column registry (:mod:`harness.report.columns`); computes nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tabulate import tabulate

from harness.core.design import PER_BLOCK, SEPARATE
from harness.core.results import PACKAGES
from harness.report.answer_text import answer_markdown
from harness.report.capacity_plot import capacity_markdown
from harness.report.columns import (
    COMPACT,
    COMPACT_IF_STORED,
    COMPACT_OPTIONAL,
    COMPACT_WIDTH,
    COMPARISONS,
    METRIC_LABEL,
    THEORY,
    Column,
    Line,
    ci_text,
    compact_note,
    load_label,
    method_tag,
    num,
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


def tight_table(columns: Sequence[Column], lines: Sequence[Line], metric: str) -> str:
    """A github-style table padded only to its widest cell (tabulate adds two spaces to every
    header, which a table that must fit a terminal cannot spare)."""
    headers = [c.header.format(metric=METRIC_LABEL.get(metric, metric)) for c in columns]
    rows = [headers, *([c.fmt(c.get(x)) for c in columns] for x in lines)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    text = ["| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |" for r in rows]
    text.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(text)


def compact_columns(lines: Sequence[Line], metric: str = "output_tok_s") -> list[Column]:
    """The COMPACT columns a table of ``lines`` shows: those stored only where some row stores
    them, and the optional ones dropped in order until the table fits COMPACT_WIDTH."""
    columns = [
        c
        for c in COMPACT
        if c.name not in COMPACT_IF_STORED or any(c.get(x) is not None for x in lines)
    ]
    for name in COMPACT_OPTIONAL:
        text = tight_table(columns, lines, metric)
        if max(len(ln) for ln in text.splitlines()) <= COMPACT_WIDTH:
            break
        columns = [c for c in columns if c.name != name]
    return columns


def stored_at(items: Sequence[Mapping[str, Any]] | None, i: int | None) -> Mapping[str, Any] | None:
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


def ordered(
    rows: Sequence[Mapping[str, Any]], results: Mapping[str, Any], key: str = "name"
) -> list[Any]:
    """``rows`` in the stored variant order (baseline first, the same in every table), by their
    ``key`` field; files without an answer block keep their stored order (the sort is stable)."""
    order = (results.get("answer") or {}).get("variants") or []
    rank = {name: i for i, name in enumerate(order)}
    return sorted(rows, key=lambda r: rank.get(r[key], len(rank)))


def points_of(results: Mapping[str, Any]) -> dict[str, list[Mapping[str, Any]]]:
    """The stored rows per plan point (in the stored point order), each in the variant order."""
    points: dict[str, list[Mapping[str, Any]]] = {}
    for row in results.get("rows", []):
        points.setdefault(row["point"], []).append(row)
    return {p: ordered(rows, results) for p, rows in points.items()}


def point_heading(row: Mapping[str, Any]) -> str:
    return f"{row['mode']}, {load_label(row['load'])}, max_new_tokens={row['max_new_tokens']}"


def head_lines(results: Mapping[str, Any]) -> list[str]:
    """The machine, workload and design lines, and the notes on how the file came to be."""
    comps = results.get("comparisons") or []
    env, wl = results.get("environment", {}), results.get("workload", {})
    lines = [
        f"Run {results.get('created', '')}. Machine: {env.get('processor', '?')}, "
        f"{env.get('cpu_count', '?')} CPUs"
        + (f", GPU {env['gpu']}" if env.get("gpu") else "")
        + "; "
        + ", ".join(f"{p} {env.get(p) or 'n/a'}" for p in PACKAGES)
        + f". Workload: {wl.get('name', '?')} "
        f"({wl.get('num_requests', '?')} prompts)."
    ]
    lines += _design_lines(results)
    if any(c.get("design") == SEPARATE for c in comps):  # compare of files run one after another
        lines += ["", SEPARATE_NOTE]
    if results.get("upgraded_from"):
        lines += ["", f"(A schema {results['upgraded_from']} file: derived numbers recomputed.)"]
    return lines


def render(results: Mapping[str, Any]) -> str:
    """summary.md (and stdout): the answer, the compact table per point, then the rest."""
    comps, checks = results.get("comparisons") or [], results.get("lossless") or []
    lines = answer_markdown(results)
    if results.get("status") not in (None, "complete"):
        lines += [f"**Run {results['status']}**: partial results.", ""]
    not_run = results.get("not_run") or []
    sol = results.get("speed_of_light")
    shown: set[str] = set()  # the compact tables' columns, for the note under them
    for point, rows in points_of(results).items():
        first = rows[0]
        lines += ["", f"## {point_heading(first)}", ""]
        view = [
            Line(r, stored_at(comps, r.get("comparison")), stored_at(checks, r.get("lossless")))
            for r in rows
        ]
        metric = first.get("deciding_metric", "output_tok_s")
        columns = compact_columns(view, metric)
        shown.update(c.name for c in columns)
        lines.append(tight_table(columns, view, metric))
        lines += token_id_notes(rows)
        lines += schedule_lines(rows)
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
    variants = [n for n in not_run if str(n["status"]).startswith("not run")]
    if variants:  # asked for by --spec, never built (harness.sizing.preview.not_run_records)
        lines += ["", "## Variants not run", ""]
        lines += [f"- {n['name']}: {n['status']}; add: {n.get('how')}" for n in variants]
    chosen = (results.get("plan") or {}).get("device_defaults") or []
    if chosen:  # CUDA's defaults, the instance policy's caveat among them (cli/device_defaults)
        lines += ["", "## Defaults the device chose", "", *[f"- {line}" for line in chosen]]
    if results.get("rows"):
        lines += ["", compact_note(shown)]
    lines += ["", *head_lines(results)]
    theory = results.get("theory") or []
    if theory:
        view = [Line(t, stored_at(comps, t.get("comparison"))) for t in ordered(theory, results)]
        lines += [
            "",
            "## Theory vs measurement (latency mode)",
            "",
            THEORY_NOTE,
            "",
            table(THEORY, view),
        ]
    lines += category_lines(ordered(results.get("categories") or [], results, "candidate"))
    lines += workload_lines(results)  # a trace replay's checks, a conversation run's turns
    if results.get("capacity"):  # --slo: capacities, their ratio, the crossover by rate
        lines += [capacity_markdown(results).rstrip("\n")]
    lines += stopping_lines(results)
    if comps:
        view = [Line(c) for c in ordered(comps, results, "candidate")]
        lines += ["", "## Paired comparisons", "", table(COMPARISONS, view)]
    methods = dict.fromkeys(c["method"] for c in comps if c.get("method"))
    named = "; ".join(f"{method_tag(m)} = {m}" for m in methods)
    lines += ["", FOOTNOTE + (f" CI methods: {named}." if named else ""), ""]
    return "\n".join(lines)


STOPPED = {
    "decided": "decided",
    "cap": "the cap",
    "budget": "budget spent",
    "stopped": "run stopped",
    "failed": "every lane failed there",
}


def stopping_lines(results: Mapping[str, Any]) -> list[str]:
    """The sequential design (design.stopping): per deciding comparison, its verdict, the blocks
    it took and why it stopped."""
    rule = (results.get("design") or {}).get("stopping")
    comps = [c for c in results.get("comparisons") or [] if c.get("decides") and "blocks" in c]
    if not rule or not comps:
        return []
    budget = rule.get("budget_s")
    took = ", ".join(f"{s / 60:.1f}" for s in rule.get("blocks_s") or [])
    out = [
        "",
        "## Sequential stopping",
        "",
        f"Looks after every block from {rule['first']} to {rule['cap']} ({rule['spending']} "
        f"alpha-spending: each interval holds {1 - rule['alpha']:.0%} at every look at once); "
        + (f"budget {budget / 60:g} min" if budget else "no budget")
        + (f", blocks took {took} min." if took else "."),
        "",
    ]
    for c in comps:
        verdict, n, why = c["verdict"], c["blocks"], STOPPED.get(c.get("stopped"), c.get("stopped"))
        said = verdict if verdict.startswith("undecided") else f"{verdict} at {n} blocks"
        out.append(
            f"- {c['candidate']} vs {c['baseline']}, {c['mode']}, {load_label(c['load'])}: "
            f"{ci_text(c)}, {said} ({why})"
        )
    return out


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


def schedule_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Under an open loop, each row's latency on both clocks: E2E p99 from the scheduled
    arrival and from the send, and the client queue between them (harness.analysis.schedule)."""
    out = []
    for r in rows:
        s = r["summary"]
        sched, queue = s.get("e2e_from_schedule_s"), s.get("client_queue_s")
        if not sched or not queue or sched.get("p99") is None:
            continue
        send = (s.get("e2e_s") or {}).get("p99")
        out.append(
            f"- {r['name']}: E2E p99 {sched['p99'] * 1e3:.0f} ms from the scheduled arrival, "
            f"{num(send, 0, 1e3)} ms from the send; client queue p99 "
            f"{queue['p99'] * 1e3:.1f} ms, max {queue['max'] * 1e3:.1f} ms"
            + (f"; {s['not_sent']} due not sent by the end" if s.get("not_sent") else "")
        )
    return ["", *out] if out else []
