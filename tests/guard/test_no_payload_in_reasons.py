"""On ``guard(InMemoryStateStore)``: no payload in any reason, log or metric.

See :mod:`tests.guard._payload_secrets` for the refused calls (every write method, the secret in
keys, values, ids and numbers).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.guard import controller, guard

from ._payload_secrets import SECRET, exercise, guard_config


@pytest.mark.lenient
@pytest.mark.asyncio
@pytest.mark.parametrize("spill", [True, False], ids=["spill", "memory"])
async def test_no_secret_in_parked_reasons_logs_or_metrics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, spill: bool
) -> None:
    registry = CollectorRegistry()
    config = guard_config(str(tmp_path / "dlq.sqlite") if spill else None)
    async with guard(InMemoryStateStore(), registry=registry, config=config) as store:
        await exercise(store, registry, caplog)


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_a_5000_digit_integer_is_parked_with_its_reason(tmp_path: Path) -> None:
    """Before: ``rejected`` and nothing kept (the dead-letter file could not encode it)."""
    registry = CollectorRegistry()
    async with guard(
        InMemoryStateStore(), registry=registry, config=guard_config(str(tmp_path / "d"))
    ) as store:
        await store.save_memory_state("k", {"ssn": 7 * (10**5_000 - 1) // 9})
        assert controller(store).stats()[("save_memory_state", "rejected")] == 1
        [parked] = await controller(store).dead_letters.parked()  # type: ignore[union-attr]
        assert parked.method == "save_memory_state"
        assert parked.reason.startswith(
            "guarded.errors.InvalidPayloadError: save_memory_state: state[key #0 (str)]: "
        )
        assert "4300 digits" in parked.reason
        assert "7777" not in parked.reason


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_a_parked_reason_names_keys_by_position_and_type(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    async with guard(
        InMemoryStateStore(), registry=registry, config=guard_config(str(tmp_path / "d"))
    ) as store:
        await store.save_memory_state("k", {"a": 1, "b": {f"ssn={SECRET}": [0, float("nan")]}})
        [parked] = await controller(store).dead_letters.parked()  # type: ignore[union-attr]
        assert parked.reason == (
            "guarded.errors.InvalidPayloadError: save_memory_state: "
            "state[key #1 (str)][key #0 (str)][1]: nan is not a valid JSON number"
        )
