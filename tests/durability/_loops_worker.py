"""One guard used from several event loops, run in a process of its own so that a call that never
returns is seen by the test as a process that does not finish (``python -m
tests.durability._loops_worker SCENARIO SPILL [DSN SCHEMA]``). Prints one JSON object: the
slowest call in seconds, the keys of the acknowledged writes, and (memory scenarios) the keys the
store holds after a drain on a later event loop.

``runs``
    A new loop per request, the backend down: every other run leaves writes in flight as it
    returns (fire-and-forget tasks, as a framework's background writes), so they fail and are
    being kept as its loop ends (``asyncio.run()``, or a sync framework's loop closed without
    cancelling them); the runs between await their writes.
``threads``
    Two threads, each with its own loop, write through the guard at once, the backend down.
``stuck-disk``
    The spill file's worker thread is stuck while a loop's commit waits on it, and that loop is
    closed without cancelling its tasks; the disk comes back, a later loop writes and drains.
``postgres``
    A guard over real PostgreSQL opened on one loop; later runs (each a new loop, in a new
    thread as a test client without ``with`` makes them) write through it: the store's pool
    belongs to the closed first loop. Every other later run leaves writes in flight and its loop
    is closed without cancelling them (a sync framework's loop per request). The process then
    ends without closing the guard (a later guard on the spill path delivers what it held).
    ``postgres-drain`` is that later guard: drains, then prints the keys PostgreSQL holds.
``testclient``
    A Starlette application whose first request opens a guard over real PostgreSQL (an
    application without a lifespan), called through Starlette's ``TestClient`` used without
    ``with``: each request runs in an event loop of its own, and every other request leaves writes
    in flight. Drained by ``postgres-drain`` as above.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import uuid
from typing import Any

from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.guard import controller, guard
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from guarded.testing.faulty import Ending

TIMEOUT = 0.3
LEFT_IN_FLIGHT = 50


class _IdentifiedMemoryStore(InMemoryStateStore):
    """An in-memory store that says which store it is, so the guard keeps a spill file for it."""

    def __init__(self) -> None:
        super().__init__()
        self.target_identity = f"loops-test:{uuid.uuid4().hex}"


class _Results:
    def __init__(self) -> None:
        self.slowest = 0.0
        self.acknowledged: set[str] = set()
        self._lock = threading.Lock()

    async def write(self, store: Any, key: str) -> None:
        began = time.monotonic()
        await store.save_memory_state(key, {"key": key})
        with self._lock:
            self.slowest = max(self.slowest, time.monotonic() - began)
            self.acknowledged.add(key)

    def drained(self, store: Any, faulty: Any, backend: InMemoryStateStore) -> dict[str, Any]:
        """What the scenario prints: after a drain on a later event loop, the acknowledged keys
        the store holds."""
        acknowledged = sorted(self.acknowledged)
        stored = asyncio.run(_drained_keys(store, faulty, backend, acknowledged))
        return {"slowest": self.slowest, "acknowledged": acknowledged, "stored": stored}

    async def leave_in_flight(self, store: Any, prefix: str, failed: Any) -> None:
        """Writes a framework started and never awaited (acknowledged only if they finish).
        Returns as soon as the backend refused one more call (``failed()`` counts them), so the
        loop shuts down while they are being kept; after a second when none reaches it (the
        breaker open)."""
        loop = asyncio.get_running_loop()
        before = failed()
        for index in range(LEFT_IN_FLIGHT):
            key = f"{prefix}-{index}"
            task = loop.create_task(store.save_memory_state(key, {"key": key}))
            task.add_done_callback(lambda task, key=key: self._finished(task, key))
        give_up = loop.time() + 1.0
        while failed() <= before and loop.time() < give_up:  # noqa: ASYNC110 - polls a count, no event
            await asyncio.sleep(0)

    def _finished(self, task: asyncio.Task[Any], key: str) -> None:
        if not task.cancelled() and task.exception() is None:
            with self._lock:
                self.acknowledged.add(key)


def _faulty() -> tuple[InMemoryStateStore, FaultyStore[InMemoryStateStore]]:
    backend = _IdentifiedMemoryStore()
    return backend, FaultyStore(backend, FaultPlan.always(Fault.error_before(ConnectionRefusedError)))


async def _drained_keys(store: Any, faulty: Any, backend: InMemoryStateStore, keys: list[str]) -> list[str]:
    """Heal the backend, drain the guard on this (later) loop, and list which of ``keys`` the
    backend holds."""
    fault_injector(faulty).plan = FaultPlan()
    await controller(store).drain(20.0)
    return [key for key in keys if await backend.load_memory_state(key) is not None]


def runs(spill: str) -> dict[str, Any]:
    backend, faulty = _faulty()
    # No breaker: every write reaches the (failing) backend, so a run ends right after one failed.
    store = guard(
        faulty,
        timeout=TIMEOUT,
        retries=0,
        breaker={"enabled": False},
        spill_path=spill,
        registry=CollectorRegistry(),
    )
    log = fault_injector(faulty).log
    results = _Results()

    async def request(number: int) -> None:
        if number % 2 == 0:
            await results.leave_in_flight(store, f"left{number}", lambda: len(log))
            return
        for index in range(5):
            await results.write(store, f"awaited{number}-{index}")

    for number in range(8):
        if number % 4 == 2:
            # A sync framework's request: a new loop, run until the handler returns, then closed
            # (its pending tasks are never cancelled, just dropped).
            loop = asyncio.new_event_loop()
            loop.run_until_complete(request(number))
            loop.close()
        else:
            asyncio.run(request(number))
    return results.drained(store, faulty, backend)


def threads(spill: str) -> dict[str, Any]:
    backend, faulty = _faulty()
    store = guard(faulty, timeout=TIMEOUT, retries=0, spill_path=spill, registry=CollectorRegistry())
    results = _Results()
    start = threading.Barrier(2)

    def worker(name: str) -> None:
        async def writes() -> None:
            start.wait()
            await asyncio.gather(*(results.write(store, f"{name}-{index}") for index in range(20)))
            for index in range(20, 30):
                await results.write(store, f"{name}-{index}")

        asyncio.run(writes())

    workers = [threading.Thread(target=worker, args=(name,)) for name in ("a", "b")]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return results.drained(store, faulty, backend)


def stuck_disk(spill: str) -> dict[str, Any]:
    backend, faulty = _faulty()
    store = guard(faulty, timeout=TIMEOUT, retries=0, spill_path=spill, registry=CollectorRegistry())
    results = _Results()
    asyncio.run(results.write(store, "first"))
    buffer = controller(store).dead_letters
    assert buffer is not None
    assert buffer._link.executor is not None
    disk = threading.Event()
    buffer._link.executor.submit(disk.wait)

    async def leave_one_committing() -> None:
        asyncio.get_running_loop().create_task(store.save_memory_state("abandoned", {"key": "abandoned"}))
        await asyncio.sleep(0.2)  # failed, numbered, and its transaction queued behind the stuck disk

    closed = asyncio.new_event_loop()
    closed.run_until_complete(leave_one_committing())
    closed.close()
    disk.set()
    asyncio.run(results.write(store, "later"))

    async def drain() -> tuple[int, list[str]]:
        fault_injector(faulty).plan = FaultPlan()
        left = await controller(store).drain(20.0)
        keys = ("first", "abandoned", "later")
        return left, [key for key in keys if await backend.load_memory_state(key) is not None]

    left, stored = asyncio.run(drain())
    return {
        "slowest": results.slowest,
        "left": left,
        "stored": stored,
        "spill_in_use": buffer.spill_path is not None,
    }


def _postgres_guard(store: Any, spill: str) -> Any:
    """The scenarios' guard over PostgreSQL: short deadlines, no retries, no breaker (every
    failure held at once), its own spill file and registry."""
    return guard(
        store,
        name="loops",
        timeout=TIMEOUT,
        retries=0,
        breaker={"enabled": False},
        spill_path=spill,
        registry=CollectorRegistry(),
    )


def postgres(spill: str, dsn: str, schema: str) -> dict[str, Any]:
    from guarded.backends.postgres import PostgresStateStore

    results = _Results()
    holder: dict[str, Any] = {}

    async def first() -> None:
        backend = await PostgresStateStore.connect(
            dsn, schema=schema, registry=CollectorRegistry(), stats_interval=None
        )
        # No faults: the wrapper only records how each call to PostgreSQL ended.
        recorded = FaultyStore(backend, FaultPlan())
        holder["log"] = fault_injector(recorded).log
        holder["store"] = _postgres_guard(recorded, spill)
        for index in range(5):
            await results.write(holder["store"], f"first-{index}")
        await results.leave_in_flight(holder["store"], "left", lambda: len(results.acknowledged))

    async def later(number: int) -> None:
        for index in range(5):
            await results.write(holder["store"], f"later{number}-{index}")

    async def leaving(number: int) -> None:
        log = holder["log"]
        await results.leave_in_flight(
            holder["store"], f"leaving{number}", lambda: sum(record.ending is Ending.RAISED for record in log)
        )

    def in_own_thread(run: Any, *, closed_as_is: bool = False) -> None:
        def request() -> None:
            if closed_as_is:  # a sync framework's loop: closed without cancelling what it left
                loop = asyncio.new_event_loop()
                loop.run_until_complete(run)
                loop.close()
            else:
                asyncio.run(run)

        thread = threading.Thread(target=request)
        thread.start()
        thread.join()

    in_own_thread(first())
    for number in range(4):
        in_own_thread(leaving(number) if number % 2 else later(number), closed_as_is=number % 2 == 1)
    return {"slowest": results.slowest, "acknowledged": sorted(results.acknowledged)}


def testclient(spill: str, dsn: str, schema: str) -> dict[str, Any]:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from guarded.backends.postgres import PostgresStateStore

    results = _Results()
    holder: dict[str, Any] = {}

    async def write(request: Request) -> JSONResponse:
        if "store" not in holder:
            backend = await PostgresStateStore.connect(
                dsn, schema=schema, registry=CollectorRegistry(), stats_interval=None
            )
            holder["store"] = _postgres_guard(backend, spill)
        number = int(request.path_params["number"])
        await results.write(holder["store"], f"request{number}")
        if number % 2:
            await results.leave_in_flight(holder["store"], f"left{number}", lambda: len(results.acknowledged))
        return JSONResponse({"number": number})

    client = TestClient(Starlette(routes=[Route("/write/{number}", write, methods=["POST"])]))
    statuses = [client.post(f"/write/{number}").status_code for number in range(8)]
    return {"slowest": results.slowest, "acknowledged": sorted(results.acknowledged), "statuses": statuses}


def postgres_drain(spill: str, dsn: str, schema: str, keys: list[str]) -> dict[str, Any]:
    from guarded.backends.postgres import PostgresStateStore

    async def drain() -> list[str]:
        backend = await PostgresStateStore.connect(
            dsn, schema=schema, registry=CollectorRegistry(), stats_interval=None
        )
        store = guard(backend, name="loops", timeout=TIMEOUT, spill_path=spill, registry=CollectorRegistry())
        async with store:  # closes the backend too
            left = await controller(store).drain(20.0)
            assert left == 0, f"{left} held writes not delivered"
            return [key for key in keys if await backend.load_memory_state(key) is not None]

    return {"stored": asyncio.run(drain())}


def main() -> None:
    scenario, spill, *rest = sys.argv[1:]
    if scenario == "runs":
        result = runs(spill)
    elif scenario == "threads":
        result = threads(spill)
    elif scenario == "stuck-disk":
        result = stuck_disk(spill)
    elif scenario == "postgres":
        result = postgres(spill, rest[0], rest[1])
    elif scenario == "testclient":
        result = testclient(spill, rest[0], rest[1])
    else:
        result = postgres_drain(spill, rest[0], rest[1], json.loads(sys.stdin.read()))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
