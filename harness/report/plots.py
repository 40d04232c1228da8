"""Plots drawn from results.json alone (the stored analysis: rows, comparisons, the latency
quantiles in ``distributions``, the category tables), as PNG files beside summary.md and as
inline SVG for report.html. One colour per variant in every plot (the stored variant order)."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.report.answer_text import title, where
from harness.report.columns import load_label

# matplotlib's tab10, then tab10's darker pairs: distinct for up to 20 variants
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
    "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)  # fmt: skip
METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)
LOAD_STYLES = ("-", "--", ":", "-.")
LOAD_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL (per chunk)"), ("e2e_s", "E2E"))


@dataclass
class Drawn:
    """What :func:`draw` made: the markdown linking the PNGs, and (caption, svg) for the HTML."""

    markdown: str = ""
    svgs: list[tuple[str, str]] = field(default_factory=list)


def variants(results: Mapping[str, Any]) -> list[str]:
    """The stored variant order (older files: the rows' order)."""
    stored = (results.get("answer") or {}).get("variants")
    return list(stored or dict.fromkeys(r["name"] for r in results.get("rows", [])))


def colours(results: Mapping[str, Any]) -> dict[str, str]:
    """One colour per variant, the same in every plot and in the HTML's swatches."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(variants(results))}


def _gid(results: Mapping[str, Any]) -> Callable[[str], str]:
    """An SVG group id per variant (``v3-...``): the HTML's toggles hide a variant's artists."""
    index = {name: i for i, name in enumerate(variants(results))}
    count = [0]

    def gid(name: str) -> str:
        count[0] += 1
        return f"v{index.get(name, 99)}-{count[0]}"

    return gid


def _readable_log(ax: Any, axis: str = "x") -> None:
    """Log ticks as plain numbers, at most ~6 labels, no minor labels (they overlapped)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=6))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())


def _suptitle(fig: Any, what: str, results: Mapping[str, Any]) -> None:
    fig.suptitle(f"{what}\n{title(results)}", fontsize=10)


def _load_x(e: Mapping[str, Any]) -> tuple[str, float] | None:
    load = e.get("load") or {}
    if e.get("mode") == "latency":
        return "concurrency", 1.0
    if "request_rate" in load:
        return "request rate (req/s)", float(load["request_rate"])
    return ("concurrency", float(load["concurrency"])) if load.get("concurrency") else None


def speedup_vs_load(results: Mapping[str, Any], plt: Any) -> Iterator[tuple[str, str, Any]]:
    """Each candidate's deciding speedup against its baseline at every load, CI as a band
    (and bars); each engine's baseline against the first engine's, dashed."""
    a, col, gid = results.get("answer") or {}, colours(results), _gid(results)
    entries = [*(a.get("speculation") or []), *(a.get("engines") or [])]
    units: dict[str, dict[tuple[str, str, int], list[tuple[float, Mapping[str, Any]]]]] = {}
    for e in entries:
        x = _load_x(e)
        if x is None or e.get("estimate") is None:
            continue
        key = (e["candidate"], e["baseline"], e["max_new_tokens"])
        units.setdefault(x[0], {}).setdefault(key, []).append((x[1], e))
    if not units:
        return
    fig, axes = plt.subplots(1, len(units), figsize=(6.5 * len(units), 4.2), squeeze=False)
    lengths = len({k[2] for series in units.values() for k in series})
    for ax, (unit, series) in zip(axes[0], units.items()):
        for (cand, base, mnt), pts in series.items():
            pts.sort(key=lambda p: p[0])
            xs = [p[0] for p in pts]
            est = [p[1]["estimate"] for p in pts]
            lo = [p[1]["lo"] if p[1].get("lo") is not None else p[1]["estimate"] for p in pts]
            hi = [p[1]["hi"] if p[1].get("hi") is not None else p[1]["estimate"] for p in pts]
            engine_pair = base.split("/")[0] != cand.split("/")[0]
            label = f"{cand} vs {base}" + (f" ({mnt} tok)" if lengths > 1 else "")
            g = gid(cand)
            ax.fill_between(xs, lo, hi, color=col.get(cand), alpha=0.18, lw=0, gid=g + "b")
            ax.errorbar(
                xs, est, yerr=[[e - lo_ for e, lo_ in zip(est, lo)], [h - e for e, h in zip(est, hi)]],
                color=col.get(cand), marker="o", capsize=3, ls="--" if engine_pair else "-",
                label=label, gid=g,
            )  # fmt: skip
        ax.axhline(1.0, color="grey", lw=1, ls=":")
        ax.set_yscale("log")  # a ratio: 0.5x and 2x equally far from 1, a wide CI stays readable
        _readable_log(ax, "y")
        ax.set_xscale("log", base=2)
        ticks = sorted({x for pts in series.values() for x, _ in pts})
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel(f"{unit} (1 = latency mode)" if unit == "concurrency" else unit)
        ax.set_ylabel("speedup, >1 = faster (95% CI band)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _suptitle(fig, "Speedup vs load (tok/s; E2E at a request rate)", results)
    fig.tight_layout()
    yield "speedup_vs_load", "Speedup vs load", fig


def distributions(results: Mapping[str, Any], plt: Any) -> Iterator[tuple[str, str, Any]]:
    """Per point: the TTFT, TPOT, ITL and E2E distributions of every variant (stored
    quantiles), side by side."""
    stored = results.get("distributions") or {}
    levels, col = stored.get("levels") or [], colours(results)
    rows = {(r["name"], r["point"]): r for r in results.get("rows", [])}
    by_point: dict[str, list[Mapping[str, Any]]] = {}
    for s in stored.get("series") or []:
        by_point.setdefault(s["point"], []).append(s)
    order = {name: i for i, name in enumerate(variants(results))}
    for i, (point, series) in enumerate(by_point.items()):
        series.sort(key=lambda s: order.get(s["name"], len(order)))
        gid = _gid(results)
        fig, axes = plt.subplots(1, 4, figsize=(15, 3.8))
        for ax, (metric, label) in zip(axes, LATENCIES):
            for s in series:
                qs = s.get(metric)
                if not qs:
                    continue
                ms = [q * 1e3 for q in qs]
                ax.step(ms, levels, where="post", color=col.get(s["name"]), label=s["name"],
                        gid=gid(s["name"]))  # fmt: skip
            ax.set_xlabel(f"{label} (ms)")
            mins = [s[metric][0] for s in series if s.get(metric)]
            if mins and min(mins) > 0:
                ax.set_xscale("log")
                _readable_log(ax)
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("share of requests (ITL: of gaps)")
        axes[-1].legend(fontsize=7, loc="lower right")
        first = rows.get((series[0]["name"], point), {})
        heading = where(first) if first else point
        _suptitle(fig, f"Latency distributions, {first.get('mode', '')} mode, {heading}", results)
        fig.tight_layout()
        yield (
            f"distributions_{i}",
            f"Latency distributions: {first.get('mode', '')}, {heading}",
            fig,
        )


def throughput_vs_latency(results: Mapping[str, Any], plt: Any) -> Iterator[tuple[str, str, Any]]:
    """Output tok/s against median TPOT per variant across its loads (vLLM's sweep view:
    up and to the left is better)."""
    col, gid = colours(results), _gid(results)
    series: dict[str, list[Mapping[str, Any]]] = {}
    for r in results.get("rows", []):
        tpot = (r["summary"].get("tpot_s") or {}).get("median")
        if tpot is not None and r["summary"].get("output_tok_s") is not None:
            series.setdefault(r["name"], []).append(r)
    if not series:
        return
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for name in variants(results):
        rs = sorted(series.get(name, []), key=lambda r: (_load_x(r) or ("", 0.0))[1])
        if not rs:
            continue
        xs = [r["summary"]["tpot_s"]["median"] * 1e3 for r in rs]
        ys = [r["summary"]["output_tok_s"] for r in rs]
        ax.plot(xs, ys, marker="o", color=col[name], label=name, gid=gid(name))
        for x, y, r in zip(xs, ys, rs):
            ax.annotate(where(r), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("median TPOT (ms), lower is better")
    ax.set_ylabel("output tok/s, higher is better")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _suptitle(fig, "Throughput vs latency, per variant across loads", results)
    fig.tight_layout()
    yield "throughput_vs_latency", "Throughput vs latency", fig


def acceptance(results: Mapping[str, Any], plt: Any) -> Iterator[tuple[str, str, Any]]:
    """Acceptance by draft position for every speculative variant at every load (colour: the
    variant; line style and marker: the load)."""
    col, gid = colours(results), _gid(results)
    rows = [r for r in results.get("rows", []) if (r.get("spec") or {}).get("acceptance_per_pos")]
    if not rows:
        return
    loads = list(dict.fromkeys(where(r) for r in rows))
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for r in rows:
        pos = r["spec"]["acceptance_per_pos"]
        k = loads.index(where(r))
        ax.plot(
            range(1, len(pos) + 1), pos, color=col.get(r["name"]),
            ls=LOAD_STYLES[k % len(LOAD_STYLES)], marker=LOAD_MARKERS[k % len(LOAD_MARKERS)],
            label=f"{r['name']}, {where(r)}", gid=gid(r["name"]),
        )  # fmt: skip
    ax.set_xlabel("draft position")
    ax.set_ylabel("share of drafts accepted at this position")
    ax.set_ylim(0, 1)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _suptitle(fig, "Acceptance by draft position, every load", results)
    fig.tight_layout()
    yield "acceptance_by_position", "Acceptance by draft position", fig


def categories(results: Mapping[str, Any], plt: Any) -> Iterator[tuple[str, str, Any]]:
    """Per point with categories: a heat map of each candidate's speedup per category
    (the stored per-category comparisons; * = significant)."""
    from matplotlib.colors import TwoSlopeNorm

    tables: dict[str, list[Mapping[str, Any]]] = {}
    rank = {name: i for i, name in enumerate(variants(results))}
    for t in sorted(results.get("categories") or [], key=lambda t: rank.get(t["candidate"], 99)):
        key = f"{t['mode']}, {load_label(t['load'])}, {t['max_new_tokens']} tok"
        tables.setdefault(key, []).append(t)
    for i, (key, ts) in enumerate(tables.items()):
        cats = [*ts[0]["categories"], "overall"]
        grid = [[(t["cells"].get(c) or {}).get("estimate") for c in cats] for t in ts]
        values = [v for row in grid for v in row if v is not None]
        if not values:
            continue
        lo, hi = min(min(values), 0.99), max(max(values), 1.01)
        fig, ax = plt.subplots(figsize=(1.2 * len(cats) + 3, 0.55 * len(ts) + 3.2))
        shown = [[1.0 if v is None else v for v in row] for row in grid]
        im = ax.imshow(shown, cmap="RdYlGn", norm=TwoSlopeNorm(vmin=lo, vcenter=1.0, vmax=hi))
        for y, t in enumerate(ts):
            for x, c in enumerate(cats):
                cell = t["cells"].get(c) or {}
                est = cell.get("estimate")
                mark = "*" if cell.get("verdict") in ("faster", "slower") else ""
                text = "n/a" if est is None else f"{est:.2f}x{mark}"
                ax.text(x, y, text, ha="center", va="center", fontsize=7,
                        bbox={"facecolor": "white", "alpha": 0.7, "lw": 0, "pad": 1})  # fmt: skip
        ax.set_xticks(range(len(cats)), [f"{c} ({(ts[0]['cells'].get(c) or {}).get('prompts', '?')})" for c in cats],
                      rotation=30, ha="right", fontsize=7)  # fmt: skip
        ax.set_yticks(range(len(ts)), [t["candidate"] for t in ts], fontsize=7)
        bar = fig.colorbar(im, ax=ax, label="speedup over baseline")
        bar.set_ticks([lo, 1.0, hi], labels=[f"{lo:.2f}x", "1x", f"{hi:.2f}x"])
        _suptitle(fig, f"Speedup per category, {key}", results)
        fig.tight_layout()
        yield f"categories_{i}", f"Speedup per category: {key}", fig


PLOTS = (speedup_vs_load, distributions, throughput_vs_latency, acceptance, categories)


def draw(results: Mapping[str, Any], out: Path | None = None, *, svg: bool = True) -> Drawn:
    """Every plot of ``results``: PNG files in ``out`` (linked from the returned markdown),
    and their SVG text for report.html when ``svg``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = Drawn()
    links: list[str] = []
    with matplotlib.rc_context({"svg.fonttype": "none", "font.size": 8}):
        for plot in PLOTS:
            for stem, caption, fig in plot(results, plt):
                if out is not None:
                    fig.savefig(out / f"{stem}.png", dpi=110)
                    links.append(f"![{caption}]({stem}.png)")
                if svg:
                    with matplotlib.rc_context({"svg.hashsalt": stem}):  # ids unique per page
                        buf = io.StringIO()
                        fig.savefig(buf, format="svg")
                    text = buf.getvalue()
                    text = METADATA.sub("", text[text.index("<svg") :])  # date, tool: noise
                    drawn.svgs.append((caption, text))
                plt.close(fig)
    drawn.markdown = ("\n## Plots\n\n" + "\n\n".join(links) + "\n") if links else ""
    return drawn
