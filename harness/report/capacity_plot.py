"""The capacity search's views, from results.json's ``capacity`` alone: the markdown section
(capacities with CIs, the paired ratio and its verdict, the crossover by rate, each probed
rate with its saturated runs) and the SLO-attainment-vs-rate plot with the capacities marked."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

METRIC_NAME = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}


def slo_text(cap: Mapping[str, Any]) -> str:
    q = round(float(cap["quantile"]) * 100)
    return " and ".join(
        f"{METRIC_NAME.get(k, k)} p{q} <= {ms:g} ms" for k, ms in cap["slo_ms"].items()
    )


def _rate(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{x:.3g}"  # x != x: nan (older files)


def capacity_line(row: Mapping[str, Any]) -> str:
    if row.get("capacity") is None:
        return f"{row['variant']}: {row['status']} (up to {_rate(row.get('bound'))} req/s)"
    ci = "CI n/a" if row.get("lo") is None else f"[{_rate(row['lo'])}, {_rate(row['hi'])}]"
    lo, hi = row["bracket"]
    return (
        f"{row['variant']}: {_rate(row['capacity'])} req/s {ci} n={row['n']} "
        f"(bracket {_rate(lo)}-{_rate(hi)} req/s)"
    )


def ratio_line(r: Mapping[str, Any], slo: str) -> str:
    if r.get("estimate") is None:
        return f"{r['candidate']} vs {r['baseline']}: n/a"
    ci = "CI n/a" if r.get("lo") is None else f"[{r['lo']:.2f}, {r['hi']:.2f}]"
    verdict = {"faster": "serves more", "slower": "serves less"}.get(r["verdict"], r["verdict"])
    return (
        f"{r['candidate']} serves {r['estimate']:.2f}x {ci} the rate of {r['baseline']} "
        f"under {slo} (n={r['n']}): {verdict}"
    )


def crossover_text(x: Mapping[str, Any]) -> str:
    head = f"{x['candidate']} vs {x['baseline']} ({METRIC_NAME.get(x['metric'], x['metric'])})"
    if x["kind"] == "never pays":
        return f"{head}: not faster at any probed rate (the lowest: {_rate(x['at'])} req/s)"
    if x["kind"] != "stops paying":
        return f"{head}: faster at every probed rate (up to {_rate(x['at'])} req/s)"
    ci = "CI n/a" if x.get("lo") is None else f"[{_rate(x['lo'])}, {_rate(x['hi'])}]"
    if "not_faster_from" not in x:  # a file written before the bracket was stored
        return (
            f"{head}: stops being faster at {_rate(x['at'])} req/s {ci} "
            f"(faster at {_rate(x['pays_up_to'])} req/s)"
        )
    between = (
        f"{head}: stops being faster between {_rate(x['pays_up_to'])} and "
        f"{_rate(x['not_faster_from'])} req/s (the mean speedup per probed rate)"
    )
    if x.get("at") is None:
        return f"{between}; no crossing estimated: {x.get('no_estimate', 'n/a')}"
    return f"{between}; fitted crossing {_rate(x['at'])} req/s {ci} n={x.get('n')}"


def behind_line(b: Mapping[str, Any], q: float) -> str:
    """A variant whose capacity from the send is higher than from the schedule, and why."""
    if b.get("capacity_from_send") is None:  # it held at every probed rate
        send = f"hold at every probed rate (up to {_rate(b.get('bound_from_send'))} req/s)"
    else:
        send = f"be {_rate(b['capacity_from_send'])} req/s"
    why = "the client fell behind its schedule"
    if b.get("client_queue_s") is not None:
        why += (
            f" (client queue p{round(q * 100)} {b['client_queue_s'] * 1e3:.1f} ms at "
            f"{_rate(b.get('rate'))} req/s)"
        )
    return (
        f"{b['variant']}: judged from the send it would {send}, not "
        f"{_rate(b.get('capacity_from_schedule'))} req/s: {why}; the capacity above is judged "
        "from each request's scheduled arrival, as the user waits"
    )


def capacity_markdown(results: Mapping[str, Any]) -> str:
    cap = results["capacity"]
    slo = slo_text(cap)
    lines = ["", f"## Capacity under the SLO ({slo})", ""]
    lines += [f"- {capacity_line(r)}" for r in cap["variants"]]
    lines += [f"- {ratio_line(r, slo)}" for r in cap["ratios"]]
    lines += [f"- crossover: {crossover_text(x)}" for x in cap.get("crossover") or []]
    behind = (cap.get("from_send") or {}).get("behind") or []
    lines += [f"- {behind_line(b, float(cap['quantile']))}" for b in behind]
    lines += ["", "| variant | rate (req/s) | SLO attainment | margin | runs | saturated |"]
    lines.append("|---|---|---|---|---|---|")
    for c in cap.get("curves") or []:
        for p in c["points"]:
            att = "n/a" if p["attainment"] is None else f"{p['attainment']:.0%}"
            sat = f"saturated ({p['saturated']})" if p["saturated"] else ""
            lines.append(
                f"| {c['variant']} | {p['rate']:.3g} | {att} | {p['margin']:+.2f} | "
                f"{p['runs']} | {sat} |"
            )
    return "\n".join(lines) + "\n"


def draw_capacity(results: Mapping[str, Any], out: Path) -> str:
    """capacity.png: the mean SLO attainment per probed rate and variant (log rate), the
    quantile's line, each capacity a dashed vertical line with its CI shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cap = results["capacity"]
    fig, ax = plt.subplots(figsize=(7, 4))
    rows = {r["variant"]: r for r in cap["variants"]}
    for i, c in enumerate(cap.get("curves") or []):
        color = f"C{i}"
        pts = [p for p in c["points"] if p["attainment"] is not None]
        ax.plot([p["rate"] for p in pts], [p["attainment"] for p in pts], "o-", color=color,
                label=c["variant"])  # fmt: skip
        sat = [p for p in pts if p["saturated"]]
        ax.plot([p["rate"] for p in sat], [p["attainment"] for p in sat], "x", color=color, ms=10)
        row: dict[str, Any] = rows.get(c["variant"]) or {}
        if row.get("capacity") is not None:
            ax.axvline(row["capacity"], color=color, ls="--", lw=1)
            if row.get("lo") is not None:
                ax.axvspan(row["lo"], row["hi"], color=color, alpha=0.12)
    ax.axhline(cap["quantile"], color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("SLO attainment (share meeting each bound)")
    ax.set_title(f"Capacity under {slo_text(cap)} (x: saturated)", fontsize=9)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "capacity.png", dpi=110)
    plt.close(fig)
    return "\n![SLO attainment vs rate](capacity.png)\n"
