"""Which event loop runs a guard's work, and what a call made on another loop does.

A guard's state belongs to one event loop at a time, its *home*: the tasks of its background work
(batch flushes, the spill file's group commit, replays), the futures its callers wait on, its
locks. A call on the home loop runs as usual (one identity check). A call on another loop:

- when the home loop is closed or no longer running (``asyncio.run()`` per request, a test client
  that runs each request in an event loop of its own), makes its own loop the home: the old
  loop's tasks are abandoned and what they held is handed back to be done on the new home (each
  part of the guard registers what to do with :meth:`LoopHome.on_move`);
- when the home loop runs in another thread (one loop per thread at once), runs on the home loop
  and is awaited from the caller's, bounded by the call's deadline plus :data:`FORWARD_GRACE`, so
  the guard's state is only ever changed by one thread. A call the home loop does not answer in
  time returns its fallback and is logged at ERROR; a write so ended is not acknowledged as kept
  (it is cancelled on the home loop, or was never started there).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from ..outcome import Outcome
from .call import MethodSetup

logger = logging.getLogger("guarded")

FORWARD_GRACE = 4.0
"""Seconds a call forwarded to the home loop may take beyond its own deadline before its caller
gives up: more than the dead-letter step's ``DEAD_LETTER_GRACE`` (3 s) to commit a held write to
the spill file, and the home loop's scheduling."""
_POLL = 0.05
"""How often a caller waiting on the home loop looks whether that loop closed meanwhile."""


class LoopHome:
    """The event loop that runs one guard's work (see the module docs)."""

    def __init__(self, store_name: str) -> None:
        self.store_name = store_name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._movers: list[weakref.WeakMethod[Callable[[], None]]] = []

    def on_move(self, mover: Callable[[], None]) -> None:
        """Call ``mover`` (a bound method, referenced weakly: the home keeps no part of the guard
        alive) on the new home loop (running, in its thread) each time the guard moves there from
        a loop that is closed or stopped: it abandons the old loop's tasks and futures and hands
        what they held back to be done on the new home."""
        self._movers.append(weakref.WeakMethod(mover))

    def claim(self, loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop | None:
        """Make ``loop`` (the running one) the home unless the home runs elsewhere: ``None`` when
        ``loop`` is the home now, else the home loop, running in another thread."""
        with self._lock:
            home = self.loop
            if home is loop:
                return None
            if home is not None and home.is_running() and not home.is_closed():
                return home
            self.loop = loop
        if home is not None:
            for reference in self._movers:
                mover = reference()
                if mover is not None:
                    mover()
            logger.debug(
                "guard of store %r moved to a new event loop; the tasks of the previous one were "
                "abandoned and what they held handed back",
                self.store_name,
                extra={"event": "guard_loop_moved", "store": self.store_name},
            )
        return None

    async def elsewhere(
        self,
        method: Callable[..., Awaitable[Any]],
        setup: MethodSetup,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """``method(*args, **kwargs)`` (a guarded method's entry, which found itself on a loop that
        is not the home) run on the home loop (see the module docs)."""
        return await self.run(lambda: method(*args, **kwargs), setup.settings.deadline + FORWARD_GRACE, setup)

    async def run(
        self,
        start: Callable[[], Awaitable[Any]],
        budget: float,
        setup: MethodSetup | None = None,
    ) -> Any:
        """Run ``start()`` on the home loop, which becomes the running loop when the home is closed
        or stopped; wait at most ``budget`` seconds for a home loop in another thread (then the
        call's fallback when ``setup`` is given, else :class:`TimeoutError`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        while True:
            home = self.claim(loop)
            if home is None:
                return await start()
            try:
                result = await self._forwarded(start, home, deadline)
            except _HomeGone:
                continue  # the home loop closed with the call: this loop takes over, or the next home
            except TimeoutError:
                if setup is None:
                    raise
                logger.error(
                    "guard of store %r: %s got no answer from the event loop that runs the guard "
                    "(another thread's) within %.1fs; returned its fallback%s",
                    self.store_name,
                    setup.label,
                    budget,
                    ", the write was not kept" if setup.policy.dead_letter else "",
                    extra={
                        "event": "guard_home_loop_unanswered",
                        "store": self.store_name,
                        "method": setup.label,
                        "outcome": (Outcome.REFUSED if setup.policy.dead_letter else Outcome.TIMEOUT).value,
                    },
                )
                return setup.policy.fallback.value_factory()()
            return result

    async def _forwarded(
        self,
        start: Callable[[], Awaitable[Any]],
        home: asyncio.AbstractEventLoop,
        deadline: float,
    ) -> Any:
        coroutine = _awaited(start)
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, home)
        except RuntimeError:
            coroutine.close()
            raise _HomeGone from None  # closed since claim() looked
        loop = asyncio.get_running_loop()
        waiting = asyncio.wrap_future(future)
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise TimeoutError
                done, _ = await asyncio.wait({waiting}, timeout=min(_POLL, left))
                if done:
                    break
                if home.is_closed() or not home.is_running():
                    raise _HomeGone  # its tasks were dropped with it: no answer comes from there
        except BaseException:
            future.cancel()  # cancels the call on the home loop (a pending one never starts)
            waiting.cancel()
            raise
        if waiting.cancelled():
            raise _HomeGone  # cancelled there: its loop shut down with the call in flight
        return waiting.result()


async def _awaited(start: Callable[[], Awaitable[Any]]) -> Any:
    return await start()


class _HomeGone(Exception):
    """The home loop closed or stopped before answering a forwarded call."""


__all__ = ["FORWARD_GRACE", "LoopHome"]
