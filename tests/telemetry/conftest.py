"""Each test sees the bad-event warnings it causes (the limiter is per process otherwise)."""

from __future__ import annotations

import logging

import pytest

from guarded.observability.rate_limited_log import RateLimitedLog
from guarded.telemetry import task_events


@pytest.fixture(autouse=True)
def fresh_problem_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        task_events, "_problems", RateLimitedLog(interval=300.0, log=logging.getLogger("guarded.telemetry"))
    )
