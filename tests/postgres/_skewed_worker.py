"""A guarded worker process whose clock runs ahead, for the clock-skew tests.

``python -m tests.postgres._skewed_worker DSN SCHEMA SKEW_SECONDS NAME SPILL_PATH``: opens a
guarded :class:`PostgresStateStore` and shifts its own wall clock by ``SKEW_SECONDS``
(``time.time_ns`` in this process only: the hosts of a real deployment have clocks of their own,
these processes share one). Then it answers commands on stdin, one per line:

* ``write METHOD KEY ROUND``: ``save_memory_state(KEY, value)`` or ``save_trajectory(KEY, "s",
  value)`` with ``value = {"round": ROUND, "by": NAME}`` through the guard, then reads the key back
  from PostgreSQL at once; answers ``done <outcome> <applied>``: the outcome the call was counted
  with (``guarded_store_calls_total``) and ``yes`` when the database held ``value`` right after
  the call returned (``no`` otherwise). Reading back here keeps the time between this write and
  the other worker's next one short, as between two workers serving one user.
* ``quit``: closes the guard, answers ``closed``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.guard import guard


def skew_clock(seconds: float) -> None:
    real = time.time_ns
    offset = int(seconds * 1e9)
    time.time_ns = lambda: real() + offset  # type: ignore[assignment]
    real_time = time.time
    time.time = lambda: real_time() + seconds  # type: ignore[assignment]


def outcomes(registry: CollectorRegistry, method: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "guarded_store_calls_total" and sample.labels.get("method") == method:
                counts[sample.labels["outcome"]] = sample.value
    return counts


def counted(before: dict[str, float], after: dict[str, float]) -> str:
    changed = [outcome for outcome, value in after.items() if value != before.get(outcome, 0.0)]
    return ",".join(sorted(changed)) or "none"


async def serve(backend: Any, name: str, spill: str) -> None:
    """Answer the commands on stdin (see the module docs) through ``guard(backend)``; any backend
    with the memory and trajectory methods (the Redis suite's worker serves its store with it)."""
    registry = CollectorRegistry()
    store = guard(backend, name=name, registry=registry, dead_letter={"path": spill})
    loop = asyncio.get_running_loop()
    async with store:
        print("ready", flush=True)
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
            if not line or line[0] == "quit":
                break
            _, method, key, round_ = line
            value = {"round": int(round_), "by": name}
            before = outcomes(registry, method)
            if method == "save_memory_state":
                await store.save_memory_state(key, value)
                stored = await backend.load_memory_state(key)
            else:
                await store.save_trajectory(key, "s", value)
                stored = await backend.get_trajectory(key, "s")
            applied = "yes" if stored == value else "no"
            print("done", counted(before, outcomes(registry, method)), applied, flush=True)
    print("closed", flush=True)


async def main(dsn: str, schema: str, skew: float, name: str, spill: str) -> None:
    skew_clock(skew)
    backend = await PostgresStateStore.connect(
        dsn,
        schema=schema,
        registry=CollectorRegistry(),
        stats_interval=None,
        pool=PoolSettings(min_size=1, max_size=2),
    )
    await serve(backend, name, spill)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]))
