"""A small typed model of a Grafana dashboard, rendered to the JSON Grafana provisions.

Only what guarded's dashboards use: rows of time series, stat and state-timeline panels whose
queries go to the Prometheus data source chosen by the ``datasource`` template variable, query
variables filled from ``label_values``, and annotations from Prometheus' ``ALERTS`` series.
Panels are laid out left to right in rows of 24 grid units; ids follow the order of the panels,
so the rendered JSON is stable from one run to the next.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

DATASOURCE_VARIABLE = "datasource"
"""The template variable every query's data source refers to."""
PROMETHEUS_REF: Mapping[str, str] = {"type": "prometheus", "uid": "${" + DATASOURCE_VARIABLE + "}"}
"""The data source reference of every panel, target, variable and annotation."""
SCHEMA_VERSION = 39
"""Grafana's dashboard JSON schema version the model renders (Grafana 10.4 and later)."""
GRID_WIDTH = 24

PanelKind = Literal["timeseries", "stat", "state-timeline"]


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL query of a panel; ``legend`` is a Grafana legend format (``{{label}}``)."""

    expr: str
    legend: str = ""
    exemplar: bool = False
    """Ask Prometheus for exemplars (trace ids) alongside the samples; latency panels only."""


@dataclass(frozen=True, slots=True)
class Threshold:
    """Colour ``color`` from ``value`` upwards (``None``: the base colour)."""

    color: str
    value: float | None = None


@dataclass(frozen=True, slots=True)
class ValueText:
    """Show the number ``value`` as ``text`` in ``color`` (state timelines)."""

    value: int
    text: str
    color: str


@dataclass(frozen=True, slots=True)
class SeriesStyle:
    """Style for the series whose display name matches the regular expression ``pattern``."""

    pattern: str
    color: str | None = None
    dashed: bool = False


@dataclass(frozen=True, slots=True)
class Panel:
    """A panel: what it shows (``queries``), how (``kind``, ``unit``) and what to do about it."""

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: PanelKind = "timeseries"
    width: int = 12
    height: int = 8
    stacked: bool = False
    minimum: float | None = 0
    maximum: float | None = None
    decimals: int | None = None
    thresholds: tuple[Threshold, ...] = ()
    value_texts: tuple[ValueText, ...] = ()
    series: tuple[SeriesStyle, ...] = ()

    def __post_init__(self) -> None:
        if not self.queries:
            raise ValueError(f"panel {self.title!r} has no query")
        if not self.description.strip():
            raise ValueError(f"panel {self.title!r} needs a description telling the operator what to do")
        if not 0 < self.width <= GRID_WIDTH:
            raise ValueError(f"panel {self.title!r}: width must be 1..{GRID_WIDTH}, got {self.width}")


@dataclass(frozen=True, slots=True)
class Row:
    """A titled row of panels."""

    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True, slots=True)
class QueryVariable:
    """A multi-value template variable filled by ``label_values(<source>, <label>)``.

    "All" is ``.*`` rather than Grafana's list of the values it found, so a series whose label
    value appeared after the variable was refreshed is still shown.
    """

    name: str
    label: str
    source: str
    """The series selector whose ``label`` values fill the variable (may use earlier variables)."""

    @property
    def query(self) -> str:
        return f"label_values({self.source}, {self.name})"


@dataclass(frozen=True, slots=True)
class AlertAnnotation:
    """Marks on every time series panel when Prometheus alerts matching ``expr`` fire."""

    name: str
    expr: str
    color: str = "red"


@dataclass(frozen=True, slots=True)
class Dashboard:
    """A whole dashboard; :meth:`to_json` gives what Grafana loads."""

    uid: str
    title: str
    description: str
    tags: tuple[str, ...]
    variables: tuple[QueryVariable, ...]
    rows: tuple[Row, ...]
    annotations: tuple[AlertAnnotation, ...] = ()
    default_datasource_uid: str = ""
    default_datasource_name: str = ""
    time_from: str = "now-6h"
    refresh: str = "30s"
    link_tag: str = "guarded"
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < len(self.uid) <= 40:
            raise ValueError(f"dashboard uid must be 1..40 characters, got {self.uid!r}")
        names = [variable.name for variable in self.variables]
        if len(set(names)) != len(names) or DATASOURCE_VARIABLE in names:
            raise ValueError(f"dashboard {self.uid}: duplicate or reserved variable names {names}")

    def to_json(self) -> dict[str, Any]:
        """The dashboard as Grafana's JSON model (``id`` left to Grafana, ``uid`` fixed)."""
        return {
            "annotations": {"list": [_annotation(annotation) for annotation in self.annotations]},
            "description": self.description,
            "editable": True,
            "graphTooltip": 1,
            "id": None,
            "links": [
                {
                    "asDropdown": True,
                    "icon": "external link",
                    "includeVars": True,
                    "keepTime": True,
                    "tags": [self.link_tag],
                    "targetBlank": False,
                    "title": "guarded dashboards",
                    "tooltip": "",
                    "type": "dashboards",
                }
            ],
            "panels": _layout(self.rows),
            "refresh": self.refresh,
            "schemaVersion": SCHEMA_VERSION,
            "tags": list(self.tags),
            "templating": {"list": [self._datasource_variable(), *map(_query_variable, self.variables)]},
            "time": {"from": self.time_from, "to": "now"},
            "timepicker": {},
            "timezone": "browser",
            "title": self.title,
            "uid": self.uid,
            "version": 1,
            **self.extra,
        }

    def _datasource_variable(self) -> dict[str, Any]:
        return {
            "current": {
                "selected": False,
                "text": self.default_datasource_name,
                "value": self.default_datasource_uid,
            },
            "hide": 0,
            "includeAll": False,
            "label": "Prometheus",
            "multi": False,
            "name": DATASOURCE_VARIABLE,
            "options": [],
            "query": "prometheus",
            "refresh": 1,
            "regex": "",
            "type": "datasource",
        }


def _query_variable(variable: QueryVariable) -> dict[str, Any]:
    return {
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "datasource": dict(PROMETHEUS_REF),
        "definition": variable.query,
        "hide": 0,
        "includeAll": True,
        "label": variable.label,
        "multi": True,
        "name": variable.name,
        "options": [],
        "query": variable.query,
        "refresh": 2,
        "regex": "",
        "sort": 1,
        "type": "query",
    }


def _annotation(annotation: AlertAnnotation) -> dict[str, Any]:
    return {
        "datasource": dict(PROMETHEUS_REF),
        "enable": True,
        "expr": annotation.expr,
        "hide": False,
        "iconColor": annotation.color,
        "name": annotation.name,
        "step": "60s",
        "tagKeys": "alertname,store",
        "textFormat": "{{alertname}} firing",
        "titleFormat": "{{alertname}}",
        "useValueForTime": False,
    }


def _layout(rows: tuple[Row, ...]) -> list[dict[str, Any]]:
    """Rows and their panels as Grafana's flat panel list with grid positions and ids."""
    rendered: list[dict[str, Any]] = []
    y = 0
    for row in rows:
        rendered.append(
            {
                "collapsed": False,
                "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                "id": len(rendered) + 1,
                "panels": [],
                "title": row.title,
                "type": "row",
            }
        )
        y += 1
        x = 0
        line_height = 0
        for panel in row.panels:
            if x + panel.width > GRID_WIDTH:
                x, y, line_height = 0, y + line_height, 0
            position = {"h": panel.height, "w": panel.width, "x": x, "y": y}
            rendered.append(_panel(panel, len(rendered) + 1, position))
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return rendered


def _panel(panel: Panel, panel_id: int, position: dict[str, int]) -> dict[str, Any]:
    instant = panel.kind == "stat"
    targets = [
        {
            "datasource": dict(PROMETHEUS_REF),
            "editorMode": "code",
            "exemplar": query.exemplar,
            "expr": query.expr,
            "instant": instant,
            "legendFormat": query.legend,
            "range": not instant,
            "refId": chr(ord("A") + index),
        }
        for index, query in enumerate(panel.queries)
    ]
    defaults: dict[str, Any] = {"unit": panel.unit, "thresholds": _thresholds(panel)}
    if panel.minimum is not None:
        defaults["min"] = panel.minimum
    if panel.maximum is not None:
        defaults["max"] = panel.maximum
    if panel.decimals is not None:
        defaults["decimals"] = panel.decimals
    if panel.value_texts:
        defaults["mappings"] = [
            {
                "options": {
                    str(entry.value): {"color": entry.color, "index": index, "text": entry.text}
                    for index, entry in enumerate(panel.value_texts)
                },
                "type": "value",
            }
        ]
    else:
        defaults["mappings"] = []
    defaults["color"] = {"mode": "thresholds" if panel.kind != "timeseries" else "palette-classic"}
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "fillOpacity": 25 if panel.stacked else 8,
            "lineWidth": 1,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"group": "A", "mode": "normal" if panel.stacked else "none"},
            "thresholdsStyle": {"mode": "line" if panel.thresholds else "off"},
        }
    elif panel.kind == "state-timeline":
        defaults["custom"] = {"fillOpacity": 80, "lineWidth": 0}
    return {
        "datasource": dict(PROMETHEUS_REF),
        "description": panel.description,
        "fieldConfig": {"defaults": defaults, "overrides": [_override(style) for style in panel.series]},
        "gridPos": position,
        "id": panel_id,
        "options": _options(panel),
        "targets": targets,
        "title": panel.title,
        "type": panel.kind,
    }


def _thresholds(panel: Panel) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [
        {"color": step.color, "value": step.value} for step in panel.thresholds if step.value is not None
    ]
    return {"mode": "absolute", "steps": steps}


def _override(style: SeriesStyle) -> dict[str, Any]:
    properties: list[dict[str, Any]] = []
    if style.color is not None:
        properties.append({"id": "color", "value": {"fixedColor": style.color, "mode": "fixed"}})
    if style.dashed:
        properties.append({"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}})
    return {"matcher": {"id": "byRegexp", "options": style.pattern}, "properties": properties}


def _options(panel: Panel) -> dict[str, Any]:
    legend = {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True}
    if panel.kind == "stat":
        return {
            "colorMode": "value",
            "graphMode": "none",
            "justifyMode": "auto",
            "orientation": "auto",
            "percentChangeColorMode": "standard",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showPercentChange": False,
            "textMode": "value_and_name",
            "wideLayout": True,
        }
    if panel.kind == "state-timeline":
        return {
            "alignValue": "left",
            "legend": legend,
            "mergeValues": True,
            "rowHeight": 0.9,
            "showValue": "auto",
            "tooltip": {"mode": "single", "sort": "none"},
        }
    return {
        "legend": {**legend, "calcs": ["mean", "max", "lastNotNull"], "displayMode": "table"},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
