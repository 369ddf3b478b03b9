"""The files guarded/assets/ ships are the repository's generated grafana/ and its otel-collector.yaml.

``guarded assets export`` writes what the package holds, so the package's copy must never drift
from what ``dashboards/`` generates (the dashboards, the provisioning and the alert rules) nor
from the repository's collector configuration. When one of these tests fails, refresh the copy
with ``make assets`` and commit guarded/assets/ with the change.
"""

from __future__ import annotations

from pathlib import Path

from dashboards import output
from guarded.assets import COLLECTOR_CONFIG, GRAFANA_DIR, packaged_assets

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "guarded" / "assets"
REFRESH = (
    "refresh the package's copy with `make assets` (python -m dashboards --grafana-dir "
    "guarded/assets/grafana; cp otel-collector.yaml guarded/assets/) and commit guarded/assets/"
)


def test_the_packaged_grafana_files_are_what_dashboards_generates() -> None:
    found = output.differences(PACKAGE / GRAFANA_DIR)
    assert not found, (
        "guarded/assets/grafana differs from what dashboards/ generates:\n  "
        + "\n  ".join(found)
        + f"\n{REFRESH}"
    )


def test_the_package_ships_exactly_the_generated_files_and_the_collector_config() -> None:
    expected = {f"{GRAFANA_DIR}/{path}" for path in output.rendered_files()} | {COLLECTOR_CONFIG}
    shipped = set(packaged_assets())
    assert shipped == expected, (
        f"missing from guarded/assets: {sorted(expected - shipped)}; "
        f"not generated (delete them): {sorted(shipped - expected)}\n{REFRESH}"
    )


def test_every_packaged_file_is_byte_for_byte_the_repositorys() -> None:
    differ = [path for path, data in packaged_assets().items() if (REPO / path).read_bytes() != data]
    assert not differ, f"guarded/assets differs from the repository's copy: {differ}\n{REFRESH}"
