"""Every query names real metrics, filters on the template variables and uses the data source
variable; uids, ids and layout are stable and valid."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from dashboards import build
from dashboards.model import DATASOURCE_VARIABLE, GRID_WIDTH, PROMETHEUS_REF
from dashboards.provisioning import PROMETHEUS_UID
from guarded.observability import telemetry_names as names

from .support import METRIC, SELECTOR, dashboards_by_uid, exposed_names, raw_expressions

EXPECTED_UIDS = {"guarded-store-overview", "guarded-tasks", "guarded-postgres", "guarded-redis"}
"""Links and bookmarks point at these: changing one breaks them."""
DASHBOARDS = build.all_dashboards()
IDS = [dashboard["uid"] for dashboard in DASHBOARDS]


def _query_variables(dashboard: dict[str, Any]) -> list[str]:
    return [variable["name"] for variable in dashboard["templating"]["list"] if variable["type"] == "query"]


def test_uids_are_the_fixed_ones_and_unique() -> None:
    assert sorted(IDS) == sorted(EXPECTED_UIDS)
    assert len({build.file_name(dashboard) for dashboard in DASHBOARDS}) == len(DASHBOARDS)
    assert build.all_dashboards() == DASHBOARDS


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=IDS)
def test_every_metric_a_query_names_is_a_telemetry_name(dashboard: dict[str, Any]) -> None:
    known = exposed_names()
    unknown = [
        f"{where}: {metric}"
        for where, expr in raw_expressions(dashboard)
        for metric in METRIC.findall(expr)
        if metric not in known
    ]
    assert not unknown, "not a series of guarded/observability/telemetry_names.py:\n" + "\n".join(unknown)


def test_the_name_check_catches_a_misspelt_or_mis_suffixed_metric() -> None:
    known = exposed_names()
    assert f"{names.CALL_DURATION}_bucket" in known
    assert f"{names.CALLS}_total" in known
    for wrong in (
        names.CALLS,
        f"{names.BATCH_PENDING}_total",
        f"{names.CALLS}_bucket",
        "guarded_store_call_total",
    ):
        assert wrong not in known, wrong


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=IDS)
def test_every_selector_filters_on_every_template_variable(dashboard: dict[str, Any]) -> None:
    variables = _query_variables(dashboard)
    assert "instance" in variables
    expected = {f'{name}=~"${name}"' for name in variables}
    for where, expr in raw_expressions(dashboard):
        if where.split()[1] != "panel":
            continue
        selectors = SELECTOR.findall(expr)
        assert len(selectors) == len(METRIC.findall(expr)), (
            f"{where}: a metric without a label filter: {expr}"
        )
        for metric, matchers in selectors:
            present = {matcher.strip() for matcher in matchers.split(",")}
            assert expected <= present, f"{where}: {metric} lacks {sorted(expected - present)}"


def test_store_dashboards_filter_on_store_and_tasks_on_instance_only() -> None:
    by_uid = dashboards_by_uid()
    assert _query_variables(by_uid["guarded-store-overview"]) == ["instance", names.LABEL_STORE]
    assert _query_variables(by_uid["guarded-postgres"]) == ["instance", names.LABEL_STORE, names.LABEL_SCHEMA]
    assert _query_variables(by_uid["guarded-redis"]) == ["instance", names.LABEL_STORE]
    # Task metrics carry no store label (telemetry_names.TASK_EVENTS): filtering on one would empty them.
    assert _query_variables(by_uid["guarded-tasks"]) == ["instance"]


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=IDS)
def test_variables_are_multi_value_with_all_and_chained(dashboard: dict[str, Any]) -> None:
    variables = dashboard["templating"]["list"]
    source = variables[0]
    assert source["name"] == DATASOURCE_VARIABLE
    assert source["type"] == "datasource"
    assert source["query"] == "prometheus"
    assert source["current"]["value"] == PROMETHEUS_UID
    earlier: list[str] = []
    for variable in variables[1:]:
        assert variable["type"] == "query"
        assert variable["multi"]
        assert variable["includeAll"]
        assert variable["allValue"] == ".*"
        assert variable["definition"].startswith("label_values(")
        assert variable["definition"].endswith(f", {variable['name']})")
        assert variable["query"] == variable["definition"]
        for name in earlier:
            assert f'{name}=~"${name}"' in variable["definition"], (variable["name"], name)
        earlier.append(variable["name"])


def _datasource_refs(node: Any, path: str = "") -> list[tuple[str, Any]]:
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                found.append((f"{path}.{key}", value))
            found += _datasource_refs(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _datasource_refs(value, f"{path}[{index}]")
    return found


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=IDS)
def test_every_datasource_reference_is_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    refs = _datasource_refs(dashboard)
    targets = sum(len(panel["targets"]) for panel in build.panels(dashboard))
    assert len(refs) >= targets
    wrong = [(path, ref) for path, ref in refs if ref != dict(PROMETHEUS_REF)]
    assert not wrong
    assert PROMETHEUS_REF["uid"] == "${" + DATASOURCE_VARIABLE + "}"


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=IDS)
def test_annotations_show_guarded_alerts_of_the_selected_stores(dashboard: dict[str, Any]) -> None:
    annotations = dashboard["annotations"]["list"]
    assert annotations
    for annotation in annotations:
        alertnames = re.search(r'alertname=~"([^"]+)"', annotation["expr"])
        assert alertnames is not None
        assert set(alertnames[1].split("|")) <= set(names.ALERT_NAMES)
        assert 'alertstate="firing"' in annotation["expr"]
        if names.LABEL_STORE in _query_variables(dashboard):
            assert f'{names.LABEL_STORE}=~"${names.LABEL_STORE}"' in annotation["expr"]


def test_the_overview_annotates_pause_save_and_load_alerts() -> None:
    overview = dashboards_by_uid()["guarded-store-overview"]
    exprs = " ".join(annotation["expr"] for annotation in overview["annotations"]["list"])
    for alert in (names.ALERT_PAUSE_SAVE_FAILED, names.ALERT_PAUSE_LOAD_FAILED, names.ALERT_CIRCUIT_OPEN):
        assert alert in exprs


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=IDS)
def test_panels_are_described_with_units_and_laid_out_without_overlap(dashboard: dict[str, Any]) -> None:
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    assert ids == list(range(1, len(panels) + 1))
    occupied: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= GRID_WIDTH, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & occupied, f"{panel['title']} overlaps another panel"
        occupied |= cells
    for panel in build.panels(dashboard):
        assert len(panel["description"]) >= 60, panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        assert panel["targets"], panel["title"]


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=IDS)
def test_latency_panels_are_in_seconds_with_exemplars(dashboard: dict[str, Any]) -> None:
    latency = [
        panel
        for panel in build.panels(dashboard)
        if any(
            re.search(r"histogram_quantile\(.*_seconds_bucket", target["expr"]) for target in panel["targets"]
        )
    ]
    assert latency
    for panel in latency:
        assert panel["fieldConfig"]["defaults"]["unit"] == "s", panel["title"]
        assert all(target["exemplar"] for target in panel["targets"]), panel["title"]


def test_every_required_signal_has_a_panel() -> None:
    by_uid = dashboards_by_uid()
    used = {
        uid: " ".join(target["expr"] for panel in build.panels(dashboard) for target in panel["targets"])
        for uid, dashboard in by_uid.items()
    }
    overview = (
        names.CALLS,
        names.CALL_DURATION,
        names.RETRIES,
        names.CIRCUIT_STATE,
        names.CIRCUIT_TRANSITIONS,
        names.DLQ_DEPTH,
        names.DLQ_OLDEST_AGE,
        names.DLQ_DROPPED,
        names.DLQ_PARKED_DEPTH,
        names.BATCH_SIZE,
        names.BATCH_FLUSH_DURATION,
        names.BATCH_PENDING,
        names.STALE_ENTRIES,
        names.MEMORY_HEALTH_KEYS,
    )
    tasks = (names.TASK_EVENTS, names.TASK_DURATION, names.TASKS_IN_FLIGHT)
    for uid, metrics in (
        ("guarded-store-overview", overview),
        ("guarded-tasks", tasks),
        ("guarded-postgres", names.PG_METRIC_NAMES),
        ("guarded-redis", names.REDIS_METRIC_NAMES),
    ):
        missing = [metric for metric in metrics if metric not in used[uid]]
        assert not missing, f"{uid} has no panel for {missing}"
    kinds = {panel["title"]: panel["type"] for panel in build.panels(by_uid["guarded-store-overview"])}
    assert kinds["Circuit state"] == "state-timeline"


def test_panel_queries_expand_every_variable() -> None:
    for dashboard in DASHBOARDS:
        queries = build.panel_queries(dashboard)
        assert len(queries) == sum(len(panel["targets"]) for panel in build.panels(dashboard))
        assert all("$" not in expr for _, expr in queries)
        assert all("[1m]" in expr for _, expr in queries if "rate(" in expr or "increase(" in expr)
    overview = dashboards_by_uid()["guarded-store-overview"]
    chosen = build.panel_queries(overview, {"store": "primary"}, rate_interval="30s")
    assert all('store=~"primary"' in expr and 'instance=~".+"' in expr for _, expr in chosen)
    assert any("[30s]" in expr for _, expr in chosen)


def test_expand_understands_grafana_variable_forms_and_refuses_unknown_ones() -> None:
    assert (
        build.expand('x{a=~"${a:regex}", b=~"$b"}[$__rate_interval]', ["a", "b"]) == 'x{a=~".+", b=~".+"}[1m]'
    )
    with pytest.raises(ValueError, match=r"\$typo"):
        build.expand('x{a=~"$typo"}', ["a"])


def test_no_metric_name_is_spelt_out_in_the_dashboard_code() -> None:
    package = Path(build.__file__).parent
    literals = []
    for module in sorted(package.glob("*.py")):
        if module.name == "alerts.py":  # another module's own business
            continue
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "guarded_" in node.value:
                literals.append(f"{module.name}:{node.lineno}: {node.value!r}")
    assert not literals, "use guarded.observability.telemetry_names constants:\n" + "\n".join(literals)
