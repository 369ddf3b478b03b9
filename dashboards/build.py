"""Every dashboard, and their queries with the template variables filled in.

:func:`panel_queries` turns a dashboard's PromQL into what Prometheus can run directly: each
``$variable`` becomes a match-all regular expression (or a value you give) and Grafana's
``$__rate_interval`` a fixed range, so tests can run every panel query against a real Prometheus.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from . import postgres, redis_backend, store_overview, tasks
from .model import DATASOURCE_VARIABLE, Dashboard

MATCH_ALL = ".+"
"""What a template variable becomes by default: any value, but the label must be present."""
DEFAULT_RATE_INTERVAL = "1m"
"""``$__rate_interval`` by default: four 15 s scrapes, Grafana's own minimum for that interval."""

_REFERENCE = re.compile(r"\$(?:\{(?P<braced>\w+)(?::\w+)?\}|(?P<plain>\w+))")


def dashboard_models() -> tuple[Dashboard, ...]:
    """The typed dashboards, in a fixed order."""
    return (store_overview.dashboard(), tasks.dashboard(), postgres.dashboard(), redis_backend.dashboard())


def all_dashboards() -> list[dict[str, Any]]:
    """Every dashboard as the JSON model Grafana provisions."""
    return [model.to_json() for model in dashboard_models()]


def file_name(dashboard: Mapping[str, Any]) -> str:
    """The file a dashboard is written to under ``grafana/dashboards/``: its uid."""
    return f"{dashboard['uid']}.json"


def panels(dashboard: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every panel that queries data (rows left out, panels nested in collapsed rows included)."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def variable_names(dashboard: Mapping[str, Any]) -> list[str]:
    """The dashboard's template variables other than the data source."""
    return [
        variable["name"]
        for variable in dashboard.get("templating", {}).get("list", [])
        if variable["name"] != DATASOURCE_VARIABLE
    ]


def expand(
    expr: str,
    variables: list[str],
    values: Mapping[str, str] | None = None,
    *,
    rate_interval: str = DEFAULT_RATE_INTERVAL,
) -> str:
    """``expr`` with each ``$variable`` replaced by ``values[variable]`` (default :data:`MATCH_ALL`).

    Raises ``ValueError`` for a variable the dashboard does not define, so a typo in a query
    cannot pass as a literal dollar sign.
    """
    chosen = dict.fromkeys(variables, MATCH_ALL) | dict(values or {})
    builtins = {"__rate_interval": rate_interval, "__interval": rate_interval, "__range": rate_interval}

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("plain")
        if name in builtins:
            return builtins[name]
        if name not in chosen:
            raise ValueError(f"{expr!r} uses ${name}, which is not a variable of the dashboard {variables}")
        return chosen[name]

    return _REFERENCE.sub(replace, expr)


def panel_queries(
    dashboard: Mapping[str, Any],
    values: Mapping[str, str] | None = None,
    *,
    rate_interval: str = DEFAULT_RATE_INTERVAL,
) -> list[tuple[str, str]]:
    """``(panel title, PromQL)`` for every query of every panel, variables expanded.

    Each template variable becomes ``.+`` unless ``values`` names it (for instance
    ``{"store": "primary"}``); ``$__rate_interval`` becomes ``rate_interval``.
    """
    variables = variable_names(dashboard)
    return [
        (panel["title"], expand(target["expr"], variables, values, rate_interval=rate_interval))
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]


def annotation_queries(
    dashboard: Mapping[str, Any],
    values: Mapping[str, str] | None = None,
    *,
    rate_interval: str = DEFAULT_RATE_INTERVAL,
) -> list[tuple[str, str]]:
    """``(annotation name, PromQL)`` for every Prometheus annotation, variables expanded."""
    variables = variable_names(dashboard)
    return [
        (annotation["name"], expand(annotation["expr"], variables, values, rate_interval=rate_interval))
        for annotation in dashboard.get("annotations", {}).get("list", [])
        if "expr" in annotation
    ]
