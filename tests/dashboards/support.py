"""Reading the generated dashboards in tests: panels by title, selectors, metric kinds."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator, Mapping
from typing import Any

from dashboards import build
from guarded.observability import telemetry_names as names

SELECTOR = re.compile(r"\b(guarded_\w+)\{([^}]*)\}")
METRIC = re.compile(r"\bguarded_\w+")
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+), (?P<label>\w+)\)$")


def dashboards_by_uid() -> dict[str, dict[str, Any]]:
    return {dashboard["uid"]: dashboard for dashboard in build.all_dashboards()}


def panel_expr(uid: str, title: str, index: int = 0, rate_interval: str = "5m") -> str:
    """The ``index``-th query of the panel ``title``, variables expanded to match-all."""
    queries = build.panel_queries(dashboards_by_uid()[uid], rate_interval=rate_interval)
    titled = [expr for name, expr in queries if name == title]
    if not titled:
        raise KeyError(f"no panel {title!r} in {uid}: {sorted({name for name, _ in queries})}")
    return titled[index]


def raw_expressions(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """``(where, expr)`` of every query before expansion: panels, annotations, variable sources."""
    for panel in build.panels(dashboard):
        for target in panel["targets"]:
            yield f"{dashboard['uid']} panel {panel['title']!r} {target['refId']}", target["expr"]
    for annotation in dashboard["annotations"]["list"]:
        yield f"{dashboard['uid']} annotation {annotation['name']!r}", annotation["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = LABEL_VALUES.match(variable["definition"])
            assert match is not None, (
                f"{dashboard['uid']} variable {variable['name']}: {variable['definition']}"
            )
            yield f"{dashboard['uid']} variable {variable['name']!r}", match["selector"]


def metric_kinds() -> dict[str, str]:
    """Each ``guarded_`` name of telemetry_names and its kind, from the first word of its docstring.

    telemetry_names documents every metric as ``Gauge: ...``, ``Counter: ...`` or ``Histogram ...``;
    a name without such a docstring gets kind ``""``.
    """
    tree = ast.parse(inspect.getsource(names))
    kinds: dict[str, str] = {}
    body = tree.body
    for statement, following in zip(body, [*body[1:], None], strict=True):
        targets = (
            [statement.target] if isinstance(statement, ast.AnnAssign) else getattr(statement, "targets", [])
        )
        if len(targets) != 1 or not isinstance(targets[0], ast.Name):
            continue
        value = getattr(names, targets[0].id, None)
        if not (isinstance(value, str) and value.startswith("guarded_")):
            continue
        doc = ""
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            doc = str(following.value.value)
        first = re.match(r"\s*(Gauge|Counter|Histogram)\b", doc)
        kinds[value] = first[1].lower() if first else ""
    return kinds


def exposed_names() -> dict[str, str]:
    """Every series name Prometheus can hold for telemetry_names' metrics, and where it comes from."""
    exposed: dict[str, str] = {}
    for name, kind in metric_kinds().items():
        if kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                exposed[name + suffix] = f"histogram {name}"
        elif kind == "counter":
            exposed[name if name.endswith("_total") else name + "_total"] = f"counter {name}"
        else:
            exposed[name] = f"{kind or 'metric'} {name}"
    return exposed
