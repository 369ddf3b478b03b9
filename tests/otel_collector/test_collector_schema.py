"""otel-collector.yaml against the pinned otelcol-contrib's components and fields.

The collector binary cannot be installed here (no package registry carries it), so the check reads
the committed description of otelcol-contrib 0.159.0 (otelcol-contrib-0.159.0.yaml beside this
file, derived from that release's sources; its header says how) and refuses what that collector
would: a component type it lacks or has deprecated, a field a component does not have, a value of
the wrong kind. Beside that, the properties the deployment relies on: retries that never give up
while the persistent queue has room, a scrape target that is not the collector itself, and a
documented ``docker run`` with the pinned image and a queue volume its user can write.
"""

from __future__ import annotations

import copy
import itertools
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.otel_collector.schema import PINNED_VERSION, Collector, go_duration, problems

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "otel-collector.yaml"
DOCS = REPO / "docs" / "opentelemetry.md"
ENV_REFERENCE = re.compile(r"\$\{env:(?P<name>[A-Za-z_][A-Za-z0-9_]*):-(?P<default>[^}]*)\}")


@pytest.fixture(scope="module")
def collector() -> Collector:
    return Collector.load()


@pytest.fixture(scope="module")
def expanded() -> dict[str, Any]:
    """The configuration as the collector reads it with no variable set: every default applied."""
    text = CONFIG.read_text(encoding="utf-8")
    loaded: dict[str, Any] = yaml.safe_load(ENV_REFERENCE.sub(lambda match: match["default"], text))
    return loaded


def test_the_description_is_of_the_pinned_version(collector: Collector) -> None:
    assert collector.version == PINNED_VERSION
    assert collector.image == f"otel/opentelemetry-collector-contrib:{PINNED_VERSION}"
    assert collector.description["image_user"] == "10001:10001"


def test_the_configuration_has_nothing_the_pinned_collector_refuses(
    expanded: dict[str, Any], collector: Collector
) -> None:
    assert problems(expanded, collector) == []


def _problems_after(
    expanded: dict[str, Any], collector: Collector, change: str
) -> tuple[dict[str, Any], list[str]]:
    config = copy.deepcopy(expanded)
    exporters = config["exporters"]
    if change == "deprecated_exporter_name":
        exporters["otlp/traces"] = exporters.pop("otlp_grpc/traces")
    elif change == "unknown_component_type":
        config["processors"]["batchy"] = {}
    elif change == "unknown_field":
        exporters["otlp_grpc/traces"]["retry_on_failure"]["max_elapsed"] = "10m"
    elif change == "misspelt_nested_field":
        config["extensions"]["file_storage/queue"]["compaction"]["on_startup"] = True
    elif change == "bool_as_text":
        exporters["otlp_grpc/traces"]["tls"]["insecure"] = "yes"
    elif change == "duration_without_unit":
        config["processors"]["batch"]["timeout"] = "10"
    elif change == "deprecated_field":
        exporters["prometheus"]["resource_to_telemetry_conversion"] = {"enabled": False}
    elif change == "unknown_service_field":
        config["service"]["telemetry"]["metrics"]["address"] = "0.0.0.0:8888"
    else:  # pragma: no cover - a typo in the parametrisation below
        raise AssertionError(change)
    return config, problems(config, collector)


@pytest.mark.parametrize(
    ("change", "reported"),
    [
        ("deprecated_exporter_name", "exporters::otlp/traces: 'otlp' is deprecated in otelcol-contrib"),
        ("unknown_component_type", "processors::batchy: no processor type 'batchy'"),
        ("unknown_field", "retry_on_failure: has no field 'max_elapsed'"),
        ("misspelt_nested_field", "compaction: has no field 'on_startup'"),
        ("bool_as_text", "tls::insecure: 'yes' is not a bool"),
        ("duration_without_unit", "processors::batch::timeout: '10' is not a duration"),
        ("deprecated_field", "exporters::prometheus::resource_to_telemetry_conversion: deprecated"),
        ("unknown_service_field", "service::telemetry::metrics: has no field 'address'"),
    ],
)
def test_what_the_pinned_collector_would_refuse_is_reported(
    expanded: dict[str, Any], collector: Collector, change: str, reported: str
) -> None:
    _, found = _problems_after(expanded, collector, change)
    assert any(reported in problem for problem in found), found


def test_retries_never_give_up_while_the_persistent_queue_has_room(expanded: dict[str, Any]) -> None:
    traces_exporters = {
        exporter
        for pipeline_id, pipeline in expanded["service"]["pipelines"].items()
        if pipeline_id.split("/")[0] == "traces"
        for exporter in pipeline["exporters"]
    }
    assert traces_exporters == {"otlp_grpc/traces"}
    exporter = expanded["exporters"]["otlp_grpc/traces"]
    retry = exporter["retry_on_failure"]
    assert retry["enabled"] is True
    assert go_duration(retry["max_elapsed_time"]) == 0, "0 is the collector's 'never stop retrying'"
    initial, longest = go_duration(retry["initial_interval"]), go_duration(retry["max_interval"])
    assert initial is not None
    assert longest is not None
    assert 0 < initial <= longest <= 60, "backoff between attempts stays short once the backend is back"
    queue = exporter["sending_queue"]
    assert queue["enabled"] is True
    assert queue["storage"] in expanded["service"]["extensions"]
    assert queue["storage"].split("/")[0] == "file_storage"
    assert queue["sizer"] == "requests"
    assert queue["queue_size"] > 0
    # When full, refuse at once (the SDK retries) instead of blocking the receiver's callers.
    assert queue.get("block_on_overflow", False) is False
    assert not queue.get("wait_for_result", False), "not supported with a persistent queue"


def test_the_default_scrape_target_is_not_the_collector_itself(expanded: dict[str, Any]) -> None:
    scrape = expanded["receivers"]["prometheus/guarded"]["config"]["scrape_configs"]
    targets = [target for job in scrape for group in job["static_configs"] for target in group["targets"]]
    assert targets
    for target in targets:
        host = target.rsplit(":", 1)[0].strip("[]")
        assert host not in {"localhost", "127.0.0.1", "0.0.0.0", "::1", ""}, (
            f"{target}: inside the collector's container this is the collector itself"
        )


def _docker_commands(text: str) -> list[list[str]]:
    """Every ``docker ...`` command line of the text, continuation lines joined, split as a shell would."""
    joined = re.sub(r"\\\n\s*(#\s*)?", " ", text)
    commands = []
    for line in joined.splitlines():
        line = line.strip().removeprefix("#").strip()
        if line.startswith("docker "):
            commands.append(shlex.split(line, comments=True))
    return commands


def _volumes(command: list[str]) -> dict[str, str]:
    """``-v source:target[:mode]`` options of a docker command, as target -> source."""
    mounts = {}
    for option, value in itertools.pairwise(command):
        if option in {"-v", "--volume"}:
            source, target = value.split(":")[:2]
            mounts[target] = source
    return mounts


def _chowned_volumes(commands: list[list[str]], owner: str) -> set[str]:
    """Volumes that a ``docker run ... chown OWNER PATH`` gives to ``owner``."""
    given = set()
    for command in commands:
        if "chown" not in command:
            continue
        arguments = command[command.index("chown") + 1 :]
        if not arguments or arguments[0] != owner:
            continue
        given |= {source for target, source in _volumes(command).items() if target in arguments[1:]}
    return given


@pytest.mark.parametrize("path", [DOCS, CONFIG], ids=lambda path: path.name)
def test_the_documented_docker_run_pins_the_image_and_gives_its_user_the_queue_volume(
    path: Path, expanded: dict[str, Any], collector: Collector
) -> None:
    text = path.read_text(encoding="utf-8")
    assert "opentelemetry-collector-contrib:latest" not in text
    commands = _docker_commands(text)
    runs = [command for command in commands if collector.image in command]
    assert runs, f"{path.name} runs no {collector.image}"
    queue_directory = expanded["extensions"]["file_storage/queue"]["directory"]
    owner = collector.description["image_user"]
    for run in runs:
        volume = _volumes(run).get(queue_directory)
        assert volume, f"{path.name}: the collector's queue directory is not on a volume"
        assert volume in _chowned_volumes(commands, owner), (
            f"{path.name}: nothing makes volume {volume} writable by the image's user {owner}"
        )
        if "host.docker.internal" in str(expanded["receivers"]["prometheus/guarded"]):
            assert "--add-host=host.docker.internal:host-gateway" in run, path.name
