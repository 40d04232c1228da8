"""report.html: one self-contained page per run (inline CSS, inline SVG plots, a little vanilla
JS for sorting tables and toggling variants; no network, works from file://). It formats what
results.json stores, as summary.md does; computes nothing."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from harness.report.answer_text import answer_sections, title
from harness.report.columns import (
    COMPARISONS,
    MAIN,
    METRIC_LABEL,
    THEORY,
    Column,
    Line,
    compact_note,
    percentile_columns,
)
from harness.report.markdown import (
    FOOTNOTE,
    THEORY_NOTE,
    category_cell,
    head_lines,
    ordered,
    point_heading,
    points_of,
    stored_at,
)
from harness.report.plots import colours, variants
from harness.report.workload_tables import workload_lines

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;
max-width:1400px;padding:0 1.2em 3em;color:#1b1b1b}
h1{font-size:1.5em;margin:.8em 0 .3em}h2{font-size:1.2em;margin:1.6em 0 .4em;
border-bottom:1px solid #ddd}h3{font-size:1em;margin:1em 0 .2em}
#answer{background:#f4f8fb;border:1px solid #cfe0ec;border-radius:6px;padding:.2em 1em .6em}
#answer ul{margin:.2em 0;padding-left:1.3em}
.pays{color:#126b12;font-weight:600}.nopay{color:#a11;font-weight:600}
table{border-collapse:collapse;margin:.4em 0;font-size:12.5px}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:left;white-space:nowrap}
th{background:#f0f0f0;cursor:pointer;user-select:none}th[data-dir=asc]::after{content:" \\25b2"}
th[data-dir=desc]::after{content:" \\25bc"}tr:nth-child(even) td{background:#fafafa}
.scroll{overflow-x:auto}.note{color:#555;font-size:12.5px;max-width:110ch}
.swatch{display:inline-block;width:.9em;height:.9em;border-radius:2px;margin:0 .3em 0 .1em;
vertical-align:-.1em}#variants label{margin-right:1.2em;white-space:nowrap}
figure{margin:1em 0}figure svg{max-width:100%;height:auto}
figcaption{font-weight:600;margin-bottom:.2em}pre{background:#f6f6f6;padding:.5em;
overflow-x:auto;font-size:12px}
"""

SCRIPT = """
(function(){
function key(td){var s=td.textContent.trim(),n=parseFloat(s);return isNaN(n)?s:n;}
function cmp(x,y){var a=typeof x==='number',b=typeof y==='number';
 if(a&&b)return x-y;if(a)return -1;if(b)return 1;return String(x).localeCompare(String(y));}
document.querySelectorAll('table.sortable').forEach(function(t){
 t.querySelectorAll('th').forEach(function(th,i){th.addEventListener('click',function(){
  var dir=th.dataset.dir==='asc'?'desc':'asc',body=t.tBodies[0];
  t.querySelectorAll('th').forEach(function(h){delete h.dataset.dir;});th.dataset.dir=dir;
  Array.prototype.slice.call(body.rows).sort(function(r,s){
   var c=cmp(key(r.cells[i]),key(s.cells[i]));return dir==='asc'?c:-c;})
   .forEach(function(r){body.appendChild(r);});});});});
document.querySelectorAll('#variants input').forEach(function(cb){
 cb.addEventListener('change',function(){var on=cb.checked,name=cb.value,i=cb.dataset.index;
  document.querySelectorAll('tr[data-variant]').forEach(function(tr){
   if(tr.dataset.variant===name)tr.hidden=!on;});
  document.querySelectorAll('svg [id^="v'+i+'-"]').forEach(function(g){
   g.style.display=on?'':'none';});});});
})();
"""


def _table(
    columns: Sequence[Column],
    lines: Sequence[Line],
    metric: str = "output_tok_s",
    variant: Any = None,
) -> str:
    """A sortable table; ``variant(line)`` names the row's variant (for the toggles)."""
    heads = "".join(
        f"<th>{escape(c.header.format(metric=METRIC_LABEL.get(metric, metric)))}</th>"
        for c in columns
    )
    body = []
    for x in lines:
        name = variant(x) if variant else None
        attr = f' data-variant="{escape(name)}"' if name else ""
        cells = "".join(f"<td>{escape(c.fmt(c.get(x)))}</td>" for c in columns)
        body.append(f"<tr{attr}>{cells}</tr>")
    return (
        f'<div class="scroll"><table class="sortable"><thead><tr>{heads}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _kv(items: Mapping[str, Any]) -> str:
    """A two-column table of a stored mapping (nested values as JSON)."""
    rows = []
    for k, v in items.items():
        text = v if isinstance(v, str) else json.dumps(v, default=str)
        rows.append(f"<tr><th>{escape(str(k))}</th><td>{escape(str(text))}</td></tr>")
    return f'<div class="scroll"><table>{"".join(rows)}</table></div>'


def _answer(results: Mapping[str, Any]) -> str:
    parts = [f"<h1>Answer: {escape(title(results))}</h1>", '<section id="answer">']
    sections = answer_sections(results)
    if not sections:
        parts.append("<p>Nothing was compared (one variant, or no run finished).</p>")
    for head, items in sections:
        lis = []
        for x in items:
            cls = ""
            if ": pays" in x or ": faster" in x:
                cls = ' class="pays"'
            elif ": does not pay" in x or ": not faster" in x:
                cls = ' class="nopay"'
            lis.append(f"<li><span{cls}>{escape(x)}</span></li>")
        parts.append(f"<h3>{escape(head)}</h3><ul>{''.join(lis)}</ul>")
    if results.get("status") not in (None, "complete"):
        parts.append(f"<p><b>Run {escape(str(results['status']))}</b>: partial results.</p>")
    parts.append("</section>")
    return "".join(parts)


def _toggles(results: Mapping[str, Any]) -> str:
    col = colours(results)
    boxes = "".join(
        f'<label><input type="checkbox" checked value="{escape(n)}" data-index="{i}">'
        f'<span class="swatch" style="background:{col[n]}"></span>{escape(n)}</label>'
        for i, n in enumerate(variants(results))
    )
    return f'<p id="variants">Show: {boxes}</p>'


def _points(results: Mapping[str, Any]) -> str:
    comps, checks = results.get("comparisons") or [], results.get("lossless") or []
    out = ["<h2>Every configuration at every point</h2>"]
    extra = percentile_columns(results.get("config") or {})
    for rows in points_of(results).values():
        first = rows[0]
        view = [
            Line(r, stored_at(comps, r.get("comparison")), stored_at(checks, r.get("lossless")))
            for r in rows
        ]
        metric = first.get("deciding_metric", "output_tok_s")
        out.append(f"<h3>{escape(point_heading(first))}</h3>")
        out.append(_table(MAIN, view, metric, lambda x: x.entry["name"]))
        if extra:
            out.append(_table(extra, view, metric, lambda x: x.entry["name"]))
    note = compact_note({c.name for c in MAIN})  # the full set shows every column
    out.append(f'<p class="note">{escape(note)} {escape(FOOTNOTE)}</p>')
    return "".join(out)


def _more_tables(results: Mapping[str, Any]) -> str:
    comps = results.get("comparisons") or []
    out = []
    theory = results.get("theory") or []
    if theory:
        view = [Line(t, stored_at(comps, t.get("comparison"))) for t in ordered(theory, results)]
        out += [
            "<h2>Theory vs measurement (latency mode)</h2>",
            f'<p class="note">{escape(THEORY_NOTE)}</p>',
            _table(THEORY, view, variant=lambda x: x.entry["name"]),
        ]
    for t in ordered(results.get("categories") or [], results, "candidate"):
        cats = [*t["categories"], "overall"]
        cols = [Column("category", "category", lambda c: c.entry["category"], str)] + [
            Column("cell", "speedup [95% CI], acceptance", lambda c: c.entry["cell"], category_cell)
        ]
        view = [Line({"category": c, "cell": t["cells"].get(c)}) for c in cats]
        out += [
            f"<h2>Per category: {escape(t['candidate'])} vs {escape(t['baseline'])}, "
            f"{escape(t['mode'])}, {t['max_new_tokens']} tok</h2>",
            _table(cols, view),
        ]
    workload = workload_lines(results)  # a replay's checks, a conversation's turns: as text
    if workload:
        out.append(f"<h2>Trace replay and turns</h2><pre>{escape(chr(10).join(workload))}</pre>")
    if comps:
        out += [
            "<h2>Paired comparisons</h2>",
            _table(
                COMPARISONS,
                [Line(c) for c in ordered(comps, results, "candidate")],
                variant=lambda x: x.entry["candidate"],
            ),
        ]
    return "".join(out)


def _plan(results: Mapping[str, Any]) -> str:
    out = ["<h2>Plan, design and what did not run</h2>"]
    out += [f'<p class="note">{escape(x)}</p>' for x in head_lines(results) if x]
    if results.get("plan"):
        out.append("<h3>Plan</h3>" + _kv(results["plan"]))
    if results.get("design"):
        out.append("<h3>Design</h3>" + _kv(results["design"]))
    not_run = results.get("not_run") or []
    if not_run:
        out.append(
            "<h3>Not run</h3><ul>"
            + "".join(
                f"<li>{escape(n['name'])}, {escape(n['point'] or 'no point: ' + str(n.get('how')))}: {escape(str(n['status']))}</li>"
                for n in not_run
            )
            + "</ul>"
        )
    out.append("<h2>Config (every setting of the run)</h2>" + _kv(results.get("config") or {}))
    out.append("<h2>Environment</h2>" + _kv(results.get("environment") or {}))
    wl = {k: v for k, v in (results.get("workload") or {}).items() if k != "categories"}
    out.append("<h2>Workload</h2>" + _kv(wl))
    return "".join(out)


def page(results: Mapping[str, Any], svgs: Sequence[tuple[str, str]] = ()) -> str:
    """The whole report.html: answer, tables, plots, plan, config, environment."""
    figures = "".join(
        f"<figure><figcaption>{escape(caption)}</figcaption>{svg}</figure>" for caption, svg in svgs
    )
    body = [
        _answer(results),
        _toggles(results),
        _points(results),
        f"<h2>Plots</h2>{figures}" if figures else "",
        _more_tables(results),
        _plan(results),
    ]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{escape(title(results))}</title><style>{STYLE}</style></head><body>"
        + "".join(body)
        + f"<script>{SCRIPT}</script></body></html>\n"
    )
