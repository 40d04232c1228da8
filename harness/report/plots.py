"""PNG plots drawn from results.json alone (the raw records for distributions, the stored
analysis for everything derived); returns the markdown that links them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.core.results import Run, group_runs


def draw(results: Mapping[str, Any], out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [Run.from_json(r) for r in results.get("runs", [])]
    links: list[str] = []
    groups = group_runs(runs)

    # 1. latency CDFs (TTFT and E2E) per configuration, for each point
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    drawn = False
    for (engine, label, mode, load, mnt, *_), rs in groups.items():
        recs = [r for run in rs for r in run.counted]
        name = f"{engine}/{label} {mode} {dict(load).get('concurrency') or dict(load).get('request_rate')} {mnt}tok"
        for ax, values in zip(axes, ([r.ttft for r in recs], [r.e2e for r in recs])):
            xs = sorted(v * 1e3 for v in values if v is not None)
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=name)
                drawn = True
    if drawn:
        for ax, title in zip(axes, ("TTFT", "E2E latency")):
            ax.set_xlabel(f"{title} (ms)")
            ax.set_ylabel("share of requests")
            ax.set_xscale("log")
            ax.grid(alpha=0.3)
        axes[1].legend(fontsize=6, loc="lower right")
        fig.tight_layout()
        fig.savefig(out / "latency_cdf.png", dpi=110)
        links.append("![TTFT and E2E distributions](latency_cdf.png)")
    plt.close(fig)

    # 2. speedup vs concurrency (throughput mode) with CI bands
    comps = [
        c
        for c in results.get("comparisons", [])
        if c["decides"]
        and c["estimate"] is not None
        and c["baseline"].split("/")[0] == c["candidate"].split("/")[0]
    ]
    series: dict[str, list[tuple[float, Mapping[str, Any]]]] = {}
    for c in comps:
        x = (
            1
            if c["mode"] == "latency"
            else c["load"].get("concurrency") or c["load"].get("request_rate")
        )
        if x is None:
            continue
        series.setdefault(f"{c['candidate']} ({c['max_new_tokens']} tok)", []).append((float(x), c))
    if any(len(v) > 1 for v in series.values()):
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, pts in series.items():
            pts.sort(key=lambda p: p[0])
            xs = [p[0] for p in pts]
            ax.plot(xs, [p[1]["estimate"] for p in pts], marker="o", label=name)
            lo = [p[1]["lo"] if p[1]["lo"] is not None else p[1]["estimate"] for p in pts]
            hi = [p[1]["hi"] if p[1]["hi"] is not None else p[1]["estimate"] for p in pts]
            ax.fill_between(xs, lo, hi, alpha=0.2)
        ax.axhline(1.0, color="grey", lw=1, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("requests in flight (1 = latency mode)")
        ax.set_ylabel("speedup over baseline (tok/s; E2E at a request rate)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "speedup_vs_concurrency.png", dpi=110)
        plt.close(fig)
        links.append("![Speedup vs concurrency](speedup_vs_concurrency.png)")

    # 3. acceptance by draft position
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    seen = set()
    for row in results.get("rows", []):
        sp = row.get("spec")
        if not sp or not sp["acceptance_per_pos"] or row["name"] in seen:
            continue
        seen.add(row["name"])
        pos = sp["acceptance_per_pos"]
        ax.plot(range(1, len(pos) + 1), pos, marker="o", label=row["name"])
        drawn = True
    if drawn:
        ax.set_xlabel("draft position")
        ax.set_ylabel("share of drafts accepted at this position")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "acceptance_by_position.png", dpi=110)
        links.append("![Acceptance by draft position](acceptance_by_position.png)")
    plt.close(fig)
    return ("\n## Plots\n\n" + "\n\n".join(links) + "\n") if links else ""
