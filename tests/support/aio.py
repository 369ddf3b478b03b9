"""Async helpers for tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def settle(rounds: int = 5) -> None:
    """Let every ready callback and task run a few loop iterations."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def eventually(
    condition: Callable[[], bool], *, what: str = "the condition", within: float = 10.0, poll: float = 0.001
) -> None:
    """Wait (polling every ``poll`` seconds) until ``condition()`` holds; fail naming ``what`` after
    ``within`` seconds. For what tasks the test does not await do (PenguiFlow emits telemetry from
    background tasks, a worker process writes)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(poll)


async def eventually_async(
    condition: Callable[[], Awaitable[bool]],
    *,
    what: str = "the condition",
    within: float = 10.0,
    poll: float = 0.001,
) -> None:
    """:func:`eventually` for a condition that must be awaited (a read of the guard's buffer)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(poll)
