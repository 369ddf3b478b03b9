"""StateStore factories for the ``guarded snapshot`` tests: ``module:callable`` as a user names them."""

from __future__ import annotations

import random

from guarded.backends.memory import InMemoryStateStore
from guarded.codec import penguiflow_types
from tests.snapshots._sessions import TENANT, USER, populate

SEED = 7
SESSION = "s1"
TARGETS: list[InMemoryStateStore] = []
"""Every store :func:`target` returned (in this process), newest last."""


async def populated() -> InMemoryStateStore:
    """A store holding one random session ``s1`` (the same one every call)."""
    store = InMemoryStateStore(record_types=penguiflow_types())
    await populate(store, random.Random(SEED), SESSION)
    return store


def target() -> InMemoryStateStore:
    """An empty store to restore into (kept in :data:`TARGETS` for the test to read)."""
    store = InMemoryStateStore(record_types=penguiflow_types())
    TARGETS.append(store)
    return store


def unreachable() -> InMemoryStateStore:
    raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 1)")


def not_a_snapshot_store() -> InMemoryStateStore:
    return InMemoryStateStore()


async def changed() -> InMemoryStateStore:
    """:func:`populated`'s session with a newer memory state (kept in :data:`TARGETS`)."""
    store = await populated()
    await store.save_memory_state(f"{TENANT}:{USER}:{SESSION}", {"newer": True})
    TARGETS.append(store)
    return store
