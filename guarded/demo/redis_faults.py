"""The demo's server faults on Redis: the ``redis-server`` killed, shut down, stalled, its clients
killed; on a Redis Cluster, a master killed and its replica promoted.

Each returns ``(effect, happened)`` as :class:`~guarded.demo.faults.FaultInjector` records it.
The single server is :class:`guarded.testing.redis.RedisServer` (``appendfsync always``: a
SIGKILL loses nothing the server acknowledged); the cluster
:class:`guarded.testing.redis_cluster.RedisCluster`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from guarded.testing.redis import RedisServer

KILL_INTERVAL = 0.2
"""Seconds between two ``CLIENT KILL`` rounds of a ``kill`` fault."""


async def restart_redis(
    server: RedisServer, downtime: float, *, crash: bool, phase: Callable[[str], None]
) -> tuple[str, bool]:
    """Stop the server (``crash``: SIGKILL; otherwise SIGTERM, a clean shutdown), keep it down for
    ``downtime`` seconds, start it again on the same port and data."""
    loop = asyncio.get_running_loop()
    phase("killing redis-server (SIGKILL)" if crash else "shutting redis-server down")
    await asyncio.to_thread(server.kill if crash else server.shutdown)
    down = loop.time()
    phase("redis down")
    await asyncio.sleep(downtime)
    phase("redis starting")
    await asyncio.to_thread(server.restart)
    stopped = "SIGKILL" if crash else "clean shutdown"
    return f"redis down {loop.time() - down:.1f}s ({stopped}, restarted from its append-only file)", True


async def stall_redis(
    server: RedisServer, duration: float, *, phase: Callable[[str], None]
) -> tuple[str, bool]:
    """SIGSTOP the server for ``duration`` seconds, then SIGCONT: every call hangs meanwhile."""
    loop = asyncio.get_running_loop()
    server.pause()
    stalled = loop.time()
    phase("redis stalled (SIGSTOP)")
    try:
        await asyncio.sleep(duration)
    finally:
        server.resume()
    return f"redis stalled {loop.time() - stalled:.1f}s (SIGSTOP, then SIGCONT)", True


async def kill_redis_clients(urls: list[str], duration: float) -> tuple[str, bool]:
    """``CLIENT KILL TYPE normal`` on every node of ``urls`` every :data:`KILL_INTERVAL` seconds for
    ``duration`` seconds (the killing connection skips itself); how many connections were killed."""
    from redis import asyncio as redis_asyncio  # the optional 'redis' extra, needed only here

    loop = asyncio.get_running_loop()
    end = loop.time() + duration
    admins: list[Any] = [redis_asyncio.Redis.from_url(url, socket_timeout=2.0) for url in urls]
    killed = 0
    try:
        while True:
            for admin in admins:
                killed += int(
                    await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
                )
            if loop.time() >= end:
                break
            await asyncio.sleep(KILL_INTERVAL)
    finally:
        for admin in admins:
            await admin.aclose()
    return f"{killed} store connections killed (CLIENT KILL TYPE normal)", killed > 0


async def fail_over_master(
    cluster: Any, downtime: float, *, phase: Callable[[str], None]
) -> tuple[str, bool]:
    """Kill a master of ``cluster`` (a :class:`guarded.testing.redis_cluster.RedisCluster`; SIGKILL),
    wait until its replica is promoted and the cluster is OK, keep the old master down for what
    is left of ``downtime`` seconds, then restart it (it rejoins as a replica)."""
    loop = asyncio.get_running_loop()
    master = cluster.masters()[0]
    started = loop.time()
    phase(f"killing master {master.address} (SIGKILL)")
    promoted = await asyncio.to_thread(cluster.fail_over, master)
    took = loop.time() - started
    phase(f"replica {promoted.address} promoted")
    await asyncio.sleep(max(0.0, downtime - took))
    phase(f"restarting {master.address}")
    await asyncio.to_thread(cluster.restart, master)
    return (
        f"master {master.address} killed, replica {promoted.address} promoted in {took:.1f}s, "
        "the old master back as a replica"
    ), True


__all__ = ["KILL_INTERVAL", "fail_over_master", "kill_redis_clients", "restart_redis", "stall_redis"]
