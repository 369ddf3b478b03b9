"""A pause answered from its held copy is also consumed in the backend, later.

The save's first attempt reaches the backend but its answer is lost, so the save is held. A resume
during the next outage answers from the held copy (outcome ``stale``) and its consume of the
backend copy fails. Without more, the backend copy stays loadable: a second resume once the backend
is back gets the same payload again. The guard holds the consume instead, and replays it.
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.config import DeadLetterConfig
from guarded.guard import controller, guard
from tests.guard.support import fast_config


class AnswerLosingStore(InMemoryStateStore):
    """Fault injection: ``lose_answers`` makes a save commit and then fail; ``down`` fails every
    pause call before it reaches the store."""

    lose_answers = False
    down = False

    async def save_planner_state(self, token: str, payload: dict[str, Any]) -> None:
        if self.down:
            raise ConnectionResetError("injected outage")
        await super().save_planner_state(token, payload)
        if self.lose_answers:
            raise ConnectionResetError("injected: the answer was lost after the commit")

    async def load_planner_state(self, token: str) -> dict[str, Any] | None:
        if self.down:
            raise ConnectionResetError("injected outage")
        return await super().load_planner_state(token)


async def resumed_from_held_copy(payload: dict[str, Any]) -> tuple[AnswerLosingStore, Any, Any]:
    """A guard whose save of ``"t"`` reached the backend with its answer lost (so it is held),
    then a resume during an outage answered from the held copy; the backend is back up."""
    backend = AnswerLosingStore()
    store = guard(
        backend,
        registry=CollectorRegistry(),
        config=fast_config(max_attempts=1, dead_letter=DeadLetterConfig(path=None)),
    )
    control = controller(store)
    backend.lose_answers = True
    await store.save_planner_state("t", payload)  # committed, answer lost: held
    backend.lose_answers = False
    assert control.dead_letters is not None
    assert control.dead_letters.depth == 1
    backend.down = True
    assert await store.load_planner_state("t") == payload  # from the held copy
    backend.down = False
    return backend, store, control


@pytest.mark.asyncio
async def test_a_pause_resumed_from_its_held_copy_is_not_loadable_again() -> None:
    backend, store, control = await resumed_from_held_copy({"approve": "refund 42"})
    assert await control.drain(5.0) == 0
    assert await store.load_planner_state("t") is None  # resumed once, never twice
    assert await backend.load_planner_state("t") is None
    assert list(await control.dead_letters.parked()) == []  # the held consume was replayed, not parked


@pytest.mark.asyncio
async def test_the_held_consume_leaves_a_newer_save_of_the_token_alone() -> None:
    backend, store, control = await resumed_from_held_copy({"pause": 1})
    # The token is paused again before the held consume is replayed.
    await backend.save_planner_state("t", {"pause": 2})
    assert await control.drain(5.0) == 0
    assert await store.load_planner_state("t") == {"pause": 2}
