"""The report's charts as plotly.js figure specs (plain dicts: data, layout): the page draws them
with the plotly.js it carries inline, so nothing here imports plotly's Python side.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from launcher.report.data import Band, Curve
from launcher.state import RunRecord

STATUS_COLOURS = {"SUCCEEDED": "#2e7d32", "FAILED": "#c62828", "STOPPED": "#757575", "RUNNING": "#1565c0",
                  "PENDING": "#f9a825", "UNHEALTHY": "#6a1b9a"}


def plain(text: str) -> str:
    """Text as plotly.js shows it literally: it reads a few HTML tags in names and texts (<a href>
    makes a link, <br> a line), and turns entities back into characters after it splits the tags."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@dataclass
class Chart:
    id: str  # the element id: chart-<id>
    title: str
    figure: dict[str, Any]


def _layout(title: str, unit: str, *, percent: bool = False, height: int = 340) -> dict[str, Any]:
    yaxis: dict[str, Any] = {"title": {"text": unit}, "rangemode": "tozero", "automargin": True}
    if percent:
        yaxis.update(tickformat=".0%", range=[0, 1.05])
    return {"title": {"text": title, "x": 0.01, "font": {"size": 15}}, "height": height,
            "margin": {"l": 60, "r": 20, "t": 40, "b": 30}, "xaxis": {"type": "date"},
            "yaxis": yaxis, "legend": {"orientation": "h", "y": -0.15, "yanchor": "top"}, "hovermode": "x unified",
            "paper_bgcolor": "#ffffff", "plot_bgcolor": "#fafafa"}


def lines(chart_id: str, title: str, unit: str, found: list[Curve], *, percent: bool = False,
          bytes_axis: bool = False) -> Chart | None:
    """One line per curve; None when there is nothing to draw (the page says so instead)."""
    drawn = [c for c in found if c.x]
    if not drawn:
        return None
    data = [{"type": "scatter", "mode": "lines+markers" if len(c.x) < 3 else "lines", "name": plain(c.name),
             "x": c.x, "y": [v if math.isfinite(v) else None for v in c.y]} for c in drawn]
    layout = _layout(title, unit, percent=percent)
    if bytes_axis:
        layout["yaxis"]["tickformat"] = ".3s"
    return Chart(chart_id, title, {"data": data, "layout": layout})


BAND_COLOURS = ("#1565c0", "#2e7d32", "#6a1b9a", "#ef6c00")
OUTLIERS_DRAWN = 12  # named lines over a band: more would hide it (the faults table names every node)


def bands(chart_id: str, title: str, unit: str, found: list[Band], outliers: list[Curve], *, percent: bool = False,
          bytes_axis: bool = False) -> Chart | None:
    """A large cluster's metric: per band the p5-p95 range filled, the median, min and max dotted; and the
    nodes kept whole (outliers, faults, asked for) as named lines over it. None when there is no band."""
    drawn = [b for b in found if b.x]
    if not drawn:
        return None

    def ys(values: list[float]) -> list[float | None]:  # 6 significant digits: a 2,000-node week stays light
        return [float(f"{v:.6g}") if math.isfinite(v) else None for v in values]

    data: list[dict[str, Any]] = []
    for index, band in enumerate(drawn):
        colour = BAND_COLOURS[index % len(BAND_COLOURS)]
        name = plain(band.name)
        data += [{"type": "scatter", "mode": "lines", "name": f"{name} p5", "x": band.x, "y": ys(band.y["p5"]),
                  "line": {"width": 0, "color": colour}, "showlegend": False, "legendgroup": name},
                 {"type": "scatter", "mode": "lines", "name": f"{name} p5-p95", "x": band.x, "y": ys(band.y["p95"]),
                  "fill": "tonexty", "fillcolor": "rgba(100,140,200,0.3)", "line": {"width": 0, "color": colour},
                  "legendgroup": name},
                 {"type": "scatter", "mode": "lines", "name": f"{name} median", "x": band.x, "y": ys(band.y["p50"]),
                  "line": {"width": 2, "color": colour}, "legendgroup": name},
                 {"type": "scatter", "mode": "lines", "name": f"{name} min", "x": band.x, "y": ys(band.y["min"]),
                  "line": {"width": 1, "dash": "dot", "color": colour}, "legendgroup": name},
                 {"type": "scatter", "mode": "lines", "name": f"{name} max", "x": band.x, "y": ys(band.y["max"]),
                  "line": {"width": 1, "dash": "dot", "color": colour}, "legendgroup": name}]
    for curve in [c for c in outliers if c.x][:OUTLIERS_DRAWN]:
        data.append({"type": "scatter", "mode": "lines+markers" if len(curve.x) < 3 else "lines",
                     "name": plain(curve.name), "x": curve.x, "y": ys(curve.y)})
    layout = _layout(title, unit, percent=percent)
    if bytes_axis:
        layout["yaxis"]["tickformat"] = ".3s"
    return Chart(chart_id, title, {"data": data, "layout": layout})


def attempts(record: RunRecord, events: list[dict[str, Any]]) -> Chart | None:
    """The attempts as bars from submission to end (coloured by status, labelled with the exit
    code), with the run's heal and retry events as markers on their own row."""
    now = time.time()
    bars = []
    for attempt in record.attempts:
        start = attempt.submitted_at or attempt.running_at
        if start is None:
            continue
        end = attempt.ended_at or (record.finished_at if record.exit_code is not None else None) or now
        label = plain(attempt.status + (f" (exit {attempt.driver_exit_code})"
                                        if attempt.driver_exit_code is not None else ""))
        bars.append({"type": "bar", "orientation": "h", "name": f"attempt {attempt.attempt}: {label}",
                     "y": [f"attempt {attempt.attempt}"], "base": [start * 1000], "x": [max(end - start, 0.5) * 1000],
                     "text": [label], "textposition": "inside", "insidetextanchor": "middle",
                     "marker": {"color": STATUS_COLOURS.get(attempt.status, "#90a4ae")},
                     "hovertemplate": f"attempt {attempt.attempt}: {label}, {end - start:.0f} s<extra></extra>"})
    if not bars:
        return None
    marks = [e for e in events if e["kind"].startswith(("health.", "node.", "retry.", "run.resume"))]
    if marks:
        bars.append({"type": "scatter", "mode": "markers", "name": "events", "y": ["events"] * len(marks),
                     "x": [e["time"] * 1000 for e in marks], "text": [plain(f"{e['kind']}: {e.get('message') or ''}")
                                                                    for e in marks],
                     "hovertemplate": "%{text}<extra></extra>", "marker": {"size": 11, "symbol": "diamond",
                                                                           "color": "#ef6c00"}})
    layout = _layout("Attempts", "", height=170 + 40 * len(record.attempts))
    layout["yaxis"] = {"autorange": "reversed", "type": "category", "automargin": True}
    layout["hovermode"] = "closest"
    layout["barmode"] = "overlay"
    return Chart("attempts", "Attempts", {"data": bars, "layout": layout})
