"""summary.md's sections for a trace replay (send lag, lengths, prefix-cache hits vs the trace's
shared prefix) and for a conversation run (the per-turn table); formats results.json's
``replay`` and ``turns`` (harness.analysis.workload.replay, harness.analysis.workload.turns), computes nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tabulate import tabulate

from harness.report.columns import ci_text, load_label

REPLAY_NOTE = (
    "Send lag = actual send - scheduled send (the trace's time, scaled), from the first send; "
    "a replay is valid only where the client kept up (p99 lag small against the gaps). Cache "
    "hits are the engine's prefix-cache hits (prompt tokens) over the run; trace shared = the "
    "tokens each request shares with an earlier one by equal leading hash ids (a cache that "
    "evicts nothing serves them); expected = each request's shared tokens rounded down to the "
    "engine's KV block (at most its prompt less one token)."
)
TURNS_NOTE = (
    "Turn k is sent with the variant's own answers to turns 1..k-1. TTFT and TPOT are medians "
    "over the turn's requests; acc = acceptance rate from each request's own counts (n/a: the "
    "engine reports none per request); speedups are over the same engine's baseline on the same "
    "turn's requests [95% CI over repeats; n/a below 3], tok/s and TPOT."
)


def _ms(v: Any) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def replay_lines(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    if not entries:
        return []
    rows = []
    for e in entries:
        lag = e.get("send_lag_ms") or {}
        pc = e.get("prefix_cache") or {}
        rows.append(
            [
                e["name"],
                e["repeat"],
                f"{e['sent']}/{e['scheduled']}",
                _ms(lag.get("median")),
                _ms(lag.get("p99")),
                e.get("late", 0),
                f"{e.get('input_as_asked', 0)}/{e.get('ok', 0)}",
                f"{e.get('output_as_asked', 0)}/{e.get('ok', 0)}",
                pc.get("hits", "n/a"),
                pc.get("expected_hits") if pc.get("expected_hits") is not None else "n/a",
                pc.get("trace_shared_tokens", "n/a"),
                pc.get("kv_block_size") or "n/a",
            ]
        )
    heads = [
        "variant", "repeat", "sent", "lag p50 ms", "lag p99 ms", ">=10 ms late",
        "input as asked", "output as asked", "cache hits", "expected", "trace shared", "KV block",
    ]  # fmt: skip
    return [
        "",
        "## Trace replay",
        "",
        REPLAY_NOTE,
        "",
        tabulate(rows, headers=heads, tablefmt="github", disable_numparse=True),
    ]


def _speed(cell: Mapping[str, Any], metric: str) -> str:
    s = (cell.get("speedup") or {}).get(metric)
    return "" if not s else ci_text(s).split(" n=")[0]


def turn_lines(tables: Sequence[Mapping[str, Any]]) -> list[str]:
    if not tables:
        return []
    out: list[str] = []
    points: dict[str, list[Mapping[str, Any]]] = {}
    for t in tables:
        points.setdefault(t["point"], []).append(t)
    for ts in points.values():
        first = ts[0]
        rows = []
        for t in ts:
            for turn, cell in t["turns"].items():
                acc = (cell.get("acceptance") or {}).get("acceptance_rate")
                ttft, tpot = cell.get("ttft_s"), cell.get("tpot_s")
                rows.append(
                    [
                        t["name"],
                        turn,
                        cell["requests"],
                        "n/a" if ttft is None else f"{ttft * 1000:.1f}",
                        "n/a" if tpot is None else f"{tpot * 1000:.2f}",
                        "n/a"
                        if cell.get("prompt_tokens") is None
                        else f"{cell['prompt_tokens']:g}",
                        "n/a" if acc is None else f"{acc:.2f}",
                        _speed(cell, "output_tok_s"),
                        _speed(cell, "tpot"),
                    ]
                )
        heads = [
            "variant", "turn", "requests", "TTFT ms", "TPOT ms", "prompt tok", "acc",
            "tok/s speedup", "TPOT speedup",
        ]  # fmt: skip
        out += [
            "",
            f"## By turn: {first['workload']}, {first['mode']}, {load_label(first['load'])}, "
            f"{first['conversations']} conversations",
            "",
            TURNS_NOTE,
            "",
            tabulate(rows, headers=heads, tablefmt="github", disable_numparse=True),
        ]
    return out


def workload_lines(results: Mapping[str, Any]) -> list[str]:
    """The replay and per-turn sections (empty for other runs)."""
    return replay_lines(results.get("replay") or []) + turn_lines(results.get("turns") or [])
