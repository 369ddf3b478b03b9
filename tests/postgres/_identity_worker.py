"""A separate process for the randomized store-identity test: a guard over one PostgreSQL schema
whose backend fails at random, spilling into a state directory shared with processes of other
schemas; killed (SIGKILL) by the test at a random moment.

The test runs it through a launcher program of each schema's own (``application(...)``), so each
schema is another application, as two programs of one user would be. The store is the PostgreSQL
store itself (``declared``: its identity is server, database and schema) or a store of the
application's own that declares no identity (``custom``: matched by application, class and guard
name only).

``APP write DSN SCHEMA KIND NAME PLACE SEED ERROR_RATE``: prints ``ready``, then writes memory
states ``<schema>/<seed>/<n>`` for ever, printing each key once the guard acknowledged it (held
writes included). ``PLACE`` is ``default`` (the default spill path in ``$XDG_STATE_HOME``) or a
spill path given explicitly (shared by every schema).

``APP drain DSN STORES``: for each ``[schema, kind, name, place]`` of the JSON list ``STORES`` in
turn, a healthy guard of that store, name and place drains what waits (its own and adopted
files) and prints how many writes are left.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from itertools import count
from typing import Any

from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.testing import FaultPlan, FaultyStore

_POOL = PoolSettings(min_size=1, max_size=2, command_timeout=10.0)


class CustomStore:
    """An application's own store over one schema that declares no identity: memory states only."""

    def __init__(self, inner: PostgresStateStore) -> None:
        self._inner = inner

    async def save_event(self, event: Any) -> None:
        await self._inner.save_event(event)

    async def load_history(self, trace_id: str) -> Any:
        return await self._inner.load_history(trace_id)

    async def save_remote_binding(self, binding: Any) -> None:
        await self._inner.save_remote_binding(binding)

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        await self._inner.save_memory_state(key, state)

    async def load_memory_state(self, key: str) -> Any:
        return await self._inner.load_memory_state(key)

    async def close(self) -> None:
        await self._inner.close()


def application() -> str:
    """The text of a launcher program: an application of its own that runs this worker."""
    return textwrap.dedent(
        """
        import sys

        from tests.postgres._identity_worker import main

        main(sys.argv[1:])
        """
    )


async def _store(dsn: str, schema: str, kind: str) -> Any:
    store = await PostgresStateStore.connect(dsn, schema=schema, pool=_POOL, registry=CollectorRegistry())
    return store if kind == "declared" else CustomStore(store)


def _guarded(store: object, name: str, place: str) -> Any:
    options: dict[str, Any] = {} if place == "default" else {"spill_path": place}
    return guard(store, name=name, registry=CollectorRegistry(), timeout=0.3, strict=True, **options)


async def write(
    dsn: str, schema: str, kind: str, name: str, place: str, seed: int, error_rate: float
) -> None:
    plan = FaultPlan.random(
        seed, error_before=error_rate, errors=(ConnectionRefusedError,), methods={"save_memory_state"}
    )
    guarded = _guarded(FaultyStore(await _store(dsn, schema, kind), plan), name, place)
    print("ready", flush=True)
    for number in count():
        key = f"{schema}/{seed}/{number}"
        await guarded.save_memory_state(key, {"schema": schema, "seed": seed, "n": number})
        print(key, flush=True)
        await asyncio.sleep(0.001)  # a steady writer, not a flood: the drain stays short


async def drain(dsn: str, stores: list[list[str]]) -> None:
    for schema, kind, name, place in stores:
        # The same class as the writers' (a FaultyStore with no fault): the identity of a store
        # that declares none includes its class.
        guarded = _guarded(FaultyStore(await _store(dsn, schema, kind), FaultPlan()), name, place)
        left = await controller(guarded).drain(30)
        await controller(guarded).aclose()  # closes the store too
        print(left, flush=True)


def main(argv: list[str]) -> None:
    if argv[0] == "write":
        dsn, schema, kind, name, place, seed, rate = argv[1:]
        asyncio.run(write(dsn, schema, kind, name, place, int(seed), float(rate)))
    else:
        asyncio.run(drain(argv[1], json.loads(argv[2])))
