"""Store factories the command-line tests name as ``tests.cli.factories:NAME``."""

from __future__ import annotations

import os

from guarded.backends.memory import InMemoryStateStore
from guarded.backends.postgres import PostgresStateStore


def memory_store() -> InMemoryStateStore:
    """A new in-memory store."""
    return InMemoryStateStore()


async def pinned_schema_store() -> PostgresStateStore:
    """A store on the schema ``CLI_TEST_SCHEMA`` names, whatever ``GUARDED_PG_SCHEMA`` says: the
    kind of factory ``guarded check`` must refuse to write contract data through."""
    return await PostgresStateStore.connect(
        os.environ["GUARDED_PG_DSN"], schema=os.environ["CLI_TEST_SCHEMA"], stats_interval=None
    )
