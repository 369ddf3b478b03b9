"""Each test sees the bad-event warnings it causes (the limiter is per process otherwise)."""

from __future__ import annotations

import pytest

from guarded.telemetry import events
from guarded.telemetry.rate_limited_log import RateLimitedLog


@pytest.fixture(autouse=True)
def fresh_problem_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "_problems", RateLimitedLog(interval=300.0))
