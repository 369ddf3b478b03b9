"""Checks a collector configuration against the committed description of a pinned collector.

The description (``otelcol-contrib-<version>.yaml`` beside this module) lists, for the components
otel-collector.yaml uses, the component types the pinned otelcol-contrib has and the names and
value kinds of their fields; its header says where each part comes from. :func:`problems` is what
``otelcol-contrib validate`` reports about unknown components and fields, without the binary.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
PINNED_VERSION = "0.159.0"
DESCRIPTION = HERE / f"otelcol-contrib-{PINNED_VERSION}.yaml"
SECTIONS = ("extensions", "receivers", "processors", "exporters")
GO_DURATION = re.compile(
    r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h))*$"
)
COMPONENT_ID = re.compile(r"^[a-zA-Z][0-9a-zA-Z_]*(/[^/\s]+)?$")


@dataclass(frozen=True)
class Collector:
    """The pinned collector as the description file records it."""

    description: Mapping[str, Any]

    @classmethod
    def load(cls, path: Path = DESCRIPTION) -> Collector:
        return cls(yaml.safe_load(path.read_text(encoding="utf-8")))

    @property
    def version(self) -> str:
        return str(self.description["version"])

    @property
    def image(self) -> str:
        return str(self.description["image"])

    def component(self, section: str, component_type: str) -> Mapping[str, Any] | None:
        found: Mapping[str, Any] | None = self.description["components"][section].get(component_type)
        return found

    def replacement(self, section: str, component_type: str) -> str | None:
        """The current name of a deprecated component type, None when it is not deprecated."""
        renamed: str | None = self.description["deprecated_types"].get(section, {}).get(component_type)
        return renamed


def component_type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def go_duration(value: object) -> float | None:
    """Seconds of a Go duration as the collector reads one (text like ``1m30s``, or ``0``)."""
    if value == 0 or value == "0":
        return 0.0
    if not isinstance(value, str) or not GO_DURATION.match(value):
        return None
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(
        float(number) * units[unit] for number, unit in re.findall(r"([0-9.]+)(ns|us|µs|ms|s|m|h)", value)
    )


def _kind_problem(kind: str, value: object) -> str | None:
    if kind == "any":
        return None
    if kind == "string":
        ok = isinstance(value, str)
    elif kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "number":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind == "duration":
        ok = go_duration(value) is not None
    elif kind == "component_id":
        ok = isinstance(value, str) and bool(COMPONENT_ID.match(value))
    else:
        raise ValueError(f"unknown kind {kind!r} in {DESCRIPTION.name}")
    return None if ok else f"{value!r} is not a {kind}"


def _fields(collector: Collector, spec: Mapping[str, Any]) -> dict[str, Any]:
    """An object's fields with its ``$embed``-ded shared objects merged in."""
    merged: dict[str, Any] = {}
    for shared in spec.get("$embed", []):
        merged.update(_fields(collector, collector.description["shared"][shared]))
    merged.update({name: field for name, field in spec.items() if name != "$embed"})
    return merged


def _check(collector: Collector, spec: Any, value: object, path: str) -> list[str]:
    if isinstance(spec, str):
        problem = _kind_problem(spec, value)
        return [f"{path}: {problem}"] if problem else []
    if isinstance(spec, list):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {value!r}"]
        return [
            problem
            for index, item in enumerate(value)
            for problem in _check(collector, spec[0], item, f"{path}[{index}]")
        ]
    if value is None:  # an empty section ("batch:") is the component's defaults
        return []
    if not isinstance(value, Mapping):
        return [f"{path}: expected a mapping, got {value!r}"]
    if "$any_keys" in spec:
        return [
            problem
            for key, item in value.items()
            for problem in _check(collector, spec["$any_keys"], item, f"{path}::{key}")
        ]
    fields = _fields(collector, spec)
    found = []
    for key, item in value.items():
        if key not in fields:
            known = ", ".join(sorted(fields))
            found.append(
                f"{path}: has no field {key!r} in otelcol-contrib {collector.version} (known: {known})"
            )
            continue
        found += _check(collector, fields[key], item, f"{path}::{key}")
    return found


def problems(config: Mapping[str, Any], collector: Collector) -> list[str]:
    """What the pinned collector would refuse or warn about in ``config``; empty when nothing.

    ``config`` is the configuration as the collector reads it: ``${env:...}`` references
    replaced by their values.
    """
    found: list[str] = []
    pinned = f"otelcol-contrib {collector.version}"
    known_sections = {*SECTIONS, "connectors", "service"}
    found += [
        f"{key}: not a top-level section of a collector configuration"
        for key in config
        if key not in known_sections
    ]
    for section in SECTIONS:
        for component_id, settings in (config.get(section) or {}).items():
            kind = component_type(component_id)
            renamed = collector.replacement(section, kind)
            if renamed is not None:
                found.append(
                    f"{section}::{component_id}: {kind!r} is deprecated in {pinned}, use {renamed!r}"
                )
                continue
            component = collector.component(section, kind)
            if component is None:
                found.append(
                    f"{section}::{component_id}: no {section[:-1]} type {kind!r} described for {pinned}"
                )
                continue
            found += _check(collector, component["fields"], settings, f"{section}::{component_id}")
            for field in component.get("deprecated_fields", []):
                if isinstance(settings, Mapping) and field in settings:
                    found.append(f"{section}::{component_id}::{field}: deprecated in {pinned}")
    found += _check(collector, collector.description["service"], config.get("service"), "service")
    return found
