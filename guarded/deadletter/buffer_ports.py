"""The dead-letter buffer's ports: the narrow views of it the guard's layers receive.

* :class:`Lifecycle`: open the durable parts once, before a call that needs them;
* :class:`HeldWriteKeeper`: hold a write that failed, park bad data, forget held writes a direct
  write superseded;
* :class:`HeldWriteLookups`: what the buffer holds for a key or a scope, and taking a held pause
  out of it;
* :class:`DirectWriteGate`: order a direct write of a key against replays of it.

Each port binds its owner's methods once: calling through a port adds no frame.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from .buffer import DeadLetterBuffer
from .entries import DeadLetterStats
from .gate import Slot
from .replay import HeldCall as Held


class Lifecycle:
    """Opens the durable parts once: the spill file is claimed and held writes of a previous
    process start replaying before the first call that needs them."""

    __slots__ = ("_is_open", "_open", "opened")

    def __init__(self, is_open: Callable[[], bool], open_: Callable[[], Awaitable[None]]) -> None:
        self._is_open = is_open
        self._open = open_
        self.opened = False
        """``True`` once the durable parts are known to be open (they never close again): a hot
        path tests this attribute, then :meth:`is_open`, before awaiting :meth:`ensure_open`."""

    def is_open(self) -> bool:
        """Whether the durable parts are open."""
        if not self.opened and self._is_open():
            self.opened = True
        return self.opened

    async def ensure_open(self) -> None:
        """Return at once when open, else open (once, whoever asks)."""
        if not self.opened:
            if not self._is_open():
                await self._open()
            self.opened = True


class HeldWriteKeeper:
    """Keeps writes that failed (held for replay), parks bad data, drops superseded writes."""

    __slots__ = ("drop_superseded", "hold", "note_superseding", "park", "replay", "supersede")

    def __init__(
        self,
        hold: Callable[..., Awaitable[bool]],
        park: Callable[[str, tuple[Any, ...], Mapping[str, Any], BaseException], Awaitable[None]],
        buffer: DeadLetterBuffer,
        replay: Callable[[str, tuple[Any, ...], dict[str, Any]], Awaitable[object]],
    ) -> None:
        self.hold = hold
        self.replay = replay
        """``replay(method, args, kwargs)``: send one held write to the backend now, as the
        background replay does (its logical time and item key taken from ``kwargs``); raises when
        it fails. The write stays held: the caller takes it out."""
        """``hold(method, args, kwargs, key=, scope=, stamp=, error=, deadline=)``: keep a failed
        write for replay, its commit bounded by its call's ``deadline``; ``False`` when it cannot be
        kept (it is parked as bad data)."""
        self.park = park
        """Park a write the backend refused as bad data, with its reason."""
        self.supersede: Callable[[str, Any, int, int | None], Awaitable[int]] = buffer.supersede
        self.note_superseding: Callable[[Slot, int, int | None], Slot | None] = buffer.note_superseding
        """:attr:`supersede` in two steps: the part that never waits answers the key's slot when
        held writes of the key wait, for :attr:`drop_superseded`."""
        self.drop_superseded: Callable[[Slot, int], Awaitable[int]] = buffer.drop_superseded
        """A direct write of a key succeeded: drop held writes of the key stamped before it."""


class WaitingCount(Protocol):
    """How many held writes wait, read as an attribute (a hot path's test, no call)."""

    @property
    def depth(self) -> int: ...


class HeldWriteLookups:
    """What the dead-letter buffer holds, for the reads that show it."""

    __slots__ = (
        "_buffer",
        "check_open",
        "latest_for_key",
        "pending_for_scope",
        "removing",
        "stats",
        "store_name",
        "take",
        "waiting",
    )

    def __init__(self, buffer: DeadLetterBuffer) -> None:
        self._buffer = buffer
        self.store_name = buffer.store_name
        self.waiting: WaitingCount = buffer.waiting
        """Its ``depth`` is the number of held writes waiting, kept up to date (0: nothing held)."""
        self.latest_for_key: Callable[[str, Any], Awaitable[Held | None]] = buffer.latest_for_key
        """The newest held write of a key, or ``None``."""
        self.pending_for_scope: Callable[[str, str], Awaitable[Sequence[Held]]] = buffer.pending_for_scope
        """The held writes of a method for one trace or session, oldest first."""
        self.take: Callable[[str, Any], Awaitable[Held | None]] = buffer.take
        """Take the newest held write of a key out of the buffer (a resumed pause)."""
        self.check_open: Callable[[], None] = buffer.check_open
        """Raises ``GuardClosedError`` once the buffer closes (a held write can no longer be taken)."""
        self.removing: Callable[[asyncio.Task[None]], None] = buffer.removing
        """Register a task that takes a consumed write out: closing the buffer waits for it."""
        self.stats: Callable[[], Awaitable[DeadLetterStats]] = buffer.stats
        """How much is held (depth, bytes in memory and on disk)."""

    @property
    def is_empty(self) -> bool:
        """Nothing is held (the lookups can be skipped)."""
        return self._buffer.is_empty


class DirectWriteGate:
    """Orders a direct write of a key against replays of the same key
    (:class:`~guarded.deadletter.gate.KeyGate`): a replay in flight finishes first, and none starts
    until the direct write is done."""

    __slots__ = ("enter", "leave", "slot", "try_enter")

    def __init__(self, buffer: DeadLetterBuffer) -> None:
        gate = buffer.gate
        self.slot: Callable[[str, Any], Slot | None] = buffer.slot
        """The slot of a method's key (``None`` when the key cannot have one)."""
        self.try_enter: Callable[[Slot, int], bool] = gate.try_enter_direct
        self.enter: Callable[[Slot, int], Awaitable[None]] = gate.enter_direct
        self.leave: Callable[[Slot, int], None] = gate.leave_direct
