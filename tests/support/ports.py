"""Small scripted fakes of the durability ports (:mod:`guarded.durability.ports`), to test a
durability-facing layer alone: a buffer of held writes (the keeper and the lookups over one list),
a key gate whose slots a test can hold as a replay in flight would, a write queue whose answers a
test decides, and an opening the layers must ask for before their first call."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from guarded.batching.batcher import NO_ROOM, PendingWrite
from guarded.deadletter.buffer_ports import Held, Lifecycle
from guarded.durability.ports import DurabilityPorts
from guarded.outcome import Outcome
from guarded.policy import MethodPolicy


@dataclass(slots=True)
class HeldWrite:
    """One write the fake buffer holds, with what it was held with."""

    method: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    key: Any = None
    scope: str | None = None
    stamp: int = 0
    error: str = ""

    @property
    def call(self) -> Held:
        return (self.args, dict(self.kwargs))


class FakeBuffer:
    """The dead-letter buffer as the keeper and the lookups ports see it: what is held is a list
    a test can read and fill. ``keeps`` (``False``: every ``hold`` is refused) and ``hold_error``
    (raised by ``hold``) script its answers; ``disk_bytes`` is what ``stats()`` reports held.
    ``replay`` delivers a held write to the backend: recorded in ``replayed``, or ``replay_error``
    raised (the backend cannot be reached); it waits for ``replay_waits`` when set."""

    store_name = "s"

    def __init__(self, *, keeps: bool = True, disk_bytes: int = 0) -> None:
        self.keeps = keeps
        self.hold_error: BaseException | None = None
        self.disk_bytes = disk_bytes
        self.held: list[HeldWrite] = []
        self.deadlines: list[float] = []
        """The deadline of every ``hold``, in order."""
        self.parked: list[tuple[str, tuple[Any, ...], Mapping[str, Any], BaseException]] = []
        self.superseded: list[tuple[str, Any, int]] = []
        self.taken: list[tuple[str, Any]] = []
        self.removals: set[asyncio.Task[None]] = set()
        self.replayed: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.replay_error: BaseException | None = None
        self.replay_waits: asyncio.Event | None = None

    def put(self, method: str, *args: Any, key: Any = None, scope: str | None = None, **kwargs: Any) -> None:
        """Hold a write as a failed earlier call would have left it."""
        self.held.append(HeldWrite(method, args, kwargs, key, scope))

    # --- HeldWriteKeeper -------------------------------------------------------------------------

    async def hold(
        self,
        method: str,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        *,
        key: Any,
        scope: str | None,
        stamp: int,
        error: str,
        deadline: float = math.inf,
    ) -> bool:
        self.deadlines.append(deadline)
        if self.hold_error is not None:
            raise self.hold_error
        if not self.keeps:
            return False
        self.held.append(HeldWrite(method, args, kwargs, key, scope, stamp, error))
        return True

    async def park(
        self, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], error: BaseException
    ) -> None:
        self.parked.append((method, args, kwargs, error))

    async def replay(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.replay_waits is not None:
            await self.replay_waits.wait()
        if self.replay_error is not None:
            raise self.replay_error
        self.replayed.append((method, args, kwargs))

    async def supersede(self, method: str, key: Any, stamp: int, logical_time: int | None = None) -> int:
        if self.note_superseding((method, key), stamp, logical_time) is None:
            return 0
        return await self.drop_superseded((method, key), stamp)

    def note_superseding(self, slot: Any, stamp: int, logical_time: int | None = None) -> Any:
        """``slot`` is the fake gate's ``(method, key)``."""
        method, key = slot
        self.superseded.append((method, key, stamp))
        return slot if any((held.method, held.key) == slot for held in self.held) else None

    async def drop_superseded(self, slot: Any, stamp: int) -> int:
        older = [held for held in self.held if (held.method, held.key) == slot and held.stamp < stamp]
        self.held = [held for held in self.held if held not in older]
        return len(older)

    # --- HeldWriteLookups ------------------------------------------------------------------------

    @property
    def waiting(self) -> FakeBuffer:
        """The live count the hooks read (``depth``): this buffer itself."""
        return self

    @property
    def depth(self) -> int:
        return len(self.held)

    @property
    def is_empty(self) -> bool:
        return not self.held

    async def latest_for_key(self, method: str, key: Any) -> Held | None:
        found = [held for held in self.held if (held.method, held.key) == (method, key)]
        return found[-1].call if found else None

    async def pending_for_scope(self, method: str, scope: str) -> list[Held]:
        return [held.call for held in self.held if (held.method, held.scope) == (method, scope)]

    async def take(self, method: str, key: Any) -> Held | None:
        self.taken.append((method, key))
        found = [held for held in self.held if (held.method, held.key) == (method, key)]
        self.held = [held for held in self.held if held not in found]
        return found[-1].call if found else None

    async def stats(self) -> Any:
        return SimpleNamespace(disk_bytes=self.disk_bytes, memory_bytes=0)

    def check_open(self) -> None:
        """Always open: a fake that is never closed."""

    def removing(self, task: asyncio.Task[None]) -> None:
        self.removals.add(task)
        task.add_done_callback(self.removals.discard)


class FakeGate:
    """The direct-write gate: a slot per (method, key); :meth:`replaying` holds a slot as a replay
    of the key in flight would, until :meth:`replayed`. ``log`` lists ``("enter", slot, stamp)``
    and ``("leave", slot, stamp)`` in order; ``inside`` is the slots entered and not left."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any, int]] = []
        self.inside: list[Any] = []
        self._replays: dict[Any, asyncio.Event] = {}

    def slot(self, method: str, key: Any) -> Any:
        return None if key is None else (method, key)

    def try_enter(self, slot: Any, stamp: int) -> bool:
        if slot in self._replays:
            return False
        self._entered(slot, stamp)
        return True

    async def enter(self, slot: Any, stamp: int) -> None:
        replay = self._replays.get(slot)
        if replay is not None:
            await replay.wait()
        self._entered(slot, stamp)

    def leave(self, slot: Any, stamp: int) -> None:
        self.log.append(("leave", slot, stamp))
        self.inside.remove(slot)

    def _entered(self, slot: Any, stamp: int) -> None:
        self.log.append(("enter", slot, stamp))
        self.inside.append(slot)

    def replaying(self, method: str, key: Any) -> None:
        self._replays[self.slot(method, key)] = asyncio.Event()

    def replayed(self, method: str, key: Any) -> None:
        self._replays.pop(self.slot(method, key)).set()


@dataclass
class FakeQueue:
    """The write queue: takes the policy's batched writes; ``submit`` answers ``room`` and, for a
    group-commit write, settles it with ``settle`` at once (``None``: the test settles it).
    ``pending`` are writes still waiting, shown to reads of their scope."""

    room: bool = True
    settle: Outcome | None = Outcome.OK
    submitted: list[tuple[PendingWrite, float]] = field(default_factory=list)
    flushed: list[tuple[str, str]] = field(default_factory=list)
    pending: list[PendingWrite] = field(default_factory=list)

    @staticmethod
    def takes(policy: MethodPolicy) -> bool:
        return policy.batch

    @staticmethod
    def kept_kwargs(write: PendingWrite) -> Mapping[str, Any]:
        return write.kwargs

    @staticmethod
    def offer(write: PendingWrite) -> int:
        """Never takes a write at once: every write goes through :meth:`submit`, as scripted."""
        return NO_ROOM

    async def write_alone(self, method: str, started: object = None) -> None:
        raise AssertionError("offer() never answers ALONE")

    @staticmethod
    def runs_as_called(method: str) -> bool:
        return False

    async def submit(self, write: PendingWrite, *, deadline: float) -> bool:
        self.submitted.append((write, deadline))
        if self.room and self.settle is not None:
            write.settle(self.settle)
        return self.room

    async def flush_scope(self, method: str, scope: str) -> None:
        self.flushed.append((method, scope))

    def pending_for_scope(self, method: str, scope: str) -> list[PendingWrite]:
        return [write for write in self.pending if (write.method, write.scope) == (method, scope)]


class Opening:
    """The lifecycle port's owner: counts how often the durable parts were opened."""

    def __init__(self) -> None:
        self.opened = 0

    def is_open(self) -> bool:
        return self.opened > 0

    async def open(self) -> None:
        self.opened += 1


def fake_ports(
    *,
    buffer: FakeBuffer | None = None,
    gate: FakeGate | None = None,
    queue: FakeQueue | None = None,
    opening: Opening | None = None,
) -> DurabilityPorts:
    """Ports over the given fakes (a part left out is off, as in a guard configured without it)."""
    opening = opening or Opening()
    return DurabilityPorts(
        lifecycle=Lifecycle(opening.is_open, opening.open),
        next_stamp=itertools.count(1).__next__,
        queue=queue,
        keeper=buffer,
        lookups=buffer,
        gate=gate,
    )
