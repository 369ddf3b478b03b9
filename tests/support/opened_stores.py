"""A test's store factory whose stores are all closed when the test ends."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar


class Closable(Protocol):
    async def close(self) -> None: ...


StoreT = TypeVar("StoreT", bound=Closable)


@contextlib.asynccontextmanager
async def closed_after(
    connect: Callable[..., Awaitable[StoreT]],
) -> AsyncIterator[Callable[..., Awaitable[StoreT]]]:
    """A factory calling ``connect(**options)``; every store it opened is closed on exit."""
    opened: list[StoreT] = []

    async def make(**options: Any) -> StoreT:
        store = await connect(**options)
        opened.append(store)
        return store

    try:
        yield make
    finally:
        for store in opened:
            await store.close()
