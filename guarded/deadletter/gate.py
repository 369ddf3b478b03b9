"""Orders the direct writes and the replay of one last-write-wins key.

Without it a replay already sent when a newer direct write of the same key commits could land
after it and bring old data back. With it:

- a replay of a held write waits while a direct write of its key that started later (a larger
  call stamp, or any direct write when the held write comes from an earlier process) is in
  flight, and then re-checks that the held write still waits — the newer write superseded it
  when it succeeded, or replaced it when it was dead-lettered in turn;
- a direct write waits while a replay of its key is in flight, so it commits after it.

A direct write registers even when nothing of its key waits: an older write of the key can be
dead-lettered while it is in flight. Registration is two dictionary operations (a key with one
direct write in flight and nothing else holds just its stamp); only a key with a replay in
flight ever makes a caller wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

Slot = tuple[str, Hashable]
"""A key's identity: the method and the buffer's index of the key."""


class _KeyState:
    __slots__ = ("direct", "replaying", "waiters")

    def __init__(self, *direct: int) -> None:
        self.direct: list[int] = list(direct)
        self.replaying = False
        self.waiters: list[asyncio.Future[None]] | None = None
        """Made when someone first waits (most keys never have a waiter)."""


class KeyGate:
    """Per-key ordering of direct writes (by call stamp) against replays."""

    def __init__(self) -> None:
        self._keys: dict[Slot, int | _KeyState] = {}
        """Per key in flight: the stamp of its one direct write (the usual case), else its state."""
        self.generation = 0
        """Counts the event loops the guard moved to: a replay entered under an earlier one is
        forgotten (see :meth:`leave_replay`)."""

    def __len__(self) -> int:
        """Keys with a direct write or a replay in flight (or someone waiting on one)."""
        return len(self._keys)

    def moved(self) -> None:
        """The guard moved to a new event loop: the writes and replays in flight on the old one
        never resume, so no key is in flight any more."""
        self._keys.clear()
        self.generation += 1

    def _state(self, slot: Slot) -> _KeyState:
        state = self._keys.get(slot)
        if state is None:
            state = self._keys[slot] = _KeyState()
        elif isinstance(state, int):
            state = self._keys[slot] = _KeyState(state)
        return state

    async def _wait(self, state: _KeyState) -> None:
        waiter = asyncio.get_running_loop().create_future()
        if state.waiters is None:
            state.waiters = []
        state.waiters.append(waiter)
        await waiter

    def _release(self, slot: Slot, state: _KeyState) -> None:
        waiters, state.waiters = state.waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)
        if not state.direct and not state.replaying and self._keys.get(slot) is state:
            del self._keys[slot]

    # --- direct writes --------------------------------------------------------------------------

    def try_enter_direct(self, slot: Slot, stamp: int) -> bool:
        """Register a direct write with call stamp ``stamp``; ``False`` when a replay of the key is
        in flight (then await :meth:`enter_direct`)."""
        keys = self._keys
        state = keys.get(slot)
        if state is None:
            keys[slot] = stamp  # the common case: nothing else of the key in flight
            return True
        if isinstance(state, int):
            keys[slot] = _KeyState(state, stamp)
            return True
        if state.replaying:
            return False
        state.direct.append(stamp)
        return True

    async def enter_direct(self, slot: Slot, stamp: int) -> None:
        """Wait until no replay of the key is in flight, then register the direct write."""
        while not self.try_enter_direct(slot, stamp):
            await self._wait(self._state(slot))

    def leave_direct(self, slot: Slot, stamp: int) -> None:
        """The direct write ended (written, dead-lettered or failed). One the gate forgot (the
        guard moved to a new event loop since it entered) leaves nothing of the writes since."""
        keys = self._keys
        state = keys.get(slot)
        if state is None or isinstance(state, int):
            if state == stamp:
                del keys[slot]  # the common case: it was the only thing of the key in flight
            return
        direct = state.direct
        if stamp not in direct:
            return
        if len(direct) == 1 and state.waiters is None and not state.replaying:
            del keys[slot]
            return
        direct.remove(stamp)
        self._release(slot, state)

    # --- replays ----------------------------------------------------------------------------------

    async def enter_replay(self, slot: Slot, stamp: int, *, earlier_process: bool) -> None:
        """Wait until no other replay of the key and no newer direct write of it is in flight, then
        mark the replay in flight. ``stamp`` is the held write's call stamp; ``earlier_process``
        says it was stamped by a previous process (every direct write now is newer)."""
        while not self.try_enter_replay(slot, stamp, earlier_process=earlier_process):
            await self._wait(self._state(slot))

    def try_enter_replay(self, slot: Slot, stamp: int, *, earlier_process: bool) -> bool:
        """:meth:`enter_replay` without waiting: ``False`` (nothing marked) when it would wait. A
        replay that already holds other keys uses this, so it never waits while holding them."""
        state = self._state(slot)
        newer = state.direct if earlier_process else [other for other in state.direct if other > stamp]
        if state.replaying or newer:
            return False
        state.replaying = True
        return True

    def leave_replay(self, slot: Slot, generation: int | None = None) -> None:
        """The replay of the key ended. ``generation``: the gate's :attr:`generation` when it
        entered; one entered before the guard moved leaves nothing of the replays since."""
        if generation is not None and generation != self.generation:
            return
        state = self._state(slot)
        state.replaying = False
        self._release(slot, state)


__all__ = ["KeyGate", "Slot"]
