"""The committed dashboards type-check against Grafana's own ``@grafana/schema``.

Each grafana/dashboards/*.json is written as a TypeScript object literal typed
``GuardedDashboard`` (tools/grafana-schema/guarded-dashboard.ts: the schema's Dashboard, Panel,
FieldConfig and VariableModel types, each panel plugin's own Options and FieldConfig, and the
Prometheus plugin's query fields listed explicitly) and ``tsc --strict --noEmit`` checks them. An
object literal gets TypeScript's excess-property check, so an unknown field fails as well as a
missing required one, a wrong type or a value outside an enum.

``make tools`` installs the pinned TypeScript and @grafana/schema (scripts/ensure-node-tools.sh,
``npm ci`` in tools/grafana-schema); run it when the check says they are missing.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools" / "grafana-schema"
MODEL = TOOLS / "guarded-dashboard.ts"
DASHBOARDS = sorted((REPO / "grafana" / "dashboards").glob("*.json"))
TSC_ERROR = re.compile(r"^(?P<file>[^(\s]+\.ts)\(\d+,\d+\): error (?P<code>TS\d+): (?P<message>.*)$")


def _tsc() -> Path:
    tsc = TOOLS / "node_modules" / "typescript" / "bin" / "tsc"
    missing = "TypeScript and @grafana/schema are part of the test environment: run `make tools` "
    missing += "(scripts/ensure-node-tools.sh installs them into tools/grafana-schema/node_modules)"
    assert shutil.which("node"), missing
    assert tsc.is_file(), missing
    return tsc


def _installed_version(package: str) -> str:
    manifest = TOOLS / "node_modules" / package / "package.json"
    version: str = json.loads(manifest.read_text(encoding="utf-8"))["version"]
    return version


def _type_check(directory: Path, dashboards: dict[str, Any]) -> dict[str, list[str]]:
    """``tsc --strict`` over one file per dashboard; the errors found, by dashboard name."""
    files = []
    for name, dashboard in dashboards.items():
        source = directory / f"{name}.ts"
        source.write_text(
            f"import type {{ GuardedDashboard }} from {json.dumps(str(MODEL.with_suffix('')))};\n\n"
            f"export const dashboard: GuardedDashboard = {json.dumps(dashboard, indent=2)};\n",
            encoding="utf-8",
        )
        files.append(source.name)
    options = {
        "strict": True,
        "exactOptionalPropertyTypes": True,
        "noUncheckedIndexedAccess": True,
        "noEmit": True,
        "target": "es2022",
        "module": "esnext",
        "moduleResolution": "bundler",
        "types": [],
    }
    (directory / "tsconfig.json").write_text(
        json.dumps({"compilerOptions": options, "files": files}), encoding="utf-8"
    )
    result = subprocess.run(
        ["node", str(_tsc()), "--project", str(directory / "tsconfig.json"), "--pretty", "false"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    errors: dict[str, list[str]] = {name: [] for name in dashboards}
    unparsed = []
    for line in result.stdout.splitlines():
        if line.startswith(" "):  # continuation of the previous error's message
            continue
        match = TSC_ERROR.match(line)
        if match is None or Path(match["file"]).stem not in errors:
            unparsed.append(line)  # e.g. an error in guarded-dashboard.ts or in the schema itself
            continue
        errors[Path(match["file"]).stem].append(f"{match['code']}: {match['message']}")
    assert not unparsed, "tsc printed something other than errors in a dashboard:\n" + result.stdout
    assert not result.stderr, result.stderr
    assert (result.returncode == 0) == (not any(errors.values())), result.stdout
    return errors


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    assert DASHBOARDS, "no dashboards in grafana/dashboards"
    return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in DASHBOARDS}


def test_the_pinned_tool_versions_are_installed() -> None:
    lock = json.loads((TOOLS / "package-lock.json").read_text(encoding="utf-8"))["packages"]
    _tsc()
    for package in ("@grafana/schema", "typescript"):
        assert _installed_version(package) == lock[f"node_modules/{package}"]["version"], package
    assert _installed_version("@grafana/schema").startswith("13."), "the check targets Grafana 13"


def _first_panel(dashboard: dict[str, Any], kind: str) -> dict[str, Any]:
    panel: dict[str, Any] = next(p for p in dashboard["panels"] if p["type"] == kind)
    return panel


def _broken(dashboard: dict[str, Any], how: str) -> dict[str, Any]:
    broken = copy.deepcopy(dashboard)
    if how == "unknown_panel_field":
        _first_panel(broken, "timeseries")["colour"] = "red"
    elif how == "draw_style_outside_enum":
        _first_panel(broken, "timeseries")["fieldConfig"]["defaults"]["custom"]["drawStyle"] = "lines"
    elif how == "unknown_target_field":
        _first_panel(broken, "timeseries")["targets"][0]["expression"] = "up"
    elif how == "link_missing_required_field":
        del broken["links"][0]["icon"]
    elif how == "stat_option_of_another_plugin":
        _first_panel(broken, "stat")["options"]["legend"] = {"showLegend": True}
    elif how == "threshold_value_as_text":
        steps = _first_panel(broken, "timeseries")["fieldConfig"]["defaults"]["thresholds"]["steps"]
        steps[0]["value"] = "0"
    elif how == "query_to_another_data_source_type":
        _first_panel(broken, "timeseries")["targets"][0]["datasource"] = {"type": "loki", "uid": "logs"}
    elif how == "schema_version_as_text":
        broken["schemaVersion"] = str(broken["schemaVersion"])
    else:  # pragma: no cover - a typo in the parametrisation below
        raise AssertionError(how)
    return broken


BREAKAGES = (
    "unknown_panel_field",
    "draw_style_outside_enum",
    "unknown_target_field",
    "link_missing_required_field",
    "stat_option_of_another_plugin",
    "threshold_value_as_text",
    "query_to_another_data_source_type",
    "schema_version_as_text",
)


@pytest.fixture(scope="module")
def checked(committed: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """One ``tsc`` run over every committed dashboard and, as ``broken-<how>``, each kind of
    mistake made in a copy of a real dashboard; the errors found, by name."""
    base = next(
        dashboard
        for dashboard in committed.values()
        if {"timeseries", "stat"} <= {panel["type"] for panel in dashboard["panels"]}
    )
    broken = {f"broken-{how}": _broken(base, how) for how in BREAKAGES}
    return _type_check(tmp_path_factory.mktemp("grafana-schema"), committed | broken)


def test_every_committed_dashboard_matches_grafanas_schema(
    committed: dict[str, Any], checked: dict[str, list[str]]
) -> None:
    found = {name: checked[name] for name in committed if checked[name]}
    assert not found, "dashboards that do not match @grafana/schema:\n" + json.dumps(found, indent=2)


def test_a_dashboard_that_stops_matching_the_schema_fails_the_check(checked: dict[str, list[str]]) -> None:
    """Each kind of mistake is reported for the copy that has it."""
    errors = {how: checked[f"broken-{how}"] for how in BREAKAGES}
    for how, messages in errors.items():
        assert messages, f"tsc accepted a dashboard with {how.replace('_', ' ')}"
    expected = {
        "unknown_panel_field": ('"colour"', "does not exist in type 'TimeSeriesPanel'"),
        "draw_style_outside_enum": ('"lines"', "is not assignable"),
        "unknown_target_field": ('"expression"', "does not exist in type 'PrometheusQuery'"),
        "link_missing_required_field": ("'icon' is missing",),
        "stat_option_of_another_plugin": ('"legend"', "does not exist"),
        "threshold_value_as_text": ("'string' is not assignable to type 'number'",),
        "query_to_another_data_source_type": ('"loki"', '"prometheus"'),
        "schema_version_as_text": ("'string' is not assignable to type 'number'",),
    }
    for how, fragments in expected.items():
        assert any(all(part in message for part in fragments) for message in errors[how]), (how, errors[how])
