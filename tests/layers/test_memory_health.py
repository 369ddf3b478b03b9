"""The memory-health layer alone, over a scripted inner service, read through the registry's
``guarded_memory_health_keys`` gauge.

The promise: a memory state the guard acknowledges (written, or held for replay) or loads is
counted by its ``health``; a load that finds nothing stops counting the key; a write or read that
fails, or that the caller cancelled, changes nothing; a failure of the bookkeeping itself is logged
and never changes the call's result; every other method is left unwrapped.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.config import GuardConfig
from guarded.layers.memory_health import MemoryHealthLayer
from guarded.observability import telemetry_names as names
from guarded.outcome import Outcome
from guarded.pipeline.call import Call, MethodSetup
from guarded.pipeline.proxy import async_method_names
from guarded.policy_table import PolicyTable
from tests.support.aio import settle
from tests.support.layers import method_setup, new_call
from tests.support.metrics import sample
from tests.support.scripted import ScriptedService

pytestmark = pytest.mark.asyncio

DOWN = ConnectionResetError("down")


def state(health: str) -> dict[str, Any]:
    return {"version": 1, "health": health, "summary": "", "turns": []}


def health_keys(registry: CollectorRegistry) -> dict[str, float]:
    """Keys of store ``"s"`` by health, those at 0 left out."""
    found = {
        health: sample(registry, names.MEMORY_HEALTH_KEYS, store="s", health=health)
        for health in (*names.MEMORY_HEALTH_STATES, names.MEMORY_HEALTH_UNKNOWN)
    }
    return {health: count for health, count in found.items() if count}


async def save(registry: CollectorRegistry, inner: Any, key: Any, value: Any) -> Any:
    setup = method_setup("save_memory_state")
    return await MemoryHealthLayer(registry).wrap(inner, setup)(new_call(setup, key, value))


async def load(registry: CollectorRegistry, inner: Any, key: str) -> Any:
    setup = method_setup("load_memory_state")
    return await MemoryHealthLayer(registry).wrap(inner, setup)(new_call(setup, key))


async def test_an_acknowledged_write_counts_its_health_and_a_later_one_moves_the_key() -> None:
    registry = CollectorRegistry()
    await save(registry, ScriptedService().answer(None), "k", state("degraded"))
    assert health_keys(registry) == {"degraded": 1}
    await save(registry, ScriptedService().answer(None), "k", state("healthy"))
    await save(registry, ScriptedService().answer(None), "other", state("odd value"))
    assert health_keys(registry) == {"healthy": 1, "unknown": 1}


async def test_a_write_held_for_replay_is_acknowledged_and_counts() -> None:
    registry = CollectorRegistry()

    async def dead_lettered(call: Call) -> None:
        call.error, call.outcome = DOWN, Outcome.DEAD_LETTERED

    await save(registry, dead_lettered, "k", state("retry"))
    assert health_keys(registry) == {"retry": 1}


async def test_a_write_that_failed_changes_nothing() -> None:
    registry = CollectorRegistry()
    await save(registry, ScriptedService().answer(None), "k", state("healthy"))
    with pytest.raises(ConnectionResetError):
        await save(registry, ScriptedService().fail(DOWN), "k", state("degraded"))
    assert health_keys(registry) == {"healthy": 1}


async def test_a_load_counts_what_the_planner_now_runs_with_and_nothing_stops_the_count() -> None:
    registry = CollectorRegistry()
    assert await load(registry, ScriptedService().answer(state("recovering")), "k") == state("recovering")
    assert health_keys(registry) == {"recovering": 1}
    with pytest.raises(ConnectionResetError):
        await load(registry, ScriptedService().fail(DOWN), "k")
    assert health_keys(registry) == {"recovering": 1}
    assert await load(registry, ScriptedService().answer(None), "k") is None
    assert health_keys(registry) == {}


async def test_a_cancelled_load_changes_nothing() -> None:
    registry = CollectorRegistry()
    await save(registry, ScriptedService().answer(None), "k", state("healthy"))
    task = asyncio.ensure_future(load(registry, ScriptedService().hang(), "k"))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert health_keys(registry) == {"healthy": 1}


class UnreadableKeyError(RuntimeError):
    """Raised by :class:`UnreadableKey` (a type of this module's own: the log of bookkeeping
    failures is rate-limited per error type)."""


class UnreadableKey:
    def __hash__(self) -> int:
        raise UnreadableKeyError("no hash")


async def test_a_failure_of_the_bookkeeping_is_logged_and_the_write_still_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    caplog.set_level(logging.WARNING, logger="guarded.telemetry")
    assert (
        await save(registry, ScriptedService().answer("written"), UnreadableKey(), state("healthy"))
        == "written"
    )
    assert [getattr(record, "event", None) for record in caplog.records] == ["memory_health_failed"]
    assert health_keys(registry) == {}


async def test_the_layer_leaves_every_other_method_alone() -> None:
    registry = CollectorRegistry()
    layer = MemoryHealthLayer(registry)
    table = PolicyTable.for_state_store()
    config = GuardConfig()

    async def inner(call: Any) -> None:
        return None

    wrapped = set()
    for name in async_method_names(InMemoryStateStore()):
        policy = table.get(name)
        setup = MethodSetup("s", name, policy, config.for_method(name, critical=policy.critical))
        if layer.wrap(inner, setup) is not inner:
            wrapped.add(name)
    assert wrapped == {"save_memory_state", "load_memory_state"}
