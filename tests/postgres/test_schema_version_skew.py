"""Schema-version skew on real PostgreSQL: the gauges a store sets when it connects, and the alert
promtool evaluates on them.

An old process connects and migrates the schema to the version its code knows; a newer release
(one more migration) connects later and migrates the schema past it. The old process keeps running:
its ``guarded_pg_schema_expected_version`` is now below the schema's newest
``guarded_pg_schema_version``, which is what ``GuardedSchemaVersionSkew`` fires on.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dashboards import alerts
from guarded.backends.postgres import schema_migrations
from guarded.backends.postgres.schema_migrations import Migration, latest_version, load_migrations
from guarded.observability import telemetry_names as names
from tests.alerts import promtool_cases as cases

from .conftest import StoreFactory

REPO = Path(__file__).resolve().parents[2]
RULE_FILE = REPO / "grafana" / alerts.RULE_FILE_PATH
APPLIED = names.GUARDED_PG_MIGRATION_VERSION
EXPECTED = names.GUARDED_PG_SCHEMA_EXPECTED_VERSION


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed or not on PATH (`make tools` installs it)")
    return found


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


def _schema_series(registry: CollectorRegistry, instance: str, minutes: int) -> list[dict[str, str]]:
    """The schema gauges of ``registry`` as Prometheus would scrape them from ``instance``, every
    minute for ``minutes`` minutes."""
    found = []
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.name in (APPLIED, EXPECTED):
                labels = {alerts.LABEL_JOB: cases.JOB, alerts.LABEL_INSTANCE: instance, **sample.labels}
                found.append(cases.series(sample.name, cases.steps((minutes, sample.value)), labels))
    return found


@pytest.mark.asyncio
async def test_old_code_on_a_schema_a_newer_release_migrated_fires_the_skew_alert(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    latest = latest_version()
    old_registry = CollectorRegistry()
    old = await make_store(registry=old_registry, name=cases.STORE)
    labels = {names.LABEL_STORE: cases.STORE, names.LABEL_SCHEMA: old.schema}
    assert old_registry.get_sample_value(APPLIED, labels) == latest
    assert old_registry.get_sample_value(EXPECTED, labels) == latest

    # a newer release: the same migrations and one more, which it applies when it connects
    newer = (*load_migrations(), Migration(latest + 1, "newer_release", "SELECT 1"))
    monkeypatch.setattr(schema_migrations, "load_migrations", lambda: newer)
    new_registry = CollectorRegistry()
    new = await make_store(registry=new_registry, name=cases.STORE)
    assert (await new.migration_status()).current == latest + 1
    assert new_registry.get_sample_value(APPLIED, labels) == latest + 1
    assert new_registry.get_sample_value(EXPECTED, labels) == latest + 1
    # the old process still says what it found on connecting, and what its code knows
    assert old_registry.get_sample_value(APPLIED, labels) == latest
    assert old_registry.get_sample_value(EXPECTED, labels) == latest

    alert = names.ALERT_SCHEMA_VERSION_SKEW
    test = cases.case(
        "an old process beside a newer release that migrated the schema",
        [
            *_schema_series(old_registry, cases.INSTANCE, 21),
            *_schema_series(new_registry, cases.INSTANCE_2, 21),
        ],
        [cases.at(14, alert), cases.at(16, alert, cases.skew(str(latest + 1), old.schema))],
    )
    document = {**cases.unit_test_file(test), "rule_files": [str(RULE_FILE)]}
    test_file = tmp_path / "schema-skew.yml"
    test_file.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    command = [_promtool(), "test", "rules", str(test_file)]
    result = await asyncio.to_thread(_run, command)
    assert result.returncode == 0, result.stdout + result.stderr

    await new.close()
    assert new_registry.get_sample_value(EXPECTED, labels) is None  # removed with the store


@pytest.mark.asyncio
async def test_processes_on_one_release_show_no_skew(make_store: StoreFactory, tmp_path: Path) -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    store = await make_store(registry=first, name=cases.STORE)
    await make_store(registry=second, name=cases.STORE)
    alert = names.ALERT_SCHEMA_VERSION_SKEW
    test = cases.case(
        "two processes of one release on one schema",
        [*_schema_series(first, cases.INSTANCE, 21), *_schema_series(second, cases.INSTANCE_2, 21)],
        [cases.at(16, alert), cases.at(20, alert)],
    )
    document = {**cases.unit_test_file(test), "rule_files": [str(RULE_FILE)]}
    test_file = tmp_path / "no-skew.yml"
    test_file.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    command = [_promtool(), "test", "rules", str(test_file)]
    result = await asyncio.to_thread(_run, command)
    assert result.returncode == 0, result.stdout + result.stderr
    assert first.get_sample_value(
        EXPECTED, {names.LABEL_STORE: cases.STORE, names.LABEL_SCHEMA: store.schema}
    ) == (latest_version())
