"""What a dead-letter buffer reports about itself: how many writes wait, where they are held (its
spill file, or memory only while the file fails) and why, its gauges and its stats.

:class:`BufferStatus` is the base of :class:`~.buffer.DeadLetterBuffer`, which sets the state these
reports read; the buffer's operations (adding, replaying, parking, maintenance) are in
:mod:`.buffer`. Reading a report never waits on the spill file.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from .counters import BufferCounters
from .entries import DeadLetter, DeadLetterStats
from .held import HeldIndex
from .spill import SpillFile
from .spill_link import SpillLink
from .telemetry import Gauges


class BufferStatus:
    """The reports of a dead-letter buffer on its state (see the module docs)."""

    path: str | None
    _held: HeldIndex
    _counters: BufferCounters
    _link: SpillLink
    _clock: Callable[[], float]

    @property
    def _spill(self) -> SpillFile | None:
        """The slot file in use, even while it fails (for tests that damage it)."""
        return self._link.spill

    @property
    def _memory(self) -> OrderedDict[int, DeadLetter]:
        """Copies of entries the spill file holds (for tests that make the buffer read the file)."""
        return self._held.memory

    @property
    def depth(self) -> int:
        """Writes waiting (memory and spill file)."""
        return self._held.depth

    @property
    def is_empty(self) -> bool:
        """Whether no write is waiting."""
        return self._held.depth == 0

    @property
    def waiting(self) -> HeldIndex:
        """The index of the writes waiting, whose ``depth`` a hot path reads as :attr:`depth`
        without a call (the same object for the buffer's lifetime)."""
        return self._held

    @property
    def durable(self) -> bool:
        """Whether the buffer has a spill file configured."""
        return self.path is not None

    @property
    def spill_available(self) -> bool:
        """Whether held writes go to the spill file now: a path is configured and the file has
        not failed (``True`` before the first write claims one)."""
        return self.path is not None and not self._link.failed and not self._link.closed

    @property
    def spill_path(self) -> str | None:
        """The slot file in use; ``None`` when memory only, none claimed yet, or unavailable."""
        spill = self._link.spill
        return spill.path if spill is not None and not self._link.failed else None

    @property
    def claimed_path(self) -> str | None:
        """The slot file this buffer holds locked, even while it fails (``None``: it holds none).
        Of the :attr:`depth` waiting writes, all but :attr:`memory_only` are in it."""
        spill = self._link.spill
        return spill.path if spill is not None else None

    @property
    def spill_error(self) -> str | None:
        """Why the spill file is unavailable (``None`` while it is fine)."""
        return self._link.spill_error

    @property
    def memory_only(self) -> int:
        """Waiting writes held in memory only (not in a spill file): lost if the process dies."""
        return 0 if self._link.usable() else len(self._held.volatile)

    def gauges(self) -> Gauges:
        """The buffer's current gauge values (read by the metrics collector at scrape time)."""
        spill_available = None if self.path is None else self.spill_available
        return self._counters.gauges(self._held, self._clock(), spill_available)

    async def stats(self) -> DeadLetterStats:
        """A snapshot of depth, sizes, age of the oldest entry and the totals since creation."""
        spill_available = None if self.path is None else self.spill_available
        return self._counters.stats(
            self._held,
            self._clock(),
            spill_path=self.spill_path,
            spill_available=spill_available,
            memory_only=self.memory_only,
        )


__all__ = ["BufferStatus"]
