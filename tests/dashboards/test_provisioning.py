"""The committed Grafana provisioning files parse, refer to the uids the dashboards use, read their
URLs from Grafana's environment, and are mounted beside the user's own as the docs show."""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from dashboards import build, provisioning
from dashboards.output import DASHBOARDS_DIR, GRAFANA_DIR
from guarded.assets import PROMETHEUS_URL_VARIABLE, TEMPO_URL_VARIABLE
from guarded.observability.call_stats import call_stats

REPO = GRAFANA_DIR.parent


def _load(relative: str) -> dict[str, Any]:
    document = yaml.safe_load((GRAFANA_DIR / relative).read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def _by_uid() -> dict[str, dict[str, Any]]:
    sources = _load(provisioning.DATASOURCES_FILE)
    assert sources["apiVersion"] == 1
    return {source["uid"]: source for source in sources["datasources"]}


def test_the_prometheus_data_source_is_the_dashboards_default() -> None:
    sources = _by_uid()
    for dashboard in build.all_dashboards():
        variable = dashboard["templating"]["list"][0]
        default = variable["current"]["value"]
        assert sources[default]["type"] == "prometheus" == variable["query"], dashboard["uid"]
        assert variable["current"]["text"] == sources[default]["name"]


def test_exemplars_link_to_the_tempo_data_source_by_the_label_guarded_writes() -> None:
    sources = _by_uid()
    prometheus = sources[provisioning.PROMETHEUS_UID]
    (destination,) = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert sources[destination["datasourceUid"]]["type"] == "tempo"

    registry = CollectorRegistry()
    call_stats(registry).series("primary", "load_history", "ok").observe(0.002, "ab" * 16)
    exemplars = [
        sample.exemplar
        for metric in registry.collect()
        for sample in metric.samples
        if sample.exemplar is not None
    ]
    assert exemplars, "guarded's call histogram carries no exemplar"
    assert {label for exemplar in exemplars for label in exemplar.labels} == {destination["name"]}


def test_tempo_links_back_to_prometheus() -> None:
    tempo = _by_uid()[provisioning.TEMPO_UID]
    assert tempo["jsonData"]["tracesToMetrics"]["datasourceUid"] == provisioning.PROMETHEUS_UID


def test_the_data_source_urls_are_grafana_environment_references() -> None:
    """Grafana expands ``$NAME`` / ``${NAME}`` in provisioning values from its environment."""
    sources = _by_uid()
    assert sources[provisioning.PROMETHEUS_UID]["url"] == "${GUARDED_PROMETHEUS_URL}"
    assert sources[provisioning.TEMPO_UID]["url"] == "${GUARDED_TEMPO_URL}"
    text = (GRAFANA_DIR / provisioning.DATASOURCES_FILE).read_text(encoding="utf-8")
    assert "http://" not in text.split("apiVersion:", 1)[1], "a hard-coded URL in the data sources"


def test_the_dashboard_provider_loads_the_generated_directory() -> None:
    providers = _load(provisioning.DASHBOARD_PROVIDER_FILE)
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    path = PurePosixPath(provider["options"]["path"])
    mount = PurePosixPath(provisioning.GRAFANA_MOUNT)
    # grafana/ mounted at GRAFANA_MOUNT, a directory of its own: the provider reads grafana/dashboards/
    assert path.relative_to(mount).as_posix() == DASHBOARDS_DIR
    assert not mount.is_relative_to(provisioning.PROVISIONING_PATH)
    # The two provisioning files are single files for Grafana's own provisioning directories.
    for relative, kind in (
        (provisioning.DASHBOARD_PROVIDER_FILE, "dashboards"),
        (provisioning.DATASOURCES_FILE, "datasources"),
    ):
        assert (GRAFANA_DIR / relative).is_file()
        assert PurePosixPath(relative).parent == PurePosixPath("provisioning", kind)
    files = sorted((GRAFANA_DIR / DASHBOARDS_DIR).glob("*.json"))
    assert [json.loads(file.read_text(encoding="utf-8"))["uid"] for file in files] == sorted(
        dashboard["uid"] for dashboard in build.all_dashboards()
    )


def test_the_docs_show_the_mounts_the_provisioning_expects() -> None:
    """Our files go beside the user's: a directory of their own and one file per provisioning kind,
    never a replacement of Grafana's provisioning directory (``GF_PATHS_PROVISIONING``)."""
    docs = (REPO / "docs" / "dashboards.md").read_text(encoding="utf-8")
    assert f"/grafana:{provisioning.GRAFANA_MOUNT}:ro" in docs
    for relative in (provisioning.DATASOURCES_FILE, provisioning.DASHBOARD_PROVIDER_FILE):
        inside = PurePosixPath(provisioning.PROVISIONING_PATH) / PurePosixPath(relative).relative_to(
            "provisioning"
        )
        assert f"/grafana/{relative}:{inside}:ro" in docs, inside
    assert "GF_PATHS_PROVISIONING=" not in docs
    assert "GF_PATHS_PROVISIONING:" not in docs
    for variable in (PROMETHEUS_URL_VARIABLE, TEMPO_URL_VARIABLE):
        assert variable in docs
    for dashboard in build.all_dashboards():
        assert dashboard["title"] in docs
        for panel in build.panels(dashboard):
            assert panel["title"] in docs, f"docs/dashboards.md does not explain panel {panel['title']!r}"
