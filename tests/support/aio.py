"""Async helpers for tests."""

from __future__ import annotations

import asyncio


async def settle(rounds: int = 5) -> None:
    """Let every ready callback and task run a few loop iterations."""
    for _ in range(rounds):
        await asyncio.sleep(0)
