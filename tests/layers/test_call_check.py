"""The call-check layer alone: a call that does not bind to the store's signature is refused
before the inner service."""

from __future__ import annotations

import pytest

from guarded.backends.memory import InMemoryStateStore
from guarded.errors import CallerError
from guarded.layers.call_check import CallCheckLayer
from tests.support.layers import method_setup, new_call
from tests.support.scripted import ScriptedService

pytestmark = pytest.mark.asyncio


async def test_call_check_refuses_a_wrong_call_before_the_inner_service() -> None:
    inner = ScriptedService().answer(None)
    setup = method_setup("save_memory_state")
    service = CallCheckLayer(InMemoryStateStore()).wrap(inner, setup)
    with pytest.raises(CallerError, match="missing a required argument: 'state'"):
        await service(new_call(setup, "k"))
    assert inner.calls == []
    assert await service(new_call(setup, "k", {"v": 1})) is None
    inner.assert_done()
