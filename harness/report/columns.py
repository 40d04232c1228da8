"""The columns of every markdown table, one entry each: name, header, how to read the value
from the stored analysis (:mod:`harness.analysis.derived`), and how to format it. Nothing here computes
a statistic; a new column is one entry in one of these tuples."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from harness.core.records import NO_SCHEDULE

METRIC_LABEL = {"output_tok_s": "tok/s", "e2e": "E2E", "ttft": "TTFT", "tpot": "TPOT"}


@dataclass(frozen=True)
class Line:
    """What one table line reads: a stored entry and the comparison/check it points to."""

    entry: Mapping[str, Any]
    comparison: Mapping[str, Any] | None = None
    check: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Column:
    name: str
    header: str  # "{metric}" is replaced by the metric that decides the table's verdicts
    get: Callable[[Line], Any]
    fmt: Callable[[Any], str]


# ---- formatters (values in, text out) -----------------------------------------------------------
def num(x: Any, digits: int = 1, scale: float = 1.0) -> str:
    """A number, or "n/a" for a missing value (never 0)."""
    return "n/a" if x is None else f"{x * scale:.{digits}f}"


def _fixed(digits: int, scale: float = 1.0) -> Callable[[Any], str]:
    return lambda x: num(x, digits, scale)


def ci_text(c: Mapping[str, Any] | None) -> str:
    """A speedup with its CI, n and method ("1.42x [1.23, 1.66] n=16 t"), or why there is no CI
    ("1.42x, CI n/a (n too small) n=2 t")."""
    if not c:
        return "n/a"
    est, lo, hi = c.get("estimate"), c.get("lo"), c.get("hi")
    if est is None:
        return "n/a"
    n, method = c.get("n"), c.get("method")
    tail = f" n={n}" + (f" {method_tag(method)}" if method else "")
    if lo is None or hi is None:  # the stats say why there is none ("n/a (n too small)")
        why = str(c.get("verdict") or "")
        return f"{est:.2f}x, CI {why if why.startswith('n/a') else 'n/a'}{tail}"
    return f"{est:.2f}x [{lo:.2f}, {hi:.2f}]{tail}"


def method_tag(method: str) -> str:
    """The method's short name in a CI ("t" for "t on per-repeat log ratios")."""
    return method.split()[0]


def lossless_text(check: Mapping[str, Any] | None) -> str:
    if not check:
        return "n/a"
    if check.get("status", "checked") != "checked":
        return str(check["status"])
    if check.get("share_identical") is None:
        return "n/a"
    out = f"{check['identical']}/{check['compared']}"
    first = check.get("first_divergence_min")
    return out + (f" (first diff at token {first})" if first is not None else "")


def sanity_text(s: Mapping[str, Any] | None) -> str:
    if not s or not s.get("outputs"):
        return "n/a"
    parts = [f"{k} {s[k]:.0%}" for k in ("whitespace", "repetition") if s.get(k)]
    if s.get("repetition", 0) is None:  # no token ids: loops were not looked for
        parts.append("repetition n/a")
    return ", ".join(parts) if parts else "none"


def load_label(load: Mapping[str, Any]) -> str:
    if load.get("arrivals") == "trace":  # harness.core.replay
        cap = f", cap {load['concurrency']}" if load.get("concurrency") else ""
        return (
            f"trace replay x{load.get('time_scale', 1.0):g} ({load.get('requests')} requests{cap})"
        )
    if "request_rate" in load:
        cap = f", cap {load['concurrency']}" if load.get("concurrency") else ""
        return f"{load['request_rate']:g} req/s{cap}"
    n = load.get("concurrency", 1)
    return "1 at a time" if n == 1 else f"concurrency {n}"


# ---- readers -------------------------------------------------------------------------------------
def _s(key: str, stat: str | None = None) -> Callable[[Line], Any]:
    def get(x: Line) -> Any:
        v = x.entry["summary"].get(key)
        return (v or {}).get(stat) if stat else v

    return get


def _sched(key: str, stat: str) -> Callable[[Line], Any]:
    """A from-schedule statistic and whether its row is a closed loop, as the analysis stored
    it (the row's ``open_loop``: :func:`harness.core.load.open_loop`)."""
    return lambda x: (_s(key, stat)(x), x.entry.get("open_loop") is False)


def _scheduled(v: tuple[Any, bool], digits: int = 1) -> str:
    """A from-schedule latency in ms, or why there is none: a closed loop has no schedule (an
    open loop's file written before records kept it, or a file before rows said which they
    are: n/a)."""
    x, closed = v
    return (NO_SCHEDULE if closed else "n/a") if x is None else num(x, digits, 1e3)


def _spec(key: str) -> Callable[[Line], Any]:
    return lambda x: (x.entry.get("spec") or {}).get(key)


def speedup_text(c: Mapping[str, Any] | None) -> str:
    """A speedup with what it is relative to: ``1.21x [1.14, 1.29] n=4 t vs E/baseline`` (the
    whole name: a second engine's baseline row is relative to the first engine's baseline)."""
    if not c or c.get("estimate") is None:
        return "n/a"
    return f"{ci_text(c)} vs {c['baseline']}"


def _versus(x: Line) -> str:
    return speedup_text(x.comparison)


def short_verdict(v: Any) -> str:
    """A verdict in a narrow column: "n.s." for no significant difference, "n/a" for every
    "n/a (...)" (the speedup cell beside it says why)."""
    v = "n/a" if v is None else str(v)
    return "n.s." if v == "no significant difference" else ("n/a" if v.startswith("n/a") else v)


def _row_figure(key: str, figure: str) -> Callable[[Line], Any]:
    """A row's stored cost or energy figure (None: unpriced, or no energy reading)."""
    return lambda x: (x.entry.get(key) or {}).get(figure)


def ratio_text(c: Mapping[str, Any] | None) -> str:
    """A cost or energy ratio (candidate / baseline, <1 = less) with its CI and n."""
    return "n/a" if not c or c.get("estimate") is None else ci_text(c)


def _ratio(key: str) -> Callable[[Line], Any]:
    """The cost or energy ratio stored on the row's deciding comparison (tokens/s only: an
    open-loop point, decided by E2E, has none)."""
    return lambda x: (x.comparison or {}).get(key)


USD_PER_M = Column("usd_per_mtok", "$/M tok", _row_figure("cost", "usd_per_million_tokens"),
                   _fixed(3))  # fmt: skip
J_PER_TOK = Column("j_per_tok", "J/tok", _row_figure("energy", "joules_per_token"), _fixed(3))


# ---- the tables ------------------------------------------------------------------------------------
MAIN: tuple[Column, ...] = (
    Column("name", "engine/variant", lambda x: x.entry["name"], str),
    Column(
        "ok_failed",
        "ok/failed",
        lambda x: (x.entry["summary"]["completed"], x.entry["summary"]["failed"]),
        lambda v: f"{v[0]}/{v[1]}",
    ),
    Column(
        "output_tok_s",
        "out tok/s",
        lambda x: (x.entry["summary"].get("output_tok_s"), x.entry["summary"].get("unstable")),
        lambda v: num(v[0]) + (" (unstable)" if v[1] else ""),
    ),
    Column("ttft_med", "TTFT med ms (from send)", _s("ttft_s", "median"), _fixed(1, 1e3)),
    Column("ttft_p99", "TTFT p99 ms (from send)", _s("ttft_s", "p99"), _fixed(1, 1e3)),
    Column("tpot_med", "TPOT med ms", _s("tpot_s", "median"), _fixed(2, 1e3)),
    Column("tpot_p99", "TPOT p99 ms", _s("tpot_s", "p99"), _fixed(2, 1e3)),
    Column("e2e_med", "E2E med ms (from send)", _s("e2e_s", "median"), _fixed(0, 1e3)),
    Column("e2e_p99", "E2E p99 ms (from send)", _s("e2e_s", "p99"), _fixed(0, 1e3)),
    Column(
        "e2e_sched_p99",
        "E2E p99 ms (from schedule)",
        _sched("e2e_from_schedule_s", "p99"),
        lambda v: _scheduled(v, 0),
    ),
    Column("queue_p99", "client queue p99 ms", _sched("client_queue_s", "p99"), _scheduled),
    Column("acceptance_rate", "accept rate", _spec("acceptance_rate"), _fixed(2)),
    Column("alpha", "alpha", _spec("alpha"), _fixed(2)),
    Column("mean_acc_len", "mean acc len (vLLM)", _spec("mean_acceptance_length"), _fixed(2)),
    Column("tok_per_pass", "tok/target pass", _spec("tokens_per_target_pass"), _fixed(2)),
    Column("speedup", "speedup {metric} [95% CI]", _versus, str),
    Column("verdict", "verdict", lambda x: (x.comparison or {}).get("verdict", "n/a"), str),
    Column("usd_per_mtok", "$ per M out tok", USD_PER_M.get, USD_PER_M.fmt),
    Column("cost_ratio", "cost vs baseline [95% CI]", _ratio("cost"), ratio_text),
    Column("j_per_tok", "J per out tok", J_PER_TOK.get, J_PER_TOK.fmt),
    Column("energy_source", "energy from", _row_figure("energy", "source"), lambda v: v or "n/a"),
    Column("energy_ratio", "energy vs baseline [95% CI]", _ratio("energy"), ratio_text),
    Column("lossless", "identical to baseline", lambda x: x.check, lossless_text),
    Column("degenerate", "degenerate out", lambda x: x.entry.get("sanity"), sanity_text),
)


# the columns a user decides on (summary.md, stdout); the full set is MAIN (csv, json, html)
COMPACT: tuple[Column, ...] = (
    Column("name", "variant", lambda x: x.entry["name"], str),
    Column(
        "output_tok_s",
        "tok/s",
        lambda x: (x.entry["summary"].get("output_tok_s"), x.entry["summary"].get("unstable")),
        lambda v: num(v[0]) + ("*" if v[1] else ""),
    ),
    Column("ttft_med", "TTFT ms", _s("ttft_s", "median"), _fixed(1, 1e3)),
    Column("tpot_med", "TPOT ms", _s("tpot_s", "median"), _fixed(2, 1e3)),
    Column("e2e_med", "E2E ms", _s("e2e_s", "median"), _fixed(0, 1e3)),
    Column("acceptance_rate", "accept", _spec("acceptance_rate"), _fixed(2)),
    USD_PER_M,
    J_PER_TOK,
    Column("speedup", "speedup {metric} [95% CI]", _versus, str),
    Column("verdict", "verdict", lambda x: (x.comparison or {}).get("verdict"), short_verdict),
)
# shown only where some row stores the figure (--price-per-hour; an energy counter)
COMPACT_IF_STORED = ("usd_per_mtok", "j_per_tok")
# the notes' explanations of the columns shown only where stored, by column name
COMPACT_IF_STORED_NOTES = {
    "usd_per_mtok": "$/M tok = USD per million output tokens at --price-per-hour",
    "j_per_tok": "J/tok = joules per output token",
}


def compact_note(shown: Collection[str]) -> str:
    """The note under the compact tables; it explains only those of the stored-only columns
    (COMPACT_IF_STORED) that a table showed (``shown``: column names)."""
    named = [text for name, text in COMPACT_IF_STORED_NOTES.items() if name in shown]
    stored = f"; {', '.join(named)} (docs/cost.md)" if named else ""
    return (
        "Medians over counted requests; latencies from each request's send (the full set has "
        "them from its scheduled arrival too, and the client queue between the two, under an "
        f"open loop); * = unstable across repeats{stored}; speedup >1 = better, with its 95% CI, "
        "n and method, against the row it names; n.s. = no significant difference. The full "
        "column set is in summary.csv, results.json and report.html."
    )


COMPACT_WIDTH = 120
# dropped in this order while a compact table is wider than COMPACT_WIDTH (all are in the csv)
COMPACT_OPTIONAL = ("e2e_med", "ttft_med", "acceptance_rate")


def _c(x: Line) -> str:
    c, source = x.entry.get("c"), x.entry.get("c_source")
    return "n/a" if c is None else f"{c:.3f} ({source})"


THEORY: tuple[Column, ...] = (
    Column("name", "engine/variant", lambda x: x.entry["name"], str),
    Column("max_new_tokens", "max tok", lambda x: x.entry["max_new_tokens"], str),
    Column("alpha", "alpha", lambda x: x.entry["alpha"], _fixed(2)),
    Column("gamma", "gamma", lambda x: x.entry["gamma"], str),
    Column("c", "c", _c, str),
    Column("expected", "E tok/pass", lambda x: x.entry["expected_tokens_per_pass"], _fixed(2)),
    Column(
        "measured_pass",
        "measured tok/target pass",
        lambda x: x.entry.get("tokens_per_target_pass"),
        _fixed(2),
    ),
    Column(
        "mean_acc_len",
        "mean acc len (vLLM)",
        lambda x: x.entry.get("mean_acceptance_length"),
        _fixed(2),
    ),
    Column(
        "predicted",
        "predicted speedup",
        lambda x: (x.entry.get("predicted_speedup"), x.entry.get("predicted_note")),
        lambda v: num(v[0], 2) if v[0] is not None else str(v[1] or "n/a"),
    ),
    Column("measured", "measured tok/s speedup", lambda x: x.comparison, speedup_text),
    Column(
        "best_gamma",
        "best gamma",
        lambda x: (x.entry.get("best_gamma"), x.entry.get("best_gamma_note")),
        lambda v: str(v[0]) if v[0] is not None else str(v[1]),
    ),
)

# --percentile-metrics (vLLM's names) -> the stored distribution they read
PERCENTILE_KEYS = {
    "ttft": "ttft_s", "tpot": "tpot_s", "itl": "itl_s", "e2el": "e2e_s",
    "client_queue_time": "client_queue_s", "e2el_including_client_queue": "e2e_from_schedule_s",
}  # fmt: skip
SCHEDULED_KEYS = ("client_queue_s", "e2e_from_schedule_s")  # null in a closed loop


def percentile_columns(config: Mapping[str, Any]) -> tuple[Column, ...]:
    """The table of ``--percentile-metrics`` x ``--metric-percentiles`` (when asked for): one
    column per metric and percentile, as vLLM bench serve prints them (ms)."""
    metrics = config.get("percentile_metrics") or ()
    if not metrics:
        return ()
    cols = [Column("name", "engine/variant", lambda x: x.entry["name"], str)]
    for m in metrics:
        for p in config.get("metric_percentiles") or (50, 90, 99):
            word = f"p{int(p)}" if float(p).is_integer() else f"p{p:g}"
            cols.append(
                Column(
                    f"{m}_{word}",
                    f"{m.upper()} {word} ms",
                    *(
                        (_sched(PERCENTILE_KEYS[m], word), lambda v: _scheduled(v, 2))
                        if PERCENTILE_KEYS[m] in SCHEDULED_KEYS
                        else (_s(PERCENTILE_KEYS[m], word), _fixed(2, 1e3))
                    ),
                )
            )
    return tuple(cols)


COMPARISONS: tuple[Column, ...] = (
    Column("pair", "pair", lambda x: f"{x.entry['candidate']} vs {x.entry['baseline']}", str),
    Column(
        "cell",
        "cell",
        lambda x: (
            f"{x.entry['mode']}, {load_label(x.entry['load'])}, {x.entry['max_new_tokens']} tok"
        ),
        str,
    ),
    Column("metric", "metric", lambda x: x.entry["metric"], str),
    Column("speedup", "speedup [95% CI]", lambda x: x.entry, ci_text),
    Column("verdict", "verdict", lambda x: x.entry["verdict"], str),
)
