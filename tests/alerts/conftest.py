"""The real promtool for every test of the alert rules: missing, the tests fail (never skip)."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail(
            "promtool is not installed or not on PATH: these tests run Prometheus' own rule checker "
            "and unit-test runner. Install it (Debian/Ubuntu: `apt-get install prometheus`, or the "
            "promtool binary from a Prometheus release tarball); CI installs it."
        )
    return found
