"""The committed Grafana provisioning files parse and refer to the uids the dashboards use."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from dashboards import build, provisioning
from dashboards.output import DASHBOARDS_DIR, GRAFANA_DIR
from guarded.call_stats import call_stats

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
    assert tempo["url"].startswith("http://")


def test_the_dashboard_provider_loads_the_generated_directory() -> None:
    providers = _load(provisioning.DASHBOARD_PROVIDER_FILE)
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    path = PurePosixPath(provider["options"]["path"])
    mount = PurePosixPath(provisioning.GRAFANA_MOUNT)
    # grafana/ mounted at GRAFANA_MOUNT: the provider reads grafana/dashboards/ ...
    assert path.relative_to(mount).as_posix() == DASHBOARDS_DIR
    # ... and GF_PATHS_PROVISIONING points at grafana/provisioning/, where these files are.
    provisioning_dir = PurePosixPath(provisioning.PROVISIONING_PATH).relative_to(mount).as_posix()
    assert (
        GRAFANA_DIR / provisioning_dir / "dashboards" / Path(provisioning.DASHBOARD_PROVIDER_FILE).name
    ).is_file()
    assert (
        GRAFANA_DIR / provisioning_dir / "datasources" / Path(provisioning.DATASOURCES_FILE).name
    ).is_file()
    files = sorted((GRAFANA_DIR / DASHBOARDS_DIR).glob("*.json"))
    assert [json.loads(file.read_text(encoding="utf-8"))["uid"] for file in files] == sorted(
        dashboard["uid"] for dashboard in build.all_dashboards()
    )


def test_the_docs_show_the_mounts_the_provisioning_expects() -> None:
    docs = (REPO / "docs" / "dashboards.md").read_text(encoding="utf-8")
    assert f":{provisioning.GRAFANA_MOUNT}" in docs
    assert f"GF_PATHS_PROVISIONING={provisioning.PROVISIONING_PATH}" in docs
    for dashboard in build.all_dashboards():
        assert dashboard["title"] in docs
        for panel in build.panels(dashboard):
            assert panel["title"] in docs, f"docs/dashboards.md does not explain panel {panel['title']!r}"
