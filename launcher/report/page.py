"""The report's HTML: one self-contained file. plotly.js is inlined once; the charts' figures
travel as one JSON block that a few lines of script hand to Plotly.newPlot. Nothing is fetched:
no CDN, no font, no image, so the file opens from a laptop's disk with the network off.

When every chart is drawn the body gets `data-ready="1"` (`data-failed` names a chart that
could not be drawn), which is what a browser test waits for.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

from launcher.report.charts import Chart

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#212121;background:#f5f5f5}
header{background:#263238;color:#fff;padding:16px 24px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#cfd8dc}main{padding:8px 24px 40px;max-width:1400px}
section{background:#fff;border-radius:6px;padding:12px 16px;margin:14px 0;box-shadow:0 1px 2px rgba(0,0,0,.12)}
h2{font-size:17px;margin:4px 0 10px}table{border-collapse:collapse;font-size:13px}
td,th{border-bottom:1px solid #e0e0e0;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#fafafa}.note{padding:8px 12px;border-radius:4px;margin:8px 0;font-size:14px}
.warn{background:#fff3e0;border-left:4px solid #ef6c00}.info{background:#e3f2fd;border-left:4px solid #1565c0}
.bad{background:#ffebee;border-left:4px solid #c62828}.empty{color:#757575;font-style:italic}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:8px}
.chart{min-height:300px}pre{background:#fafafa;padding:8px;overflow:auto;font-size:12px;max-height:400px}
.state-SUCCEEDED{color:#2e7d32}.state-FAILED,.state-UNHEALTHY,.state-INFRA_ERROR{color:#c62828}
"""

DRAW = """
(function () {
  var figures = JSON.parse(document.getElementById("report-figures").textContent);
  var drawn = Object.keys(figures).map(function (id) {
    var div = document.getElementById("chart-" + id);
    var f = figures[id];
    return Plotly.newPlot(div, f.data, f.layout, {displaylogo: false, responsive: true})
      .catch(function (error) { document.body.dataset.failed = id; console.error("chart " + id + ": " + error); });
  });
  Promise.all(drawn).then(function () { document.body.dataset.ready = "1"; });
})();
"""


@cache
def plotly_js() -> str:
    """plotly.js as the plotly package ships it (minified, 4.6 MiB in 7.1.0), inlined once per report."""
    from plotly.offline import get_plotlyjs  # the package's data only: its Python figure API is not used

    return get_plotlyjs()


def script_json(value: Any) -> str:
    """JSON for a <script> element: no <, > or & at all (\\u003c...), so no text inside it can close
    the element or open a comment (`<!--<script>` would swallow the scripts after it)."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def when(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp)) if stamp else "—"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], empty: str) -> str:
    body = "".join("<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    if not body:
        return f'<p class="empty">{esc(empty)}</p>'
    return "<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + f"</tr>{body}</table>"


def note(text: str, kind: str = "info") -> str:
    return f'<div class="note {kind}">{esc(text)}</div>'


def chart_div(chart: Chart | None, empty: str) -> str:
    if chart is None:
        return f'<p class="empty">{esc(empty)}</p>'
    return f'<div class="chart" id="chart-{esc(chart.id)}" data-title="{esc(chart.title)}"></div>'


def section(title: str, *parts: str, grid: bool = False) -> str:
    inner = "".join(parts)
    return f"<section><h2>{esc(title)}</h2>" + (f'<div class="grid">{inner}</div>' if grid else inner) + "</section>"


def document(title: str, subtitle: str, sections: Sequence[str], charts: Sequence[Chart]) -> str:
    figures = script_json({chart.id: chart.figure for chart in charts})
    script = plotly_js().replace("</script", "<\\/script") if charts else ""
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
            f"<header><h1>{esc(title)}</h1><p>{esc(subtitle)}</p></header><main>{''.join(sections)}</main>"
            f'<script type="application/json" id="report-figures">{figures}</script>'
            + (f"<script>{script}</script><script>{DRAW}</script>" if charts
               else '<script>document.body.dataset.ready = "1";</script>')
            + "</body></html>")
