"""The answer block as text (summary.md, stdout, report.html): formats results.json ``answer``
(:mod:`harness.analysis.answer`) and the compact per-point table; computes nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any

from harness.core.results import DISPLAY_NAMES
from harness.report.columns import METRIC_LABEL, ci_text, load_label, speedup_text

# what the engine question calls each decision (a baseline does not "pay")
ENGINE_WORDS = {
    "pays": "faster",
    "does not pay": "not faster",
    "not significant": "not significant",
    "no verdict": "no verdict",
}


def model_name(config: Mapping[str, Any]) -> str:
    """A model path or hub id by its last two parts (``tiny/target``, ``org/model``)."""
    model = str(config.get("model") or "?")
    return "/".join(PurePath(model).parts[-2:])


def blocks_text(blocks: Mapping[str, Any] | None) -> str:
    """``4 repeats`` (fixed n), ``3-8 blocks (sequential)``: the stored ``answer.blocks``."""
    if not blocks:
        return ""
    lo, hi = blocks["min"], blocks["max"]
    n = f"{lo}" if lo == hi else f"{lo}-{hi}"
    if blocks.get("design") == "sequential":
        return f"{n} block{'s' if hi != 1 else ''} (sequential)"
    return f"{n} repeat{'s' if hi != 1 else ''}"


def title(results: Mapping[str, Any]) -> str:
    """Model, workload, modes and n (the blocks that ran, ``answer.blocks``; not
    ``config.repeats``, a sequential run's first look): every view's first line and plot title."""
    cfg, wl = results.get("config") or {}, results.get("workload") or {}
    modes = " + ".join(cfg.get("modes") or sorted({r["mode"] for r in results.get("rows", [])}))
    ran = blocks_text((results.get("answer") or {}).get("blocks"))
    n = f"{ran} x " if ran else ""
    return (
        f"{model_name(cfg)} on {wl.get('name', '?')}, {modes}, "
        f"n = {n}{wl.get('num_requests', '?')} prompts"
    )


def where(e: Mapping[str, Any], lengths: int = 1) -> str:
    """``1 at a time`` / ``concurrency 4`` / ``2 req/s`` (with the length when a run has several)."""
    load = "1 at a time" if e.get("mode") == "latency" else load_label(e.get("load") or {})
    mnt = e.get("max_new_tokens")
    return f"{load}, {mnt} tok" if lengths > 1 and mnt is not None else load


def _why(e: Mapping[str, Any]) -> str:
    """The stored verdict, without the "n/a (...)" wrapping."""
    v = str(e.get("verdict") or "n/a")
    return v[len("n/a (") : -1] if v.startswith("n/a (") and v.endswith(")") else v


def _metric(e: Mapping[str, Any]) -> str:
    return METRIC_LABEL.get(e.get("metric", ""), e.get("metric", ""))


def _undecided(x: Mapping[str, Any]) -> str:
    """``undecided at 4 blocks`` (the sequential verdict as stored), ``undecided at 4 repeats
    (no significant difference)`` (fixed n)."""
    v = _why(x)
    if v.startswith("undecided"):
        return v
    return f"undecided at {x['n']} repeats ({v})" if x.get("n") else f"undecided ({v})"


def _stop_line(x: Mapping[str, Any]) -> str:
    """One crossover entry: where it pays, where it does not (a decided verdict), and where the
    comparison is undecided (stored ``answer`` "not significant" / "no verdict"): that reads as
    undecided, never as "does not pay"."""
    what = f"{_metric(x)} {ci_text(x)}"
    head = f"{x['candidate']} ({x['max_new_tokens']} tok)"
    unit, at = x["unit"], f"{x['at']:g}"
    if x["kind"] == "pays everywhere":
        return f"{head}: pays at every {unit} tried (up to {at}: {what})"
    undecided = x.get("answer") in ("not significant", "no verdict")
    if x["kind"] == "never pays":
        if undecided:
            return f"{head}: at {unit} {at} {_undecided(x)}: cannot say whether it pays ({what})"
        return f"{head}: does not pay even at {unit} {at} ({what}, {x['verdict']})"
    up_to = f"{head}: pays up to {unit} {x['pays_up_to']:g}; from {at}"
    if undecided:
        return f"{up_to} {_undecided(x)}: cannot say whether it pays ({what})"
    return f"{up_to} it does not pay ({what}, {x['verdict']})"


def warning_line(w: Mapping[str, Any], lengths: int = 1) -> str:
    kind = w["kind"]
    if kind == "degenerate":
        shares = ", ".join(
            f"{k} up to {w[k]:.0%}" for k in ("whitespace", "repetition") if w.get(k)
        )
        return (
            f"degenerate outputs ({shares}): {', '.join(w['names'])}; "
            "a speedup on looping or blank text misleads"
        )
    if kind == "unstable":
        pts = ", ".join(f"{where(p, lengths)} {p['instability']:.2f}" for p in w["points"])
        return f"{w['name']}: unstable across repeats (instability {pts}): read its CI with care"
    if kind == "concurrency not reached":
        return (
            f"{w['name']}, {where(w, lengths)}: peak in flight {w['peak']:g} < "
            f"{w['asked']} asked: less load was measured"
        )
    if kind == "not identical":
        first = w.get("first_divergence_min")
        return (
            f"{w['name']} vs {w['baseline']}, {where(w, lengths)}: {w['identical']}/"
            f"{w['compared']} outputs identical"
            + (f" (first diff at token {first})" if first is not None else "")
            + ": not lossless"
        )
    if kind == "clock":
        return (
            f"{w['name']}: client workers' clock uncertainty {w['uncertainty_s'] * 1e3:.1f} ms "
            f"is more than {w['share']:.0%} of the median TTFT ({w['ttft_s'] * 1e3:.1f} ms): "
            "send times across hosts are only that precise"
        )
    if kind == "client behind":
        return (
            f"{w['name']}, {where(w, lengths)}: the client fell behind its schedule: "
            + behind_text(w)
        )
    if kind == "lane difference":
        shown = "; ".join(f"{d['key']} {d['a']!r} vs {d['b']!r}" for d in w["differences"])
        more = (
            f" (+{w['count'] - len(w['differences'])} more)"
            if w["count"] > len(w["differences"])
            else ""
        )
        return (
            f"{w['name']} vs {w['baseline']}: the lanes differ in more than what is compared: "
            f"{shown}{more}: the comparison measures that too (results.json lane_differences)"
        )
    if kind == "not run":
        return f"not run at {where(w, lengths)}: {', '.join(w['names'])} ({w['status']})"
    return f"{w.get('name', '')}: {kind}"


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def saving_text(e: Mapping[str, Any], unit: str, less: str, more: str) -> str:
    """A stored cost or energy ratio (candidate / baseline) as the change it makes: ``saves 12%
    per million tokens [5%, 18%]`` / ``costs 10% more per million tokens [2%, 20%]`` (``less``,
    ``more``: templates of the percentage), the interval of that same change (no CI: why)."""
    est, lo, hi = e.get("estimate"), e.get("lo"), e.get("hi")
    if est is None:
        return "n/a"
    if est < 1:
        head, span = less.format(_pct(1 - est)), (None if lo is None else (1 - hi, 1 - lo))
    else:
        head, span = more.format(_pct(est - 1)), (None if lo is None else (lo - 1, hi - 1))
    ci = f"[{_pct(span[0])}, {_pct(span[1])}]" if span else f"CI {e.get('verdict') or 'n/a'}"
    return f"{head} {unit} {ci} n={e.get('n')}"


def _money_line(e: Mapping[str, Any], lengths: int) -> str:
    b, c = e.get("baseline_value"), e.get("candidate_value")
    both = "" if b is None or c is None else f" (${c:.3g} vs ${b:.3g})"
    said = saving_text(e, "per million tokens", "saves {}", "costs {} more")
    return f"{e['candidate']}, {where(e, lengths)}: {said}{both}{_unless_said(e)}"


def _energy_line(e: Mapping[str, Any], lengths: int) -> str:
    b, c = e.get("baseline_value"), e.get("candidate_value")
    both = "" if b is None or c is None else f" ({c:.3g} vs {b:.3g} J/tok)"
    said = saving_text(e, "energy per token", "uses {} less", "uses {} more")
    return f"{e['candidate']}, {where(e, lengths)}: {said}{both}{_unless_said(e)}"


def _unless_said(e: Mapping[str, Any]) -> str:
    """The verdict where the line's own words do not say it (not significant, within the min
    effect, undecided); a line without a CI says why already."""
    v = _why(e)
    decided = v in ("cheaper", "costs more", "less energy", "more energy")
    return "" if decided or e.get("lo") is None else f", {v}"


def behind_text(w: Mapping[str, Any]) -> str:
    """What a ``client behind`` warning found: the two clocks' p99, and the requests due that
    were never sent (``not_sent``, counted against the client in every SLO)."""
    metric = {"ttft": "TTFT", "e2e": "E2E"}.get(w.get("metric"), w.get("metric"))
    parts = []
    if metric is not None:
        parts.append(
            f"{metric} p99 {w['p99_from_schedule_s'] * 1e3:.1f} ms from the schedule vs "
            f"{w['p99_from_send_s'] * 1e3:.1f} ms from the send (client queue p99 "
            f"{w['client_queue_p99_s'] * 1e3:.1f} ms, max {w['client_queue_max_s'] * 1e3:.1f} ms)"
        )
    if w.get("not_sent"):
        parts.append(f"{w['not_sent']} requests due were not sent by the end (failed)")
    return "; ".join(parts) + ": users waited longer than the latency from the send says"


def _engine_question(entries: Sequence[Mapping[str, Any]]) -> str:
    firsts = list(dict.fromkeys(e["baseline"].split("/")[0] for e in entries))
    others = list(dict.fromkeys(e["candidate"].split("/")[0] for e in entries))
    name = lambda e: DISPLAY_NAMES.get(e, e)  # noqa: E731
    return f"Is {' / '.join(map(name, others))} faster than {' / '.join(map(name, firsts))}?"


def answer_sections(results: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """(heading, lines) of the answer block, in the order the stored entries come:
    speculation, where it stops paying, the engine question, warnings."""
    a = results.get("answer") or {}
    lengths = len({r["max_new_tokens"] for r in results.get("rows", [])})
    out: list[tuple[str, list[str]]] = []
    spec = a.get("speculation") or []
    if spec:
        out.append(
            (
                "Does speculation pay? (its deciding metric vs the same engine's baseline, "
                "95% CI, n = paired repeats)",
                [
                    f"{e['candidate']}, {where(e, lengths)}: {e['answer']}"
                    + (f" ({_why(e)})" if e["answer"] == "no verdict" else "")
                    + f", {_metric(e)} {speedup_text(e)}"
                    for e in spec
                ],
            )
        )
    if a.get("stops"):
        out.append(("Where it stops paying", [_stop_line(x) for x in a["stops"]]))
    engines = a.get("engines") or []
    if engines:
        out.append(
            (
                _engine_question(engines),
                [
                    f"{e['candidate']}, {where(e, lengths)}: {ENGINE_WORDS.get(e['answer'], e['answer'])}"
                    + (f" ({_why(e)})" if e["answer"] != "pays" else "")
                    + f", {_metric(e)} {speedup_text(e)}"
                    for e in engines
                ],
            )
        )
    if a.get("cost"):
        out.append(
            (
                "What it costs (USD per million output tokens at --price-per-hour, candidate vs "
                "the same engine's baseline, 95% CI from the speedup's paired blocks)",
                [_money_line(e, lengths) for e in a["cost"]],
            )
        )
    if a.get("energy"):
        source = next(
            (r["energy"]["source"] for r in results.get("rows", []) if r.get("energy")), ""
        )
        out.append(
            (
                f"What it draws (joules per output token from the {source}, candidate vs the same "
                "engine's baseline, 95% CI over paired blocks)",
                [_energy_line(e, lengths) for e in a["energy"]],
            )
        )
    if a.get("warnings"):
        out.append(
            (
                "Warnings that change the reading",
                [warning_line(w, lengths) for w in a["warnings"]],
            )
        )
    return out


def answer_markdown(results: Mapping[str, Any]) -> list[str]:
    """The answer block's markdown lines (``## Answer`` and its bullets)."""
    lines = [f"# Answer: {title(results)}", ""]
    sections = answer_sections(results)
    if not sections:
        return [*lines, "Nothing was compared (one variant, or no run finished).", ""]
    for head, items in sections:
        lines += [f"**{head}**", "", *(f"- {x}" for x in items), ""]
    return lines
