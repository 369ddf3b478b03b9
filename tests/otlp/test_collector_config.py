"""Structural checks of otel-collector.yaml (the collector binary has no Debian package here).

What ``otelcol-contrib validate`` would catch for wiring — a pipeline naming an undefined
component, an extension defined but not enabled — plus the properties the deployment relies on:
memory_limiter first, the traces exporter's persistent queue and retries, environment references
with defaults, no resource attributes turned into metric labels. The embedded Prometheus scrape
configuration is checked by the real ``promtool``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

CONFIG = Path(__file__).resolve().parents[2] / "otel-collector.yaml"
SECTIONS = ("receivers", "processors", "exporters")
PIPELINE_TYPES = {"traces", "metrics", "logs"}
ENV_REFERENCE = re.compile(r"\$\{env:(?P<name>[A-Za-z_][A-Za-z0-9_]*):-(?P<default>[^}]*)\}")


@pytest.fixture(scope="module")
def text() -> str:
    return CONFIG.read_text()


@pytest.fixture(scope="module")
def config(text: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


@pytest.fixture(scope="module")
def expanded(text: str) -> dict[str, Any]:
    """The configuration as the collector sees it with no variable set: every default applied.

    A reference that is a whole YAML value keeps the default's type (``true`` stays a boolean),
    as the collector's typed expansion does.
    """
    loaded: dict[str, Any] = yaml.safe_load(ENV_REFERENCE.sub(lambda match: match["default"], text))
    return loaded


def pipelines(config: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    found: dict[str, dict[str, list[str]]] = config["service"]["pipelines"]
    return found


def component_type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def test_pipelines_reference_only_defined_components_and_use_every_one(config: dict[str, Any]) -> None:
    used: dict[str, set[str]] = {section: set() for section in SECTIONS}
    for pipeline_id, pipeline in pipelines(config).items():
        assert component_type(pipeline_id) in PIPELINE_TYPES, pipeline_id
        assert pipeline["receivers"], f"{pipeline_id} has no receiver"
        assert pipeline["exporters"], f"{pipeline_id} has no exporter"
        for section in SECTIONS:
            for component_id in pipeline.get(section, []):
                assert component_id in config[section], (
                    f"{pipeline_id} uses undefined {section}: {component_id}"
                )
                used[section].add(component_id)
    for section in SECTIONS:
        assert set(config[section]) == used[section], f"{section} defined but in no pipeline"


def test_every_defined_extension_is_enabled_and_every_enabled_one_defined(config: dict[str, Any]) -> None:
    enabled = config["service"]["extensions"]
    assert len(enabled) == len(set(enabled))
    assert set(enabled) == set(config["extensions"])
    assert "health_check" in enabled


def test_memory_limiter_first_and_batch_last_in_every_pipeline(config: dict[str, Any]) -> None:
    for pipeline_id, pipeline in pipelines(config).items():
        processors = pipeline["processors"]
        assert component_type(processors[0]) == "memory_limiter", pipeline_id
        assert component_type(processors[-1]) == "batch", pipeline_id


def test_traces_exporters_queue_on_file_storage_and_retry(config: dict[str, Any]) -> None:
    traces_exporters = {
        exporter
        for pipeline_id, pipeline in pipelines(config).items()
        if component_type(pipeline_id) == "traces"
        for exporter in pipeline["exporters"]
    }
    assert {component_type(exporter) for exporter in traces_exporters} == {"otlp_grpc"}
    for exporter_id in traces_exporters:
        exporter = config["exporters"][exporter_id]
        queue = exporter["sending_queue"]
        assert queue["enabled"] is True
        storage = queue["storage"]
        assert component_type(storage) == "file_storage"
        assert storage in config["service"]["extensions"]
        assert config["extensions"][storage]["directory"]
        retry = exporter["retry_on_failure"]
        assert retry["enabled"] is True
        assert retry["max_elapsed_time"] == "0s"  # never give up; tests/otel_collector checks more
        assert exporter["endpoint"].startswith("${env:")


def test_prometheus_exporter_keeps_resource_attributes_off_labels_and_shows_exemplars(
    config: dict[str, Any],
) -> None:
    exporter = config["exporters"]["prometheus"]
    # Off by default; the deprecated resource_to_telemetry_conversion and its successor unset.
    assert "resource_to_telemetry_conversion" not in exporter
    assert "resource_constant_labels" not in exporter
    assert exporter["enable_open_metrics"] is True  # exemplars need the OpenMetrics format
    assert exporter["metric_expiration"]
    scrubbed = {entry["key"] for entry in config["processors"]["resource/scrub"]["attributes"]}
    assert {"process.command_line", "process.command_args", "process.pid"} <= scrubbed
    for pipeline_id in ("traces", "metrics"):
        assert "resource/scrub" in pipelines(config)[pipeline_id]["processors"]


def test_otlp_receiver_listens_on_the_standard_ports(expanded: dict[str, Any]) -> None:
    protocols = expanded["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    assert protocols["http"]["endpoint"].endswith(":4318")
    assert expanded["extensions"]["health_check"]["endpoint"].endswith(":13133")


def test_every_environment_reference_has_a_default(text: str, expanded: dict[str, Any]) -> None:
    references = list(ENV_REFERENCE.finditer(text))
    assert references
    for match in references:
        assert match["default"].strip(), f"${{env:{match['name']}}} has an empty default"
    # No other form of substitution ($VAR, ${VAR}, ${env:VAR} without default) is left.
    leftover = ENV_REFERENCE.sub("", text)
    assert not re.search(r"(?<!\$)\$(?!\$)", re.sub(r"#.*", "", leftover)), "a $ reference without default"
    assert expanded["exporters"]["otlp_grpc/traces"]["tls"]["insecure"] is True
    assert expanded["exporters"]["otlp_grpc/traces"]["endpoint"] == "tempo:4317"


def test_embedded_scrape_configuration_passes_promtool(expanded: dict[str, Any], tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Prometheus) is part of the test environment"
    scrape = expanded["receivers"]["prometheus/guarded"]["config"]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(scrape))
    checked = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
