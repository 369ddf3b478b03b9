"""LoggingTaskTelemetrySink: structured records, PenguiFlow's levels, no payload contents."""

from __future__ import annotations

import logging

import pytest

from guarded.telemetry import LoggingTaskTelemetrySink

from .support import SECRET, SESSION_ID, TASK_ID, TRACE_ID, pf_event

LOGGER = "tests.telemetry.tasks"


def everything_in(record: logging.LogRecord) -> str:
    return record.getMessage() + repr(vars(record))


@pytest.mark.asyncio
async def test_one_structured_record_per_event_at_penguiflows_levels(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    sink = LoggingTaskTelemetrySink(logging.getLogger(LOGGER))
    for event_type in (
        "task_spawned",
        "task_completed",
        "task_failed",
        "task_cancelled",
        "task_group_completed",
        "task_group_failed",
    ):
        await sink.emit(pf_event(event_type, duration_ms=12.5))
    await sink.emit({"event_type": "task_paused"})
    levels = [record.levelno for record in caplog.records if record.name == LOGGER]
    assert levels == [
        logging.INFO,
        logging.INFO,
        logging.ERROR,
        logging.WARNING,
        logging.INFO,
        logging.ERROR,
        logging.WARNING,
    ]
    failed = caplog.records[2]
    assert failed.event == "task_telemetry"  # type: ignore[attr-defined]
    assert failed.event_type == "task_failed"  # type: ignore[attr-defined]
    assert (failed.task_id, failed.session_id, failed.trace_id) == (TASK_ID, SESSION_ID, TRACE_ID)  # type: ignore[attr-defined]
    assert failed.duration_ms == 12.5  # type: ignore[attr-defined]
    assert failed.extra_keys == ["error", "error_type"]  # type: ignore[attr-defined]
    assert TASK_ID in failed.getMessage()


@pytest.mark.asyncio
async def test_extra_values_are_not_logged_unless_allowed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    await LoggingTaskTelemetrySink(logging.getLogger(LOGGER)).emit(pf_event("task_failed"))
    await LoggingTaskTelemetrySink(logging.getLogger(LOGGER), extra_values=("error_type", "missing")).emit(
        pf_event("task_failed")
    )
    first, second = (r for r in caplog.records if r.name == LOGGER)
    assert "RuntimeError" not in everything_in(first)
    assert second.task_extra == {"error_type": "RuntimeError"}  # type: ignore[attr-defined]
    for record in caplog.records:
        assert SECRET not in everything_in(record)


@pytest.mark.asyncio
async def test_levels_can_be_overridden_and_disabled_levels_cost_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    sink = LoggingTaskTelemetrySink(logging.getLogger(LOGGER), levels={"task_completed": logging.WARNING})
    await sink.emit(pf_event("task_spawned"))
    await sink.emit(pf_event("task_completed"))
    assert [r.event_type for r in caplog.records if r.name == LOGGER] == ["task_completed"]  # type: ignore[attr-defined]
