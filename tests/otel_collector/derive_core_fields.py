"""Print the field tree of core collector components from their ``config.schema.yaml`` files.

How tests/otel_collector/otelcol-contrib-0.159.0.yaml's core components were derived: run with a
checkout (or bare mirror) of open-telemetry/opentelemetry-collector and the release tag::

    python -m tests.otel_collector.derive_core_fields /path/to/opentelemetry-collector v0.159.0

Each component's schema (``$ref``s to other packages' ``$defs`` resolved, ``allOf`` merged) is
printed as the data file's field notation: a mapping for an object, ``[item]`` for an array, and
``string``/``bool``/``int``/``number``/``duration``/``component_id`` for a value. Not run by the
tests (they read the committed data); kept so the data can be derived again for a new pin.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import yaml

COMPONENTS = {
    ("receivers", "otlp"): "receiver/otlpreceiver",
    ("processors", "memory_limiter"): "processor/memorylimiterprocessor",
    ("processors", "batch"): "processor/batchprocessor",
    ("exporters", "otlp_grpc"): "exporter/otlpexporter",
}
SHARED = {
    # Embedded by contrib components (health_check, the prometheus exporter) at this core version.
    "confighttp_server": "/config/confighttp.server_config",
    "exporterhelper_queue": "/exporter/exporterhelper.queue_batch_config",
}


class Schemas:
    """Reads ``<package>/config.schema.yaml`` at one git revision and resolves references."""

    def __init__(self, repository: str, revision: str) -> None:
        self.repository, self.revision = repository, revision
        self.files: dict[str, dict[str, Any]] = {}

    def file(self, package: str) -> dict[str, Any]:
        if package not in self.files:
            text = subprocess.run(
                ["git", "-C", self.repository, "show", f"{self.revision}:{package}/config.schema.yaml"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            self.files[package] = yaml.safe_load(text)
        return self.files[package]

    def ref(self, package: str, reference: str) -> tuple[str, dict[str, Any]]:
        """The package and schema ``reference`` names, seen from ``package``."""
        if reference.startswith("/"):
            target, _, name = reference[1:].rpartition(".")
        elif reference.startswith("./"):
            target, _, name = reference[2:].rpartition(".")
            target = f"{package}/{target}"
        else:
            target, name = package, reference
        definition: dict[str, Any] = self.file(target)["$defs"][name]
        return target, definition

    def fields(self, package: str, schema: dict[str, Any]) -> Any:
        if "$ref" in schema:
            return self.fields(*self.ref(package, schema["$ref"]))
        kind = schema.get("type")
        if kind == "object" or "allOf" in schema:
            tree: dict[str, Any] = {}
            for part in schema.get("allOf", []):
                tree.update(self.fields(package, part))
            for name, field in schema.get("properties", {}).items():
                tree[name] = self.fields(package, field)
            return dict(sorted(tree.items()))
        if kind == "array":
            return [self.fields(package, schema["items"])]
        if schema.get("format") == "duration":
            return "duration"
        if schema.get("x-customType") == "go.opentelemetry.io/collector/component.ID":
            return "component_id"
        return {"string": "string", "boolean": "bool", "integer": "int", "number": "number"}[kind]


def main(argv: list[str]) -> None:
    repository, revision = argv
    schemas = Schemas(repository, revision)
    tree: dict[str, dict[str, Any]] = {}
    for (section, component), package in COMPONENTS.items():
        tree.setdefault(section, {})[component] = schemas.fields(package, schemas.file(package))
    for name, reference in SHARED.items():
        tree.setdefault("shared", {})[name] = schemas.fields("", {"$ref": reference})
    print(yaml.safe_dump(tree, sort_keys=False, width=100), end="")


if __name__ == "__main__":
    main(sys.argv[1:])
