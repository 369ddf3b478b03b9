"""A guarded Redis store under a small steady workload, for the live Prometheus check: its own
registry on its own ``/metrics``, so the Redis dashboard's panels and the Redis alert rules have
real series (a node with a ``maxmemory``, pauses saved and consumed, memory, events and tasks)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry

from guarded.backends.redis import RedisStateStore
from guarded.demo.metrics_server import start_metrics_server
from guarded.guard import controller, guard
from guarded.testing.redis import RedisServer

STORE = "redis-live"
"""The ``store`` label of the Redis store's series (and of its guard's)."""
MAXMEMORY = 256 * 1024 * 1024


async def _work(store: object, stop: asyncio.Event) -> None:
    proxy = store  # a guarded store: every call through the guard
    step = 0
    while not stop.is_set():
        token = f"pause-{step}"
        await proxy.save_planner_state(token, {"step": step})  # type: ignore[attr-defined]
        if step % 3:  # two of three resumed: the gap the saves-vs-consumes panel shows
            await proxy.load_planner_state(token)  # type: ignore[attr-defined]
        await proxy.save_memory_state(f"user:{step % 5}", {"turn": step})  # type: ignore[attr-defined]
        await proxy.load_memory_state(f"user:{step % 5}")  # type: ignore[attr-defined]
        step += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.05)


@contextlib.asynccontextmanager
async def redis_workload(server: RedisServer, port: int) -> AsyncIterator[None]:
    """Serve a guarded Redis store's metrics on ``port`` and keep it busy until the block ends."""
    registry = CollectorRegistry()
    backend = await RedisStateStore.connect(
        server.url, prefix="live", name=STORE, registry=registry, sample_interval=1.0
    )
    await backend.client.config_set("maxmemory", MAXMEMORY)
    await backend.client.config_set("maxmemory-policy", "noeviction")
    store = guard(backend, name=STORE, registry=registry)
    metrics = start_metrics_server(registry, port)
    stop = asyncio.Event()
    worker = asyncio.create_task(_work(store, stop))
    try:
        yield
    finally:
        stop.set()
        await worker
        metrics.close()
        await controller(store).aclose()
        await backend.close()


__all__ = ["STORE", "redis_workload"]
