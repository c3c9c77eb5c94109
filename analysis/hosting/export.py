"""Exports: JSON (the typed result), CSV (tables; the writer, `rows_to_csv`, is the framework's, in
`analysis.framework.results`, since a panel writes CSV too) and a self-contained HTML report.

The HTML report embeds plotly.js and every figure, so it opens offline. All user-provided text
(titles, notes, prompts, captions, table cells, figure text) is escaped: figures travel as JSON
inside a `<script type="application/json">` block with every `<` written as `\\u003c`, so no
string from a user can close the script element or open a new one.
"""
from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from typing import Any

from analysis.framework.results import rows_to_csv, to_jsonable  # noqa: F401  (rows_to_csv: the CSV export)


def result_json(result: Any, indent: int = 2) -> str:
    return json.dumps(to_jsonable(result), indent=indent)


def safe_json_for_script(data: Any) -> str:
    """JSON that is safe inside an HTML <script> element (no '<', '>' or '&' characters)."""
    text = json.dumps(to_jsonable(data))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@dataclass
class ReportSection:
    heading: str
    text: str = ""
    figure: Any = None  # plotly Figure or its JSON dict
    table: list[dict] = field(default_factory=list)
    detail: str = ""  # folded under the section (<details>): e.g. a talk step's researcher's note


HEADLINE = "Headline"  # the share bar's metric cards, as a table of (metric, value, change)
NOTES = "What am I looking at?"  # the page's notes under its figures, as rows of {"note": text}


def html_report(title: str, sections: list[ReportSection], *, model: str = "", note: str = "",
                params: dict | None = None, url: str = "", headline: list[dict] | None = None,
                notes: list[str] | None = None) -> str:
    """A self-contained HTML page (plotly.js inlined): the headline numbers first, then the analysis' figures
    and tables, the notes that explain them, and the parameters last."""
    from plotly.offline import get_plotlyjs

    esc = html.escape
    figures = []
    body = [f"<h1>{esc(title)}</h1>"]
    meta = []
    if model:
        meta.append(f"<b>Model:</b> {esc(model)}")
    if url:
        meta.append(f"<b>Link:</b> <code>{esc(url)}</code>")
    if meta:
        body.append("<p>" + "<br>".join(meta) + "</p>")
    if note:
        body.append(f"<p class='note'>{esc(note)}</p>")
    if headline:
        body.append("<div class='headline'>" + "".join(
            f"<div class='card'><div class='label'>{esc(str(m.get('metric', '')))}</div>"
            f"<div class='value'>{esc(str(m.get('value', '')))}</div>"
            + (f"<div class='change'>{esc(str(m['change']))}</div>" if m.get("change") else "") + "</div>"
            for m in headline) + "</div>")
    for section in sections:
        body.append(f"<h2>{esc(section.heading)}</h2>")
        if section.text:
            body.append(f"<p>{esc(section.text)}</p>")
        if section.figure is not None:
            fig = section.figure.to_plotly_json() if hasattr(section.figure, "to_plotly_json") else section.figure
            body.append(f"<div class='figure' id='fig{len(figures)}'></div>")
            figures.append(fig)
        if section.table:
            body.append(_table(section.table))
        if section.detail:
            body.append(f"<details><summary>The researcher's note</summary><p>{esc(section.detail)}</p></details>")
    if notes:
        body.append(f"<h2>{esc(NOTES)}</h2>" + "".join(f"<p class='note'>{esc(n)}</p>" for n in notes))
    if params:
        body.append("<h2>Parameters</h2>" + _table([{"parameter": k, "value": v} for k, v in params.items()]))
    script = (
        "var figs = JSON.parse(document.getElementById('figures').textContent);"
        "figs.forEach(function (f, i) { Plotly.newPlot('fig' + i, f.data || [], f.layout || {}, "
        "{responsive: true, displaylogo: false}); });"
    )
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title>"
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}td,th{border:1px solid #ccc;"
        "padding:3px 8px;text-align:left}.note{background:#f4f4f4;padding:0.6em}"
        ".headline{display:flex;flex-wrap:wrap;gap:1.5em;margin:1em 0}.card .label{font-size:0.85em;color:#555}"
        ".card .value{font-size:1.8em}.card .change{font-size:0.85em;color:#555}"
        ".figure{min-height:420px}</style>"
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
        + "\n".join(body)
        + f"<script type='application/json' id='figures'>{safe_json_for_script(figures)}</script>"
        + f"<script type='text/javascript'>{script}</script>"
        + "</body></html>"
    )


def _table(rows: list[dict]) -> str:
    rows = [to_jsonable(r) for r in rows]
    if not rows:
        return ""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(r.get(c, '')))}</td>" for c in columns) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)
