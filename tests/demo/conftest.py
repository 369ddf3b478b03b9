"""The demo sends bad payloads on purpose (its ``bad`` fault) and checks that the guard parks them
as in production, so its tests run outside strict mode."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/demo/" in item.nodeid:
            item.add_marker(pytest.mark.lenient)
