"""Dashboards as plain data: a Board has Rows of Panels, a Panel has Targets (PromQL + legend).

This is Ray's habit (`dashboards/common.py`: `Panel(title, unit, targets=[Target(expr, legend)])`):
panels say what to show, and one builder (builder.py) turns every one of them into Grafana JSON
the same way, so units, legends, datasources and ids cannot drift from panel to panel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["timeseries", "stat", "table", "heatmap", "bargauge", "statetimeline"]


@dataclass(frozen=True)
class Target:
    """One PromQL query. `legend` is Grafana's legendFormat (`{{node}} GPU {{gpu}}`)."""

    expr: str
    legend: str = ""
    instant: bool = False  # tables and stats show the latest value, not a range


@dataclass(frozen=True)
class Link:
    """A data link on a panel's series: `url` may use `${__field.labels.<label>}`."""

    title: str
    url: str


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str  # a Grafana unit id (builder.UNITS) or "suffix:<text>"
    targets: tuple[Target, ...]
    description: str
    kind: Kind = "timeseries"
    width: int = 8
    height: int = 8
    min: float | None = None
    max: float | None = None
    stack: bool = False
    decimals: int | None = None
    # (value, color) steps; the first value is None (the base colour)
    thresholds: tuple[tuple[float | None, str], ...] = ()
    mappings: tuple[tuple[str, str, str], ...] = ()  # (value, text, colour) for enums and states
    links: tuple[Link, ...] = ()


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]
    collapsed: bool = True


@dataclass(frozen=True)
class Board:
    uid: str
    title: str
    description: str
    variables: tuple[str, ...]  # names from selectors.VARIABLES, in display order
    rows: tuple[Row, ...]
    tags: tuple[str, ...] = field(default=())

    @property
    def panels(self) -> list[Panel]:
        return [panel for row in self.rows for panel in row.panels]
