"""A write the backend refuses as older is never answered ``ok``.

A direct write a backend refuses (one still comparing direct writes by logical time, against the
rule) ends with outcome ``refused``: counted, logged at ERROR, never held for replay, raised in
strict mode. A held write whose replay the backend refuses (another process wrote the key since)
is removed and counted as superseded, never as replayed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded import backend as logical_clock
from guarded.backend import next_logical_time
from guarded.backends.memory import InMemoryStateStore
from guarded.errors import WriteSupersededError
from guarded.guard import controller, guard
from guarded.logical_time import logical_times, replaying

pytestmark = pytest.mark.asyncio


class ComparesDirectWrites(InMemoryStateStore):
    """A backend that compares every write by logical time (a direct one too) and reports what it
    refuses."""

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        with replaying():
            await super().save_memory_state(key, state)


class Flaky(InMemoryStateStore):
    """Writes fail with a connection error while ``down`` (fault injection)."""

    down = False

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        if self.down:
            raise ConnectionResetError("injected outage")
        await super().save_memory_state(key, state)


def calls(registry: CollectorRegistry, outcome: str) -> float:
    labels = {"store": "refusing", "method": "save_memory_state", "outcome": outcome}
    return registry.get_sample_value("guarded_store_calls_total", labels) or 0.0


@pytest.mark.parametrize(
    "strict", [pytest.param(False, marks=pytest.mark.lenient), True], ids=["lenient", "strict"]
)
async def test_a_direct_write_the_backend_refuses_ends_refused_never_ok(
    strict: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, logger="guarded")
    backend = ComparesDirectWrites()
    seen = logical_clock._last
    # The process clock comes back to this after the test, not to the time ahead it merges below.
    monkeypatch.setattr(logical_clock, "_last", seen)
    with logical_times((next_logical_time() + 60_000_000,)):  # another worker, its clock a minute ahead
        await backend.save_memory_state("k", {"by": "a clock ahead"})
    monkeypatch.setattr(logical_clock, "_last", seen)  # that worker's time: this process never saw it
    registry = CollectorRegistry()
    store = guard(
        backend,
        name="refusing",
        registry=registry,
        strict=strict,
        dead_letter={"path": str(tmp_path / "d.sqlite")},
    )
    async with store:
        if strict:
            with pytest.raises(WriteSupersededError):
                await store.save_memory_state("k", {"by": "this worker"})
        else:
            assert await store.save_memory_state("k", {"by": "this worker"}) is None
        assert controller(store).dead_letters.depth == 0, "a refused write is not held for replay"
    assert (calls(registry, "refused"), calls(registry, "ok")) == (1.0, 0.0)
    assert await backend.load_memory_state("k") == {"by": "a clock ahead"}
    refusals = [record.levelno for record in caplog.records if getattr(record, "outcome", None) == "refused"]
    assert refusals == ([] if strict else [logging.ERROR])  # strict mode raises it instead


async def test_a_held_write_whose_replay_is_refused_is_superseded_not_replayed(tmp_path: Path) -> None:
    backend = Flaky()
    store = guard(
        backend, name="flaky", registry=CollectorRegistry(), dead_letter={"path": str(tmp_path / "d.sqlite")}
    )
    async with store:
        backend.down = True
        await store.save_memory_state("contested", {"by": "held"})
        await store.save_memory_state("free", {"by": "held"})
        # Another worker writes one key directly, after this worker's held call.
        await InMemoryStateStore.save_memory_state(backend, "contested", {"by": "another worker"})
        backend.down = False
        assert await controller(store).drain() == 0
        stats = await controller(store).dead_letters.stats()
    assert (stats.replayed_total, stats.superseded_total) == (1, 1)
    assert await backend.load_memory_state("contested") == {"by": "another worker"}
    assert await backend.load_memory_state("free") == {"by": "held"}
