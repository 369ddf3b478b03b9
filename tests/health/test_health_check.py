"""``controller(store).health()`` and the probes of :mod:`guarded.health`, against real faults:
the in-memory store behind a fault plan standing for a database that is down, a spill file in a
temporary directory, and one whose directory cannot be created."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from guarded import controller, guard
from guarded.backends.hybrid_store import HybridStateStore
from guarded.backends.memory import InMemoryStateStore
from guarded.config import BatchConfig, BreakerConfig, BulkheadConfig, DeadLetterConfig, GuardConfig
from guarded.errors import WriteNotKeptError
from guarded.health import health_app, probe
from guarded.health_status import HealthStatus
from guarded.pool_usage import PoolUsage
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.guard.support import fast_config, no_background_replay

pytestmark = pytest.mark.asyncio

WAIT = 30.0
"""Seconds a condition has to come true on a loaded machine."""

DOWN = FaultPlan.always(Fault.error_before(ConnectionRefusedError))


def config(spill: Path | None, *, dead_letter: DeadLetterConfig | None = None, **fields: Any) -> GuardConfig:
    breaker = BreakerConfig.model_validate({"window_size": 4, "minimum_calls": 4, "open_duration": 600.0})
    return fast_config(
        breaker=breaker,
        max_attempts=1,
        batching=BatchConfig(enabled=False),
        dead_letter=dead_letter
        or DeadLetterConfig(path=None if spill is None else str(spill), drain_timeout=0.5),
        **fields,
    )


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not await condition():
        assert time.monotonic() < deadline, f"{what} within {WAIT}s"


def codes(store: object) -> list[str]:
    return [reason.code for reason in controller(store).health().reasons]


@pytest_asyncio.fixture
async def down(tmp_path: Path) -> AsyncIterator[tuple[Any, FaultyStore]]:
    """A guard whose database refuses every call, with a spill file in ``tmp_path``."""
    faulty = FaultyStore(InMemoryStateStore(), DOWN)
    store = guard(faulty, name="db", registry=CollectorRegistry(), config=config(tmp_path / "dlq.sqlite"))
    try:
        yield store, faulty
    finally:
        fault_injector(faulty).plan = FaultPlan()
        await controller(store).aclose()


async def test_a_healthy_guard_is_ok(tmp_path: Path) -> None:
    store = guard(InMemoryStateStore(), registry=CollectorRegistry(), config=config(tmp_path / "dlq.sqlite"))
    try:
        await store.save_memory_state("k", {"v": 1})
        health = controller(store).health()
        assert (health.status, health.reasons, health.ready) == (HealthStatus.OK, (), True)
        assert probe(store, "readyz") == (200, {"status": "ok", "reasons": []})
    finally:
        await controller(store).aclose()


async def test_breaker_open_with_a_working_spill_file_is_degraded_and_ok_once_closed(
    down: tuple[Any, FaultyStore],
) -> None:
    store, faulty = down
    controls = controller(store)
    no_background_replay(store)
    controls.breaker.force_open()
    await store.save_memory_state("k", {"secret": "payload-text"})
    assert controls.dead_letters is not None
    assert controls.dead_letters.depth == 1
    health = controls.health()
    assert health.status is HealthStatus.DEGRADED
    assert health.ready
    assert [reason.code for reason in health.reasons] == ["breaker_open", "writes_held"]
    assert "1 writes held" in health.reasons[1].message
    assert all("payload-text" not in reason.message for reason in health.reasons)
    assert probe(store, "readyz")[0] == probe(store, "livez")[0] == 200
    strict = probe(store, "readyz", ready_when=lambda health: health.status is HealthStatus.OK)
    assert strict[0] == 503

    fault_injector(faulty).plan = FaultPlan()
    controls.breaker.reset()
    assert await controls.drain(WAIT) == 0
    assert controls.health().status is HealthStatus.OK


async def test_a_stopped_database_opens_the_breaker_and_the_guard_stays_ready(
    down: tuple[Any, FaultyStore],
) -> None:
    store, _ = down
    no_background_replay(store)

    async def opened() -> bool:
        await store.save_memory_state("k", {"v": 1})
        return "breaker_open" in codes(store)

    await until(opened, "the breaker opens")
    assert controller(store).health().status is HealthStatus.DEGRADED
    assert probe(store, "readyz")[0] == 200


async def test_an_unusable_spill_file_while_writes_are_held_is_failing(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    faulty = FaultyStore(InMemoryStateStore(), DOWN)
    store = guard(faulty, registry=CollectorRegistry(), config=config(blocker / "dlq.sqlite"))
    controls = controller(store)
    try:
        controls.breaker.force_open()
        with pytest.raises(WriteNotKeptError):  # there is no spill file to hold it
            await store.save_memory_state("k", {"v": 1})
        health = controls.health()
        assert health.status is HealthStatus.FAILING
        assert not health.ready
        assert [reason.code for reason in health.reasons] == ["breaker_open", "spill_unusable"]
        assert len(health.reasons[1].message) <= 200
        status, body = probe(store, "readyz")
        assert (status, body["status"]) == (503, "failing")
        assert probe(store, "livez")[0] == 200
    finally:
        fault_injector(faulty).plan = FaultPlan()
        await controls.aclose()


async def test_an_unusable_spill_file_with_nothing_to_hold_is_only_degraded(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    faulty = FaultyStore(InMemoryStateStore(), DOWN)
    store = guard(faulty, registry=CollectorRegistry(), config=config(blocker / "dlq.sqlite"))
    controls = controller(store)
    try:
        controls.breaker.force_open()
        with pytest.raises(WriteNotKeptError):
            await store.save_memory_state("k", {"v": 1})
        controls.breaker.reset()
        assert controls.health().status is HealthStatus.DEGRADED
        assert codes(store) == ["spill_unusable"]
    finally:
        fault_injector(faulty).plan = FaultPlan()
        await controls.aclose()


async def test_dead_lettering_off_and_the_breaker_open_is_failing() -> None:
    store = guard(
        InMemoryStateStore(),
        registry=CollectorRegistry(),
        config=config(None, dead_letter=DeadLetterConfig(enabled=False, path=None)),
    )
    controller(store).breaker.force_open()
    assert codes(store) == ["breaker_open", "writes_refused"]
    assert controller(store).health().status is HealthStatus.FAILING
    await controller(store).aclose()


async def test_a_closed_guard_without_dead_letters_is_failing() -> None:
    store = guard(
        InMemoryStateStore(),
        registry=CollectorRegistry(),
        config=config(None, dead_letter=DeadLetterConfig(enabled=False, path=None)),
    )
    assert controller(store).health().status is HealthStatus.OK
    await controller(store).aclose()
    assert codes(store) == ["guard_closed"]
    assert controller(store).health().status is HealthStatus.FAILING


async def test_memory_only_held_writes_are_degraded() -> None:
    faulty = FaultyStore(InMemoryStateStore(), DOWN)
    store = guard(faulty, registry=CollectorRegistry(), config=config(None))
    controls = controller(store)
    try:
        controls.breaker.force_open()
        await store.save_memory_state("k", {"v": 1})
        assert codes(store) == ["breaker_open", "writes_held", "memory_only"]
        assert controls.health().status is HealthStatus.DEGRADED
    finally:
        fault_injector(faulty).plan = FaultPlan()
        await controls.aclose()


async def test_a_closed_guard_is_failing_and_not_live(tmp_path: Path) -> None:
    store = guard(InMemoryStateStore(), registry=CollectorRegistry(), config=config(tmp_path / "dlq.sqlite"))
    await store.save_memory_state("k", {"v": 1})
    await controller(store).aclose()
    assert codes(store) == ["guard_closed"]
    assert probe(store, "livez")[0] == probe(store, "readyz")[0] == 503


async def test_a_spill_file_near_its_cap_is_degraded(tmp_path: Path) -> None:
    faulty = FaultyStore(InMemoryStateStore(), DOWN)
    spill = DeadLetterConfig(path=str(tmp_path / "small.sqlite"), max_disk_bytes=2000, drain_timeout=0.5)
    store = guard(faulty, name="small", registry=CollectorRegistry(), config=config(None, dead_letter=spill))
    controls = controller(store)
    try:
        no_background_replay(store)
        controls.breaker.force_open()
        await store.save_memory_state("k", {"v": "x" * 1800})
        assert controls.dead_letters is not None
        assert controls.dead_letters.depth == 1
        assert codes(store) == ["breaker_open", "writes_held", "spill_near_cap"]
        assert controls.health().status is HealthStatus.DEGRADED
    finally:
        fault_injector(faulty).plan = FaultPlan()
        await controls.aclose()


async def test_a_composed_store_answers_its_worst_part(tmp_path: Path) -> None:
    record = FaultyStore(InMemoryStateStore(), DOWN)
    hybrid = HybridStateStore(hot=InMemoryStateStore(), record=record)
    store = guard(hybrid, name="hybrid", registry=CollectorRegistry(), config=config(tmp_path / "dlq.sqlite"))
    controls = controller(store)
    try:
        assert controls.health().status is HealthStatus.OK
        controls.parts["record"].breaker.force_open()
        health = controls.health()
        assert health.status is HealthStatus.DEGRADED
        assert [(reason.code, reason.message.split(":")[0]) for reason in health.reasons] == [
            ("breaker_open", "record")
        ]
        assert probe(controls, "readyz")[0] == 200
    finally:
        fault_injector(record).plan = FaultPlan()
        await controls.aclose()


async def test_the_asgi_app_answers_the_probes(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    faulty = FaultyStore(InMemoryStateStore(), DOWN)
    store = guard(faulty, registry=CollectorRegistry(), config=config(blocker / "dlq.sqlite"))
    controls = controller(store)
    transport = httpx.ASGITransport(app=health_app(store))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://pod") as client:
            ready = await client.get("/readyz")
            assert (ready.status_code, ready.json()) == (200, {"status": "ok", "reasons": []})
            assert ready.headers["content-type"] == "application/json"
            assert (await client.get("/livez")).status_code == 200

            controls.breaker.force_open()
            with pytest.raises(WriteNotKeptError):
                await store.save_memory_state("k", {"v": 1})
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["status"] == "failing"
            assert {reason["code"] for reason in ready.json()["reasons"]} == {
                "breaker_open",
                "spill_unusable",
            }
            assert (await client.get("/livez")).status_code == 200
            assert (await client.get("/elsewhere")).status_code == 404
            assert (await client.post("/readyz")).status_code == 405

            fault_injector(faulty).plan = FaultPlan()
            await controls.aclose()
            assert (await client.get("/livez")).status_code == 503
    finally:
        fault_injector(faulty).plan = FaultPlan()
        await controls.aclose()


async def test_a_saturated_bulkhead_is_degraded(tmp_path: Path) -> None:
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan.always(Fault.hang()))
    limited = config(
        tmp_path / "dlq.sqlite",
        attempt=WAIT,
        deadline=WAIT,
        bulkhead=BulkheadConfig(max_concurrent=1),
    )
    store = guard(faulty, registry=CollectorRegistry(), config=limited)
    controls = controller(store)
    bulkhead = controls.bulkhead
    assert bulkhead is not None
    calls = [asyncio.create_task(store.load_history(f"t{index}")) for index in range(2)]
    try:

        async def saturated() -> bool:
            await asyncio.sleep(0.01)
            return bulkhead.waiting == 1

        await until(saturated, "one call in the backend and one waiting")
        assert codes(store) == ["bulkhead_saturated"]
        assert controls.health().status is HealthStatus.DEGRADED
        fault_injector(faulty).plan = FaultPlan()
        fault_injector(faulty).release()
        assert await asyncio.gather(*calls) == [[], []]
        assert controls.health().status is HealthStatus.OK
    finally:
        fault_injector(faulty).plan = FaultPlan()
        fault_injector(faulty).release()
        await asyncio.gather(*calls, return_exceptions=True)
        await controls.aclose()


async def test_the_app_mounted_in_starlette_beside_other_routes(tmp_path: Path) -> None:
    store = guard(InMemoryStateStore(), registry=CollectorRegistry(), config=config(tmp_path / "dlq.sqlite"))

    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/hello", hello), Mount("/", app=health_app(store))])
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://pod") as client:
            assert (await client.get("/hello")).text == "hello"
            assert (await client.get("/readyz")).json() == {"status": "ok", "reasons": []}
            controller(store).breaker.force_open()
            ready = await client.get("/readyz")
            assert (ready.status_code, ready.json()["status"]) == (200, "degraded")
    finally:
        await controller(store).aclose()


@pytest.mark.parametrize(
    ("usage", "saturated"),
    [
        (PoolUsage(in_use=2, max_size=2, waiting=1), True),
        (PoolUsage(in_use=2, max_size=2, waiting=0), False),
        (PoolUsage(in_use=2, max_size=2), True),  # who waits is unknown: every connection in use
        (PoolUsage(in_use=1, max_size=2), False),
        (PoolUsage(in_use=0, max_size=0, waiting=3), False),  # no pool to speak of
    ],
)
async def test_a_pool_is_saturated_when_every_connection_is_in_use_and_callers_wait(
    usage: PoolUsage, saturated: bool
) -> None:
    assert usage.saturated is saturated


class PoolReportFails(InMemoryStateStore):
    """A backend whose pool report raises (a fault injected in the report, not in the store)."""

    def pool_usage(self) -> PoolUsage | None:
        raise RuntimeError("the pool report broke")


async def test_a_failing_pool_report_leaves_the_health_check_answering() -> None:
    store = guard(PoolReportFails(), registry=CollectorRegistry(), config=config(None))
    try:
        assert probe(store, "readyz") == (200, {"status": "ok", "reasons": []})
    finally:
        await controller(store).aclose()
