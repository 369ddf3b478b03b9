"""A separate process for the randomized store-identity test: a guard over one PostgreSQL schema
(one store identity) whose backend fails at random, spilling into a state directory shared with
processes of other schemas; killed (SIGKILL) by the test at a random moment.

``python -m tests.postgres._identity_worker write DSN SCHEMA NAME PLACE SEED ERROR_RATE``: prints
``ready``, then writes memory states ``<schema>/<seed>/<n>`` for ever, printing each key once the
guard acknowledged it (held writes included). ``PLACE`` is ``default`` (the default spill path
in ``$XDG_STATE_HOME``) or a spill path given explicitly (shared by every identity).

``python -m tests.postgres._identity_worker drain DSN STORES``: for each ``[schema, name, place]``
of the JSON list ``STORES`` in turn, a healthy guard of that store, name and place drains what
waits (its own and adopted files) and prints how many writes are left.
"""

from __future__ import annotations

import asyncio
import json
import sys
from itertools import count
from typing import Any

from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.testing import FaultPlan, FaultyStore

_POOL = PoolSettings(min_size=1, max_size=2, command_timeout=10.0)


def _guarded(store: object, name: str, place: str) -> Any:
    options: dict[str, Any] = {} if place == "default" else {"spill_path": place}
    return guard(store, name=name, registry=CollectorRegistry(), timeout=0.3, strict=True, **options)


async def write(dsn: str, schema: str, name: str, place: str, seed: int, error_rate: float) -> None:
    store = await PostgresStateStore.connect(dsn, schema=schema, pool=_POOL, registry=CollectorRegistry())
    plan = FaultPlan.random(
        seed, error_before=error_rate, errors=(ConnectionRefusedError,), methods={"save_memory_state"}
    )
    guarded = _guarded(FaultyStore(store, plan), name, place)
    print("ready", flush=True)
    for number in count():
        key = f"{schema}/{seed}/{number}"
        await guarded.save_memory_state(key, {"schema": schema, "seed": seed, "n": number})
        print(key, flush=True)
        await asyncio.sleep(0.001)  # a steady writer, not a flood: the drain stays short


async def drain(dsn: str, stores: list[list[str]]) -> None:
    for schema, name, place in stores:
        store = await PostgresStateStore.connect(dsn, schema=schema, pool=_POOL, registry=CollectorRegistry())
        guarded = _guarded(store, name, place)
        left = await controller(guarded).drain(30)
        await controller(guarded).aclose()  # closes the store too
        print(left, flush=True)


def main(argv: list[str]) -> None:
    if argv[0] == "write":
        dsn, schema, name, place, seed, rate = argv[1:]
        asyncio.run(write(dsn, schema, name, place, int(seed), float(rate)))
    else:
        asyncio.run(drain(argv[1], json.loads(argv[2])))


if __name__ == "__main__":
    main(sys.argv[1:])
