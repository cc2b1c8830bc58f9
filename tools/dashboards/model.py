"""A tiny model of a classic Grafana dashboard: targets, panels, rows, variables.

Why a model rather than dict literals: every target carries what its series need (`ANY`,
`GPU` allocator statistics, or `DCGM` exporter series) next to its PromQL, so the JSON that
Grafana reads and the list of queries a Prometheus test evaluates come from the same
objects and cannot drift. Grid positions and panel ids are computed, never typed in.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

Json = dict[str, Any]
Needs = Literal["any", "gpu", "dcgm"]

SCHEMA_VERSION = 39
DATASOURCE_VAR = "datasource"
DATASOURCE = {"type": "prometheus", "uid": "${" + DATASOURCE_VAR + "}"}
GRID_WIDTH = 24
NEEDS_NOTE: dict[str, str] = {
    "gpu": "Needs GPU allocator statistics (torch.cuda): empty on CPU runs.",
    "dcgm": "Needs NVIDIA dcgm-exporter series, joined to ranks on the GPU UUID: empty without it.",
}
# Grafana's built-in interval variables, with the values a test uses when it substitutes them.
BUILTIN_VALUES: dict[str, str] = {"__rate_interval": "1m", "__range": "1h", "__interval": "15s"}
_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""
    needs: Needs = "any"


@dataclass(frozen=True)
class Panel:
    title: str
    targets: tuple[Target, ...]
    kind: Literal["timeseries", "stat"] = "timeseries"
    unit: str = "short"
    width: int = 12
    height: int = 8
    description: str = ""
    stacked: bool = False
    # Series whose display name matches this regex are drawn dashed and unstacked (e.g. a plan).
    reference_series: str = ""
    min_value: float | None = None
    thresholds: tuple[tuple[float, str], ...] = ()

    @property
    def needs(self) -> Needs:
        """The strongest need of any target: what it takes for the whole panel to show data."""
        order: tuple[Needs, ...] = ("any", "gpu", "dcgm")
        return max((t.needs for t in self.targets), key=order.index, default="any")


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    query: str = ""  # PromQL label_values(...) for query variables; the default for textboxes
    kind: Literal["query", "textbox"] = "query"
    multi: bool = False
    include_all: bool = False
    numeric_sort: bool = False


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    tags: tuple[str, ...]
    variables: tuple[Variable, ...]
    rows: tuple[Row, ...]
    refresh: str = "30s"
    time_from: str = "now-6h"

    def to_json(self) -> Json:
        return {
            "annotations": {"list": [_builtin_annotation()]},
            "description": self.description,
            "editable": True,
            "fiscalYearStartMonth": 0,
            "graphTooltip": 1,
            "id": None,
            "links": [],
            "panels": _layout(self.rows),
            "refresh": self.refresh,
            "schemaVersion": SCHEMA_VERSION,
            "tags": list(self.tags),
            "templating": {"list": [_datasource_variable(), *(_variable(v) for v in self.variables)]},
            "time": {"from": self.time_from, "to": "now"},
            "timepicker": {},
            "timezone": "",
            "title": self.title,
            "uid": self.uid,
            "version": 1,
            "weekStart": "",
        }


class PanelQuery(NamedTuple):
    """One target of one panel, with the template variables substituted."""

    dashboard: str
    panel: str
    ref_id: str
    expr: str
    needs: Needs

    @property
    def needs_gpu(self) -> bool:
        return self.needs != "any"


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace `$name` and `${name}` by `values[name]`; an unknown variable is an error."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(one, expr)


def queries(dashboard: Dashboard, values: Mapping[str, str]) -> Iterator[PanelQuery]:
    for row in dashboard.rows:
        for panel in row.panels:
            for ref_id, target in zip(_ref_ids(), panel.targets, strict=False):
                yield PanelQuery(dashboard.uid, panel.title, ref_id, substitute(target.expr, values), target.needs)


def _ref_ids() -> Iterator[str]:
    yield from "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _layout(rows: tuple[Row, ...]) -> list[Json]:
    """Rows top to bottom, panels left to right, wrapping at the grid width; ids in that order."""
    out: list[Json] = []
    y = 0
    next_id = 1
    for row in rows:
        out.append(
            {
                "collapsed": False,
                "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                "id": next_id,
                "panels": [],
                "title": row.title,
                "type": "row",
            }
        )
        next_id += 1
        y += 1
        x = 0
        line_height = 0
        for panel in row.panels:
            if x + panel.width > GRID_WIDTH:
                x, y, line_height = 0, y + line_height, 0
            out.append(_panel(panel, next_id, {"h": panel.height, "w": panel.width, "x": x, "y": y}))
            next_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return out


def _panel(panel: Panel, panel_id: int, grid: Json) -> Json:
    description = " ".join(part for part in (panel.description, NEEDS_NOTE.get(panel.needs, "")) if part)
    defaults: Json = {"unit": panel.unit, "color": {"mode": "palette-classic"}}
    if panel.min_value is not None:
        defaults["min"] = panel.min_value
    steps: list[Json] = [{"color": "green", "value": None}]
    steps += [{"color": color, "value": value} for value, color in panel.thresholds]
    defaults["thresholds"] = {"mode": "absolute", "steps": steps}
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 20 if panel.stacked else 5,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"group": "A", "mode": "normal" if panel.stacked else "none"},
        }
        options: Json = {
            "legend": {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    else:
        options = {
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": "auto",
        }
    return {
        "datasource": dict(DATASOURCE),
        "description": description,
        "fieldConfig": {"defaults": defaults, "overrides": _overrides(panel)},
        "gridPos": grid,
        "id": panel_id,
        "options": options,
        "targets": [
            {
                "datasource": dict(DATASOURCE),
                "editorMode": "code",
                "expr": target.expr,
                "legendFormat": target.legend or "__auto",
                "range": True,
                "refId": ref_id,
            }
            for ref_id, target in zip(_ref_ids(), panel.targets, strict=False)
        ],
        "title": panel.title,
        "type": panel.kind,
    }


def _overrides(panel: Panel) -> list[Json]:
    if not panel.reference_series:
        return []
    return [
        {
            "matcher": {"id": "byRegexp", "options": panel.reference_series},
            "properties": [
                {"id": "custom.stacking", "value": {"group": "A", "mode": "none"}},
                {"id": "custom.fillOpacity", "value": 0},
                {"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}},
                {"id": "custom.lineWidth", "value": 2},
            ],
        }
    ]


def _builtin_annotation() -> Json:
    return {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }


def _datasource_variable() -> Json:
    return {
        "current": {},
        "hide": 0,
        "includeAll": False,
        "label": "Data source",
        "multi": False,
        "name": DATASOURCE_VAR,
        "options": [],
        "query": "prometheus",
        "refresh": 1,
        "regex": "",
        "type": "datasource",
    }


def _variable(variable: Variable) -> Json:
    if variable.kind == "textbox":
        return {
            "current": {"text": variable.query, "value": variable.query},
            "hide": 0,
            "label": variable.label,
            "name": variable.name,
            "options": [{"selected": True, "text": variable.query, "value": variable.query}],
            "query": variable.query,
            "type": "textbox",
        }
    out: Json = {
        "current": {},
        "datasource": dict(DATASOURCE),
        "definition": variable.query,
        "hide": 0,
        "includeAll": variable.include_all,
        "label": variable.label,
        "multi": variable.multi,
        "name": variable.name,
        "options": [],
        "query": {"query": variable.query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "regex": "",
        "sort": 3 if variable.numeric_sort else 1,
        "type": "query",
    }
    if variable.include_all:
        out["allValue"] = ".*"
    return out
