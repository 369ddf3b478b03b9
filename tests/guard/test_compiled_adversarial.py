"""Adversarial tests of the compiled success path (:mod:`guarded.compiled`): each runs a scenario
through ``guard()`` compiled and with compilation switched off, and requires that nothing a caller,
the backend or an operator can observe differs (answers, outcome counts, the buffer, the breaker,
the bulkhead's permits, the watchdog, the logical-time contextvar)."""

from __future__ import annotations

import asyncio
import importlib
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import contextmanager
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.memory import InMemoryStateStore
from guarded.call_stats import call_stats
from guarded.models import StoredEvent

pytestmark = [pytest.mark.asyncio, pytest.mark.lenient]

guard_module = importlib.import_module("guarded.guard")  # the package's ``guard`` is the function

SETTINGS: dict[str, Any] = {
    "timeout": {"attempt": 0.5, "deadline": 2.0, "critical_deadline": 2.0},
    "retry": {"initial_backoff": 0.001, "max_backoff": 0.002},
    "spill_path": None,
    "batching": False,
}

Scenario = Callable[[], Awaitable[Any]]


@contextmanager
def chain_only(compiled: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as patch:
        if not compiled:
            patch.setattr(guard_module, "compile_method", lambda *args, **kwargs: None)
        yield


def counts(registry: CollectorRegistry, store: str) -> Counter[tuple[str, str]]:
    return Counter(call_stats(registry).counts(store))


async def both(
    scenario: Callable[[bool], Awaitable[Any]], monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, Any]:
    """What ``scenario`` observed on the chain alone, and compiled."""
    with chain_only(False, monkeypatch):
        chain = await scenario(False)
    with chain_only(True, monkeypatch):
        compiled = await scenario(True)
    return chain, compiled


# --- a read racing a write that gets held --------------------------------------------------------


class Gated(InMemoryStateStore):
    """Reads take their answer, then wait for ``gate``; saves fail while ``saves_fail``; every
    call fails while ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None
        self.saves_fail = False
        self.down = False

    async def load_memory_state(self, key: str) -> Any:
        answer = await super().load_memory_state(key)
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise ConnectionRefusedError("down")
        return answer

    async def save_memory_state(self, key: str, state: Any) -> None:
        if self.saves_fail or self.down:
            raise ConnectionRefusedError("down")
        await super().save_memory_state(key, state)

    async def load_history(self, trace_id: str) -> Any:
        answer = await super().load_history(trace_id)
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise ConnectionRefusedError("down")
        return answer

    async def save_event(self, event: StoredEvent) -> None:
        if self.saves_fail or self.down:
            raise ConnectionRefusedError("down")
        await super().save_event(event)


async def test_a_read_in_flight_while_a_write_gets_held_answers_and_caches_as_the_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read that took the success path while nothing was held, whose backend answer comes back
    after a write of its key was held meanwhile: the chain answers the held (newer) write and keeps
    it in the stale cache; an outage after that write was replayed must never serve the older
    value the read got from the backend (never older over newer)."""

    async def scenario(compiled: bool) -> Any:
        backend = Gated()
        registry = CollectorRegistry()
        store = guard(backend, name="race", registry=registry, **{**SETTINGS, "retries": 1})
        async with store:
            await store.save_memory_state("k", {"v": 1})
            backend.gate = asyncio.Event()
            backend.saves_fail = True
            reader = asyncio.ensure_future(store.load_memory_state("k"))
            await asyncio.sleep(0.01)  # the read has its answer, {"v": 1}, and waits
            await store.save_memory_state("k", {"v": 2})  # held
            backend.gate.set()
            during = await reader
            backend.gate = None
            backend.saves_fail = False
            left = await controller(store).drain(2.0)  # {"v": 2} replayed
            in_backend = await InMemoryStateStore.load_memory_state(backend, "k")
            backend.down = True
            outage = await store.load_memory_state("k")
            backend.down = False
        return during, left, in_backend, outage, sorted(counts(registry, "race").items())

    chain, compiled = await both(scenario, monkeypatch)
    assert chain[3] == {"v": 2}, chain
    assert compiled == chain


async def test_a_list_read_in_flight_while_a_write_of_its_scope_gets_held_merges_it_as_the_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same race for a list read (read-your-writes): the chain merges the write held while the
    backend answered, and caches the merged list; so must the success path."""

    def event(ts: float) -> StoredEvent:
        return StoredEvent("t", ts, "node_end", "n", f"e{ts}", {})

    async def scenario(compiled: bool) -> Any:
        backend = Gated()
        registry = CollectorRegistry()
        store = guard(backend, name="race-list", registry=registry, **{**SETTINGS, "retries": 1})
        async with store:
            await store.save_event(event(1.0))
            backend.gate = asyncio.Event()
            backend.saves_fail = True
            reader = asyncio.ensure_future(store.load_history("t"))
            await asyncio.sleep(0.01)
            await store.save_event(event(2.0))  # held
            backend.gate.set()
            during = await reader
            backend.gate = None
            backend.down = True
            outage = await store.load_history("t")
            backend.down = backend.saves_fail = False
        return during, outage, sorted(counts(registry, "race-list").items())

    chain, compiled = await both(scenario, monkeypatch)
    assert len(chain[0]) == 2, chain
    assert compiled == chain
