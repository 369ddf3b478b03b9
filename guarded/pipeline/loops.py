"""Which event loop runs a guard's work, and what a call made on another loop does.

A guard's state belongs to one event loop at a time, its *home*: the tasks of its background work
(batch flushes, the spill file's group commit, replays), the futures its callers wait on, its
locks. A call on the home loop runs as usual (one identity check). A call on another loop:

- when the home loop is closed or no longer running (``asyncio.run()`` per request, a test client
  that runs each request in an event loop of its own), makes its own loop the home: the old
  loop's tasks are abandoned (:func:`abandon`: a stopped loop that runs again resumes none of
  them) and what they held is handed back to be done on the new home (each part of the guard
  registers what to do with :meth:`LoopHome.on_move`);
- when the home loop runs in another thread (one loop per thread at once), runs on the home loop
  and is awaited from the caller's, bounded by the call's deadline plus :data:`FORWARD_GRACE`, so
  the guard's state is only ever changed by one thread. A call the home loop does not answer in
  time ends as any call that missed its deadline (:meth:`LoopHome.on_unanswered`): a read times
  out (outcome ``timeout``, its fallback), a write is not kept (outcome ``refused``, raised in
  strict mode), counted and logged as every failed call. It is cancelled on the home loop, or
  never starts there, and that loop does not count it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import WriteNotKeptError
from .call import Call, MethodSetup
from .watchdog import forget_closed

logger = logging.getLogger("guarded")

FORWARD_GRACE = 4.0
"""Seconds a call forwarded to the home loop may take beyond its own deadline before its caller
gives up: more than the dead-letter step's ``DEAD_LETTER_GRACE`` (3 s) to commit a held write to
the spill file, and the home loop's scheduling."""
_POLL = 0.05
"""How often a caller waiting on the home loop looks whether that loop closed meanwhile."""

Settle = Callable[[Call, BaseException], Awaitable[Any]]
"""Ends a call that failed with the given failure before it reached the guard's layers, as the
layers end a failed call (see :meth:`LoopHome.on_unanswered`)."""


class _Forwarded:
    """A call forwarded to the home loop: ``abandoned`` once its caller gave up waiting for it,
    ``begun`` once it started there (one or the other first: an abandoned call never starts)."""

    __slots__ = ("_lock", "abandoned", "begun")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.abandoned = False
        self.begun = False

    def begin(self) -> bool:
        """On the home loop: start the call unless its caller gave up (``False``)."""
        with self._lock:
            self.begun = not self.abandoned
            return self.begun

    def abandon(self) -> bool:
        """The caller gives up: whether the call had begun on the home loop."""
        with self._lock:
            self.abandoned = True
            return self.begun


_FORWARDED: contextvars.ContextVar[_Forwarded | None] = contextvars.ContextVar(
    "guarded_forwarded_call", default=None
)


def abandoned_by_caller() -> bool:
    """Whether the call running in this task was forwarded to the home loop by a caller that gave
    up waiting for it: the caller counted and answered it, so its cancellation here is not counted
    again."""
    forwarded = _FORWARDED.get()
    return forwarded is not None and forwarded.abandoned


class LoopHome:
    """The event loop that runs one guard's work (see the module docs)."""

    def __init__(self, store_name: str) -> None:
        self.store_name = store_name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._movers: list[weakref.WeakMethod[Callable[[], None]]] = []
        self._settle: weakref.WeakMethod[Settle] | None = None

    def on_move(self, mover: Callable[[], None]) -> None:
        """Call ``mover`` (a bound method, referenced weakly: the home keeps no part of the guard
        alive) on the new home loop (running, in its thread) each time the guard moves there from
        a loop that is closed or stopped: it abandons the old loop's tasks and futures and hands
        what they held back to be done on the new home."""
        self._movers.append(weakref.WeakMethod(mover))

    def on_unanswered(self, settle: Settle) -> None:
        """End a call the home loop (another thread's) did not answer in time with ``settle(call,
        failure)`` (a bound method, referenced weakly): its failure a ``TimeoutError``, or for a
        write the guard would keep a :class:`~guarded.errors.WriteNotKeptError`, so that it is
        counted, logged and answered (raised in strict mode) as any call that failed so."""
        self._settle = weakref.WeakMethod(settle)

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
            if home.is_closed():
                forget_closed(home)
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
        loop = asyncio.get_running_loop()
        started = loop.time()
        budget = setup.settings.deadline + FORWARD_GRACE
        try:
            return await self.run(lambda: method(*args, **kwargs), budget)
        except _Unanswered as exc:
            begun = exc.begun
        call = Call(setup, args, kwargs, loop, started)
        failure = _unanswered(setup, budget, begun)
        settle = self._settle() if self._settle is not None else None
        if settle is None:  # the guard is gone
            raise failure
        return await settle(call, failure)

    async def run(self, start: Callable[[], Awaitable[Any]], budget: float) -> Any:
        """Run ``start()`` on the home loop, which becomes the running loop when the home is closed
        or stopped; wait at most ``budget`` seconds for a home loop in another thread (then
        :class:`TimeoutError`: the call is cancelled there, or never starts)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        while True:
            home = self.claim(loop)
            if home is None:
                return await start()
            try:
                return await self._forwarded(start, home, deadline)
            except _HomeGone:
                continue  # the home loop closed with the call: this loop takes over, or the next home

    async def _forwarded(
        self,
        start: Callable[[], Awaitable[Any]],
        home: asyncio.AbstractEventLoop,
        deadline: float,
    ) -> Any:
        forwarded = _Forwarded()
        coroutine = _awaited(start, forwarded)
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
                    raise _Unanswered(forwarded.abandon())  # answered here, not counted there
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


def abandon(task: asyncio.Task[Any] | None) -> None:
    """``task``, of an event loop the guard moved away from, never resumes its work (call from
    the new home loop, while the old one does not run): a closed loop never runs it again, and on
    a stopped one it is cancelled at once -- even when what it waited for already came, so the
    step that would resume it raises ``CancelledError`` instead -- should that loop run again."""
    if task is None or task.done():
        return
    loop = task.get_loop()
    if loop.is_closed() or loop.is_running():
        return
    with contextlib.suppress(RuntimeError):  # closed meanwhile: it never runs again
        task.cancel()


async def _awaited(start: Callable[[], Awaitable[Any]], forwarded: _Forwarded) -> Any:
    if not forwarded.begin():
        raise asyncio.CancelledError  # its caller gave up before the home loop came to it
    _FORWARDED.set(forwarded)  # in the home loop's task, a context of its own: nothing to reset
    return await start()


def _unanswered(setup: MethodSetup, budget: float, begun: bool) -> BaseException:
    """The failure of a call the home loop did not answer within ``budget`` seconds (``begun``:
    it had started there, and was cancelled): a write the guard would keep was not kept; anything
    else timed out."""
    why = f"the event loop that runs the guard (another thread's) did not answer within {budget:.1f}s"
    if setup.policy.dead_letter:
        fate = "it was cancelled there and may still be delivered" if begun else "it never started there"
        return WriteNotKeptError(f"{why}: the write was not kept ({fate})", method=setup.label)
    return TimeoutError(f"{setup.label} timed out: {why}")


class _Unanswered(TimeoutError):
    """A home loop in another thread did not answer a forwarded call in time."""

    def __init__(self, begun: bool) -> None:
        super().__init__("the event loop that runs the guard did not answer in time")
        self.begun = begun
        """The call had started on the home loop (it is cancelled there)."""


class _HomeGone(Exception):
    """The home loop closed or stopped before answering a forwarded call."""


__all__ = ["FORWARD_GRACE", "LoopHome", "Settle", "abandon", "abandoned_by_caller"]
