"""The one factory from plain panel data (model.py) to Grafana dashboard JSON, through
grafana-foundation-sdk (pinned in pyproject.toml to the Grafana 11.6 build: classic JSON with
schemaVersion 41, which Grafana 10 to 12 import).

Every panel gets the same treatment here: the `${datasource}` variable on the panel and on each
query, its unit, a visible legend, an id that is unique in the dashboard, a description. Every
dashboard gets the same variables, time settings and a link menu to the other raypulse
dashboards that keeps the time range and the variables.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

# The 0.0.x SDK warns at import time (Prefer dashboardv2); a stray upgrade must not break the build.
warnings.filterwarnings("ignore", "Prefer using dashboardv2", DeprecationWarning)

from grafana_foundation_sdk.builders import (  # noqa: E402
    bargauge,
    heatmap,
    prometheus,
    stat,
    statetimeline,
    table,
    timeseries,
)
from grafana_foundation_sdk.builders import common as common_builders  # noqa: E402
from grafana_foundation_sdk.builders import dashboard as sdk  # noqa: E402
from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: E402
from grafana_foundation_sdk.models import common  # noqa: E402
from grafana_foundation_sdk.models.dashboard import (  # noqa: E402
    DashboardCursorSync,
    DashboardLinkType,
    DataSourceRef,
    DataTransformerConfig,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMappingResult,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat  # noqa: E402

from dashboards.model import Board, Panel, Target  # noqa: E402
from dashboards.selectors import VARIABLES  # noqa: E402
from exporter.contract.labels import DEFAULT as DEFAULT_LABELS  # noqa: E402
from exporter.contract.labels import LabelContract  # noqa: E402

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
TAG = "raypulse"

# Grafana unit ids used here (Grafana's valueFormats categories); anything else must be "suffix:<text>".
UNITS = frozenset({
    "none", "short", "percent", "percentunit", "bool", "bytes", "decbytes", "Bps", "binBps", "bps", "pps",
    "s", "ms", "dtdurations", "dateTimeAsIso", "dateTimeFromNow", "celsius", "watt", "joule", "hertz",
    "ops", "cps", "iops",
})


def _check_unit(panel: Panel) -> None:
    if panel.unit not in UNITS and not panel.unit.startswith("suffix:"):
        raise ValueError(f"panel {panel.title!r}: unit {panel.unit!r} is neither a Grafana unit id {sorted(UNITS)} "
                         "nor suffix:<text>")


def _query(target: Target, ref_id: str, instant: bool) -> prometheus.Dataquery:
    query = prometheus.Dataquery().expr(target.expr).ref_id(ref_id).datasource(DATASOURCE)
    if target.legend:
        query = query.legend_format(target.legend)
    query = query.instant().format(PromQueryFormat.TABLE) if instant else query.range()
    return query


def _legend() -> common_builders.VizLegendOptions:
    return (common_builders.VizLegendOptions().show_legend(True).display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM))


def _thresholds(panel: Panel) -> sdk.ThresholdsConfig:
    steps = panel.thresholds or ((None, "green"),)
    return sdk.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
        [Threshold(value=value, color=color) for value, color in steps])


def _visualization(panel: Panel) -> Any:
    """The SDK panel builder of the panel's kind, with its kind-specific options."""
    if panel.kind == "timeseries":
        built = (timeseries.Panel().legend(_legend()).fill_opacity(20 if panel.stack else 8).line_width(1)
                 .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                          .sort(common.SortOrder.DESCENDING)))
        if panel.stack:
            built = built.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
        return built
    if panel.kind == "stat":
        return (stat.Panel().graph_mode(common.BigValueGraphMode.AREA).color_mode(common.BigValueColorMode.VALUE)
                .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    if panel.kind == "bargauge":
        return (bargauge.Panel().orientation(common.VizOrientation.HORIZONTAL)
                .display_mode(common.BarGaugeDisplayMode.GRADIENT)
                .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    if panel.kind == "table":
        # An instant table query gives Time, the labels and Value; Time and the scrape's own labels say nothing.
        hidden = {"Time": True, "__name__": True, "job": True, "instance": True, "ray_node_id": True}
        built = table.Panel()
        if len(panel.targets) > 1:  # one table from several queries, joined on their common labels
            built = built.with_transformation(DataTransformerConfig(id_val="merge", options={}))
        return built.with_transformation(DataTransformerConfig(id_val="organize", options={"excludeByName": hidden}))
    if panel.kind == "heatmap":
        return heatmap.Panel().calculate(True).show_legend().hide_y_histogram()
    if panel.kind == "statetimeline":
        return statetimeline.Panel().legend(_legend()).merge_values(True).show_value(common.VisibilityMode.NEVER)
    raise ValueError(f"panel {panel.title!r}: unknown kind {panel.kind!r}")


def build_panel(panel: Panel, panel_id: int) -> Any:
    _check_unit(panel)
    if not panel.targets:
        raise ValueError(f"panel {panel.title!r} has no targets")
    built = (_visualization(panel).id(panel_id).title(panel.title).description(panel.description)
             .datasource(DATASOURCE).unit(panel.unit).height(panel.height).span(panel.width)
             .thresholds(_thresholds(panel)))
    for index, target in enumerate(panel.targets):
        built = built.with_target(_query(target, chr(ord("A") + index), target.instant or panel.kind == "table"))
    if panel.min is not None:
        built = built.min(panel.min)
    if panel.max is not None:
        built = built.max(panel.max)
    if panel.decimals is not None:
        built = built.decimals(panel.decimals)
    if panel.mappings:
        built = built.mappings([ValueMap(options={value: ValueMappingResult(text=text, color=color, index=i)
                                                  for i, (value, text, color) in enumerate(panel.mappings)})])
    if panel.links:
        built = built.data_links([sdk.DashboardLink(link.title).url(link.url) for link in panel.links])
    return built


def _variables(board: Board) -> list[Any]:
    variables: list[Any] = [sdk.DatasourceVariable("datasource").label("Data source").type("prometheus")]
    for name in board.variables:
        variable = VARIABLES[name]
        variables.append(
            sdk.QueryVariable(name).label(variable.label).description(variable.description).datasource(DATASOURCE)
            .query(variable.query).refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC).multi(True).include_all(True)
            .all_value(".*"))  # .* not .+: a series without the label (a job with no submission id) still shows
    return variables


def build(board: Board, labels: LabelContract = DEFAULT_LABELS) -> dict[str, Any]:
    """The dashboard as a JSON-ready dict. The boards spell the default label names; `labels` (the
    label contract, exporter/contract/labels.py) renames them in every query, variable, legend and link."""
    dashboard = (sdk.Dashboard(board.title).uid(board.uid).description(board.description)
                 .tags([TAG, *board.tags]).readonly().tooltip(DashboardCursorSync.CROSSHAIR)
                 .time("now-1h", "now").refresh("30s").timezone("browser")
                 .link(sdk.DashboardLink("raypulse dashboards").type(DashboardLinkType.DASHBOARDS).tags([TAG])
                       .as_dropdown(True).include_vars(True).keep_time(True)))
    for variable in _variables(board):
        dashboard = dashboard.with_variable(variable)
    panel_id = 0
    for row in board.rows:
        panel_id += 1
        row_builder = sdk.Row(row.title).id(panel_id).collapsed(row.collapsed)
        children = []
        for panel in row.panels:
            panel_id += 1
            children.append(build_panel(panel, panel_id))
        if row.collapsed:  # Grafana keeps a collapsed row's panels inside it
            for child in children:
                row_builder = row_builder.with_panel(child)
            dashboard = dashboard.with_row(row_builder)
        else:  # an open row is a marker; its panels follow it at the top level
            dashboard = dashboard.with_row(row_builder)
            for child in children:
                dashboard = dashboard.with_panel(child)
    built = json.loads(JSONEncoder().encode(dashboard.build()))
    _layout(built["panels"])
    return built if labels.is_default else labels.dashboard(built)


def _layout(panels: list[dict[str, Any]]) -> None:
    """Place panels left to right, starting a new line when the next one does not fit (the SDK
    only wraps after a line overflows). A collapsed row's panels are placed as they will be
    when it is expanded, below the row."""
    y = 0

    def place(items: list[dict[str, Any]], top: int) -> int:
        x, line_height = 0, 0
        for item in items:
            grid = item["gridPos"]
            if x + grid["w"] > 24:
                top, x, line_height = top + line_height, 0, 0
            grid["x"], grid["y"] = x, top
            x += grid["w"]
            line_height = max(line_height, grid["h"])
        return top + line_height

    pending: list[dict[str, Any]] = []  # panels of the open row being filled
    for panel in panels:
        if panel["type"] != "row":
            pending.append(panel)
            continue
        y = place(pending, y)
        pending = []
        panel["gridPos"] = {"h": 1, "w": 24, "x": 0, "y": y}
        y += 1
        if panel.get("collapsed"):
            place(panel["panels"], y)
    place(pending, y)


def render(board: Board, labels: LabelContract = DEFAULT_LABELS) -> str:
    """The committed file's text (with the default label contract): stable key order, one trailing newline."""
    return json.dumps(build(board, labels), indent=2, sort_keys=True) + "\n"
