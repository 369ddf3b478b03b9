"""PostgreSQL lists a session's memory keys: a capture finds every memory state of the session
without being told its keys, and a restore into another store gives them back."""

from __future__ import annotations

import random

import pytest

from guarded.backends.memory import InMemoryStateStore
from guarded.codec import penguiflow_types
from guarded.snapshots import capture, restore
from tests.postgres.conftest import StoreFactory

from ._sessions import memory_key, populate


@pytest.mark.asyncio
async def test_a_capture_from_postgres_finds_every_memory_key_of_the_session(
    make_store: StoreFactory,
) -> None:
    types = penguiflow_types()
    postgres = await make_store(types=types)
    await populate(postgres, random.Random(31), "s1")
    await populate(postgres, random.Random(32), "s10")  # a session whose id s1 is a prefix of
    await postgres.save_memory_state("acme:u2:s1", {"turns": [1]})
    await postgres.save_memory_state("a%b_c:u:s1", {"like": "wildcards"})
    assert await postgres.list_memory_keys("s1") == sorted(
        ["a%b_c:u:s1", "acme:u2:s1", "custom:s1", memory_key("s1")]
    )
    async with await capture(postgres, session_id="s1") as captured:
        assert captured.not_enumerated == ("pauses",)
        assert captured.snapshot.counts["memory"] == 4
        target = InMemoryStateStore(record_types=types)
        await restore(captured, target)
    for key in await postgres.list_memory_keys("s1"):
        assert await target.load_memory_state(key) == await postgres.load_memory_state(key)
    assert await target.load_memory_state(memory_key("s10")) is None
